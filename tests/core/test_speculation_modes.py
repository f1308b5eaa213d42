"""Speculation modes in the spec: draft-target (a draft model) and ngram (prompt lookup), each refused where
TensorRT-LLM 1.2.1 refuses it, with the upstream source named."""

from __future__ import annotations

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec

NGRAM = dict(model="tiny-llama", precision="fp8", runtime="pytorch", target="reference", speculative_decoding="ngram")


def test_ngram_resolves_without_a_model_and_draft_target_stays_the_default_with_a_draft():
    spec = resolve_spec(**NGRAM)
    assert (spec.speculation_mode, spec.draft_model, spec.draft_len, spec.ngram_size) == ("ngram", None, 4, 2)
    assert "speculation=ngram K=4 match<=2" in spec.summary()
    tuned = resolve_spec(**NGRAM, draft_len=3, max_matching_ngram_size=5)
    assert (tuned.draft_len, tuned.ngram_size) == (3, 5) and tuned.identity() != spec.identity()
    drafted = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    assert drafted.speculation_mode == "draft-target"
    plain = resolve_spec(model="tiny-llama", runtime="pytorch", target="reference")
    assert (plain.speculation_mode, plain.draft_len, plain.ngram_size) == (None, 0, 0)
    # specs without a mode dump and hash as before the modes existed
    assert "speculative_decoding" not in plain.model_dump()["speculation"]


@pytest.mark.parametrize("change, match", [
    (dict(runtime="engine"), r"^speculation\.speculative_decoding=ngram runs on TensorRT-LLM's PyTorch backend only "
                             r"\(1\.2\.1 llm_args\.py NGramDecodingConfig\.supports_backend"),
    (dict(draft="auto"), r"^speculation\.draft=tiny-llama-draft with speculative_decoding=ngram: .* drop --draft"),
    (dict(max_beam_width=2), r"^limits\.max_beam_width=2: n-gram speculation rewinds rejected drafts"),
    (dict(draft_tp=2), r"^speculation\.draft_tp is set but no draft model"),
    (dict(max_matching_ngram_size=0), r"^speculation\.max_matching_ngram_size=0: Input should be greater than"),
])
def test_ngram_refusals(change, match):
    with pytest.raises(SpecError, match=match):
        resolve_spec(**{**NGRAM, **change})


def test_mode_settings_need_their_mode():
    with pytest.raises(SpecError, match=r"^speculation\.max_matching_ngram_size=3 is an ngram setting"):
        resolve_spec(model="tiny-llama", runtime="pytorch", target="reference", max_matching_ngram_size=3)
    with pytest.raises(SpecError, match=r"^speculation\.speculative_decoding=draft-target needs a draft model"):
        resolve_spec(model="tiny-llama", target="reference", speculative_decoding="draft-target")
    with pytest.raises(SpecError, match=r"^speculation\.draft_len is set but no draft model"):
        resolve_spec(model="tiny-llama", target="reference", draft_len=3)


def test_ngram_warns_above_the_speculation_batch():
    spec = resolve_spec(**{**NGRAM, "max_batch_size": 64, "draft_len": 12})
    assert any("n-gram pays at low concurrency" in w for w in spec.warnings)
    assert any("speculation.draft_len=12" in w for w in spec.warnings)
