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


EAGLE3 = dict(model="tiny-llama", precision="fp8", runtime="pytorch", target="reference", draft="tiny-llama-eagle3")


def test_an_eagle3_head_is_its_own_mode_and_auto_picks_the_targets_head():
    spec = resolve_spec(**EAGLE3)
    assert (spec.speculation_mode, spec.draft_model.name, spec.quantized_draft, spec.draft_len) == (
        "eagle3", "tiny-llama-eagle3", None, 4)
    assert "speculation=eagle3 head=tiny-llama-eagle3 K=4 (its own dtype)" in spec.summary()
    assert "draft_tp" not in spec.summary()  # no draft engine
    auto = resolve_spec(**{**EAGLE3, "draft": "auto", "speculative_decoding": "eagle3"})
    assert auto.draft_model.name == "tiny-llama-eagle3" and auto.identity() != spec.identity()
    big = resolve_spec(model="llama3.3-70b", precision="fp8", runtime="pytorch", tp=4, draft="auto",
                       speculative_decoding="eagle3")
    assert (big.draft_model.name, big.draft_len) == ("llama3.3-70b-eagle3", 3)  # the head's default K
    assert any("2048 positions llama3.3-70b-eagle3 was trained on" in w for w in big.warnings)
    # a draft model keeps draft-target, and is the quantized draft
    drafted = resolve_spec(**{**EAGLE3, "draft": "tiny-llama-draft"})
    assert drafted.quantized_draft is drafted.draft_model


@pytest.mark.parametrize("change, match", [
    (dict(runtime="engine"), r"^speculation\.speculative_decoding=eagle3 runs on TensorRT-LLM's PyTorch backend only "
                             r"\(1\.2\.1's engine path builds EAGLE-1/2: examples/eagle/README\.md"),
    (dict(draft="tiny-llama-draft", speculative_decoding="eagle3"),
     r"^speculation\.speculative_decoding=eagle3 with speculation\.draft=tiny-llama-draft is a model, not an EAGLE-3 "
     r"head; pass --draft with an EAGLE-3 head trained for tiny-llama"),
    (dict(draft=None, speculative_decoding="eagle3"), r"^speculation\.speculative_decoding=eagle3 with no --draft"),
    (dict(speculative_decoding="draft-target"), r"^speculation\.draft=tiny-llama-eagle3 is an EAGLE-3 head, .* pass "
                                                r"--speculative-decoding eagle3$"),
    (dict(model="tiny-qwen3"), r"^speculation\.draft=tiny-llama-eagle3 is the EAGLE-3 head of tiny-llama, trained on "
                               r"its hidden states; it cannot draft for tiny-qwen3: use --model tiny-llama"),
    (dict(max_beam_width=2), r"^limits\.max_beam_width=2: EAGLE-3 rewinds rejected drafts"),
    (dict(draft_precision="fp8"), r"^speculation\.draft_precision=fp8: an EAGLE-3 head is served in its own dtype"),
    (dict(draft_len=0), r"^speculation\.draft_len=0: must be >= 1"),
    (dict(max_matching_ngram_size=2), r"^speculation\.max_matching_ngram_size=2 is an ngram setting"),
    (dict(model="tiny-llama-eagle3", draft=None), r"^model=tiny-llama-eagle3 is an EAGLE-3 head, not a model to serve; "
                                                  r"pass --model tiny-llama --draft tiny-llama-eagle3$"),
])
def test_eagle3_refusals(change, match):
    with pytest.raises(SpecError, match=match):
        resolve_spec(**{**EAGLE3, **change})


def test_eagle3_refuses_pipeline_parallelism_and_auto_without_a_head():
    with pytest.raises(SpecError, match=r"^parallelism\.pp=2 with eagle3: .*feature-combination-matrix\.md\); use --tp"):
        resolve_spec(model="llama3.3-70b", precision="fp8", runtime="pytorch", tp=2, pp=2, draft="auto",
                     speculative_decoding="eagle3")
    with pytest.raises(SpecError, match=r"^speculation\.draft='auto' with eagle3: no EAGLE-3 head in the registry is "
                                        r"trained for 'llama-70b'"):
        resolve_spec(model="llama-70b", precision="fp8", runtime="pytorch", tp=4, draft="auto",
                     speculative_decoding="eagle3")


def _registry_with(tmp_path, head: str) -> str:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  my-head:\n" + head)
    return str(path)


ARCH = ("    architecture: {num_layers: 1, hidden_size: 256, num_heads: 8, num_kv_heads: 4, head_dim: 32,\n"
        "                   intermediate_size: 512, vocab_size: 1024, max_position_embeddings: 1024}\n")


@pytest.mark.parametrize("eagle3, match", [
    ("{target: tiny-llama, draft_vocab_size: 512}", r"tiny-llama has 4 layers, too few for TensorRT-LLM's default "
                                                     r"EAGLE-3 capture .*'Not enough hidden layers for default EAGLE3"),
    ("{target: tiny-llama, draft_vocab_size: 512, capture_layers: [0, 4]}",
     r"eagle3\.capture_layers \[0, 4\] name a layer past tiny-llama's 4"),
])
def test_a_head_entry_the_target_cannot_capture_for_is_refused(tmp_path, eagle3, match):
    models = _registry_with(tmp_path, f"    repo_id: local/my-head\n    tokenizer_family: tiny-bpe-v1\n"
                                      f"    eagle3: {eagle3}\n{ARCH}")
    with pytest.raises(SpecError, match=match):
        resolve_spec(**{**EAGLE3, "draft": "my-head", "models_file": models})


@pytest.mark.parametrize("eagle3, match", [
    ("{target: nope, draft_vocab_size: 512}", r"model 'my-head': eagle3\.target 'nope' is not a model in the registry"),
    ("{target: tiny-llama-eagle3, draft_vocab_size: 512}", r"eagle3\.target 'tiny-llama-eagle3' is not a model"),
    ("{target: tiny-llama, draft_vocab_size: 512, capture_layers: [1, 1]}", r"capture_layers \[1, 1\] repeats a layer"),
    ("{target: ../x, draft_vocab_size: 512}", r"'\.\./x' is not a safe name"),
])
def test_bad_head_entries_are_refused_by_the_registry(tmp_path, eagle3, match):
    from pipeline.core.errors import RegistryError
    from pipeline.core.registry import load_registry

    models = _registry_with(tmp_path, f"    repo_id: local/my-head\n    tokenizer_family: tiny-bpe-v1\n"
                                      f"    eagle3: {eagle3}\n{ARCH}")
    with pytest.raises(RegistryError, match=match):
        load_registry(models)
