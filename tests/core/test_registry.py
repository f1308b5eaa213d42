"""Registry loading: packaged entries, user overrides, malformed files."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import DownloadError, RegistryError
from pipeline.core.registry import get_model, load_registry
from pipeline.core.spec import resolve_spec


def test_packaged_models():
    reg = load_registry()
    assert {"llama-70b", "llama-8b", "llama-3b", "llama-1b", "tiny-llama", "tiny-llama-draft"} <= set(reg)
    m = reg["llama-70b"]
    assert m.repo_id == "meta-llama/Llama-3.1-70B-Instruct" and m.gated
    assert m.default_draft == "llama-1b" and m.default_draft_len == 5
    assert reg["llama-1b"].repo_id == "meta-llama/Llama-3.2-1B-Instruct"
    assert reg["tiny-llama"].source == "generated"


def test_architecture_param_counts_match_published():
    # 70.55 B, 8.03 B, 3.21 B (tied), 1.24 B (tied)
    expect = {"llama-70b": 70.55e9, "llama-8b": 8.03e9, "llama-3b": 3.21e9, "llama-1b": 1.24e9}
    for name, n in expect.items():
        assert get_model(name).architecture.total_params == pytest.approx(n, rel=0.005), name


def test_tiny_models_share_tokenizer_and_fit_awq_tp2():
    t, d = get_model("tiny-llama"), get_model("tiny-llama-draft")
    assert t.tokenizer_family == d.tokenizer_family and t.architecture.vocab_size == d.architecture.vocab_size
    assert t.architecture.hidden_size >= 256 and t.architecture.intermediate_size % 256 == 0
    assert t.architecture.num_kv_heads < t.architecture.num_heads  # GQA


def test_unknown_model_lists_known():
    with pytest.raises(RegistryError, match=r"unknown model 'llama-999b'; known models: .*llama-405b.*llama-70b"):
        get_model("llama-999b")


def test_user_models_file_adds_and_overrides(tmp_path):
    f = tmp_path / "models.yaml"
    f.write_text(
        """
models:
  my-llama:
    repo_id: acme/my-llama
    revision: 0123456789abcdef0123456789abcdef01234567
    tokenizer_family: llama3
    architecture: {num_layers: 2, hidden_size: 512, num_heads: 8, num_kv_heads: 2, head_dim: 64,
                   intermediate_size: 1024, vocab_size: 128256, max_position_embeddings: 4096}
    limits: {max_batch_size: 4, max_input_len: 512, max_seq_len: 1024}
"""
    )
    spec = resolve_spec(model="my-llama", precision="fp8", models_file=f)
    assert spec.model.repo_id == "acme/my-llama" and spec.max_batch_size == 4
    assert "llama-70b" in load_registry(f)


def test_user_model_without_limits_gets_defaults_within_its_positions(tmp_path):
    f = tmp_path / "models.yaml"
    f.write_text(
        "models:\n  short:\n    repo_id: acme/short\n    tokenizer_family: t\n"
        "    architecture: {num_layers: 2, hidden_size: 256, num_heads: 8, num_kv_heads: 4, head_dim: 32,\n"
        "                   intermediate_size: 512, vocab_size: 1024, max_position_embeddings: 1024}\n"
    )
    spec = resolve_spec(model="short", precision="bf16", models_file=f)
    assert (spec.max_seq_len, spec.max_input_len, spec.max_batch_size) == (1024, 512, 64)
    assert resolve_spec(model="short", precision="bf16", models_file=f, max_input_len=1000).max_input_len == 1000
    assert get_model("llama-70b").limits.max_seq_len == 8192  # explicit limits are kept


@pytest.mark.parametrize(
    "text, match",
    [
        ("models: [\n", r"not valid YAML \(line"),
        ("- a\n- b\n", r"top-level 'models:' mapping"),
        ("models:\n  x: 3\n", r"model 'x' must be a mapping"),
        ("models:\n  x: {repo_id: a/b, tokenizer_family: t}\n", r"model 'x': field 'architecture': Field required"),
        (
            "models:\n  x: {repo_id: a/b, tokenizer_family: t, colour: red, architecture: {num_layers: 1, "
            "hidden_size: 8, num_heads: 2, num_kv_heads: 2, head_dim: 4, intermediate_size: 8, vocab_size: 8, "
            "max_position_embeddings: 8}}\n",
            r"field 'colour': Extra inputs are not permitted",
        ),
        ("models:\n  x: {repo_id: a/b, tokenizer_family: t, default_draft: nope, architecture: {num_layers: 1, "
         "hidden_size: 8, num_heads: 2, num_kv_heads: 2, head_dim: 4, intermediate_size: 8, vocab_size: 8, "
         "max_position_embeddings: 8}}\n", r"default_draft 'nope' is not in the registry"),
        ("models:\n  x: {repo_id: a/b, tokenizer_family: t, architecture: {num_layers: 1, "
         "hidden_size: 8, num_heads: 3, num_kv_heads: 2, head_dim: 4, intermediate_size: 8, vocab_size: 8, "
         "max_position_embeddings: 8}}\n", r"not a multiple of num_kv_heads"),
    ],
)
def test_malformed_models_file(tmp_path, text, match):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(RegistryError, match=match):
        load_registry(f)


ARCH = ("architecture: {num_layers: 1, hidden_size: 8, num_heads: 2, num_kv_heads: 2, head_dim: 4, "
        "intermediate_size: 8, vocab_size: 8, max_position_embeddings: 8}")


@pytest.mark.parametrize("repo_id", ["../../etc", "acme--x/y", "acme/../y", "/abs", "a/b/c", "x" * 97])
def test_check_refuses_the_repo_ids_download_refuses(tmp_path, repo_id):
    """One rule for the spec and the download stage: `check` exits 2 on a repo id `download` could not use."""
    f = tmp_path / "bad.yaml"
    f.write_text(f"models:\n  x: {{repo_id: {json.dumps(repo_id)}, tokenizer_family: t, {ARCH}}}\n")
    with pytest.raises(RegistryError, match=r"model 'x': field 'repo_id': .* is not a Hub repo id") as err:
        resolve_spec(model="x", precision="bf16", models_file=f)
    assert err.value.exit_code == 2
    from pipeline.stages.download.stage import _repo_dir

    with pytest.raises(DownloadError, match="is not a Hub repo id"):
        _repo_dir(repo_id)


_FIELDS = {"num_layers": "1", "hidden_size": "8", "num_heads": "2", "num_kv_heads": "2", "head_dim": "4",
           "intermediate_size": "8", "vocab_size": "8", "max_position_embeddings": "8"}


@pytest.mark.parametrize("changes, extra, match", [
    ({"num_layers": "0"}, "", "'architecture.num_layers': Input should be greater than 0"),
    ({"num_layers": "-1"}, "", "'architecture.num_layers': Input should be greater than 0"),
    ({"num_layers": "32.5"}, "", "'architecture.num_layers': Input should be a valid integer"),
    ({"num_layers": "true"}, "", "'architecture.num_layers': Input should be a valid integer"),
    ({"num_layers": '"32"'}, "", "'architecture.num_layers': Input should be a valid integer"),
    ({"num_layers": "2000"}, "", "'architecture.num_layers': Input should be less than or equal to 1024"),
    ({"hidden_size": "1.0e+30"}, "", "'architecture.hidden_size': Input should be a valid integer"),
    ({"num_heads": "4096", "num_kv_heads": "4096"}, "", "'architecture.num_heads': Input should be less than"),
    ({"vocab_size": str(10**9)}, "", "'architecture.vocab_size': Input should be less than or equal to 4194304"),
    ({"rope_theta": ".nan"}, "", "'architecture.rope_theta': Input should be a finite number"),
    ({"rope_theta": ".inf"}, "", "'architecture.rope_theta': Input should be a finite number"),
    ({"rope_theta": "-1.0"}, "", "'architecture.rope_theta': Input should be greater than 0"),
    ({"rope_theta": "1.0e+13"}, "", "'architecture.rope_theta': Input should be less than or equal to"),
    ({"sliding_window": "16"}, "", "'architecture': sliding_window 16 exceeds max_position_embeddings 8"),
    ({"head_dim": None, "hidden_size": "9"}, "", "'architecture': hidden_size 9 is not a multiple of num_heads 2"),
    ({}, ", calibration: {max_ppl_delta_pct: .inf}", "'calibration.max_ppl_delta_pct': Input should be a finite"),
    ({}, ", calibration: {max_ppl_delta_pct: .nan}", "'calibration.max_ppl_delta_pct': Input should be a finite"),
    ({}, ", default_draft_len: 0", "'default_draft_len': Input should be greater than or equal to 1"),
    ({}, ", default_draft_len: 1000", "'default_draft_len': Input should be less than or equal to 64"),
    ({}, ", limits: {max_batch_size: 1000000}", "'limits.max_batch_size': Input should be less than or equal"),
    ({}, ", tokenizer_size: -1", "'tokenizer_size': Input should be greater than 0"),
])
def test_models_file_numbers_typed_and_bounded(tmp_path, changes, extra, match):
    """Every registry number is a YAML integer (a finite float: rope_theta, the gate) within generous bounds."""
    fields = {**_FIELDS, **changes}
    arch = ", ".join(f"{k}: {v}" for k, v in fields.items() if v is not None)
    f = tmp_path / "bad.yaml"
    f.write_text(f"models:\n  x: {{repo_id: a/b, tokenizer_family: t, architecture: {{{arch}}}{extra}}}\n")
    with pytest.raises(RegistryError, match=f"^model 'x': field {match}") as err:
        load_registry(f)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_models_file_head_dim_defaults_to_hidden_over_heads(tmp_path):
    f = tmp_path / "m.yaml"
    arch = ", ".join(f"{k}: {v}" for k, v in _FIELDS.items() if k != "head_dim")
    f.write_text(f"models:\n  x: {{repo_id: a/b, tokenizer_family: t, architecture: {{{arch}}}}}\n")
    assert load_registry(f)["x"].architecture.head_dim == 4


def test_missing_models_file(tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        load_registry(tmp_path / "nope.yaml")


def test_yaml_is_loaded_safely(tmp_path):
    f = tmp_path / "evil.yaml"
    f.write_text("models: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_registry(f)
