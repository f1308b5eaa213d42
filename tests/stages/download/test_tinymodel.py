"""Generated tiny models: registry numbers, loadability, training quality, determinism, cache behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.artifacts import read_manifest
from pipeline.core.errors import DownloadError
from pipeline.core.registry import get_model
from pipeline.stages.download import tinymodel

REPO = Path(__file__).resolve().parents[3]


def test_corpus_split_is_disjoint_and_deterministic():
    calib, heldout = tinymodel.corpus_split()
    assert len(calib) > 500 and len(heldout) > 50
    assert not set(calib) & set(heldout)
    assert tinymodel.corpus_split() == (calib, heldout)
    paras = [p for p in tinymodel.corpus_path().read_text().split("\n\n") if p.strip()]
    assert len(calib) + len(heldout) == len(set(paras))


def test_corpus_is_regenerable_from_its_script():
    sys.path.insert(0, str(REPO / "pipeline" / "data"))
    try:
        import make_corpus
    finally:
        sys.path.pop(0)
    assert make_corpus.make_corpus() == tinymodel.corpus_path().read_text()


def test_unknown_generated_model_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    with pytest.raises(DownloadError, match="no generator for model 'llama-8b'"):
        tinymodel.ensure_tiny_model("llama-8b")


@pytest.mark.slow
@pytest.mark.parametrize("name", tinymodel.GENERATED_MODELS)
def test_generated_model_matches_registry_and_loads(tiny_models, name):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = tiny_models[name]
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja"):
        assert (path / f).is_file(), f
    arch = get_model(name).architecture
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings, cfg.tie_word_embeddings,
            cfg.rope_theta) == (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim,
                                arch.intermediate_size, arch.vocab_size, arch.max_position_embeddings,
                                arch.tie_word_embeddings, arch.rope_theta)
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    model = AutoModelForCausalLM.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == arch.total_params
    assert (path / "model.safetensors").stat().st_size < 50e6
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == arch.vocab_size
    gen = GenerationConfig.from_pretrained(path)
    assert (gen.bos_token_id, gen.eos_token_id) == (tok.bos_token_id, tok.eos_token_id) == (cfg.bos_token_id,
                                                                                             cfg.eos_token_id)
    ids = tok("The cat lives in the house.")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == "The cat lives in the house."
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<s><|user|>Hi<|end|><|assistant|>"


@pytest.mark.slow
def test_models_are_trained_and_draft_agrees_with_target(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["tiny-llama"])
    target = AutoModelForCausalLM.from_pretrained(tiny_models["tiny-llama"])
    draft = AutoModelForCausalLM.from_pretrained(tiny_models["tiny-llama-draft"])
    _, heldout = tinymodel.corpus_split()
    assert tinymodel.heldout_perplexity(target, tok, heldout[:30]) < 10  # random weights: ~1024
    assert tinymodel.heldout_perplexity(draft, tok, heldout[:30]) < 10
    ids = tok(" ".join(heldout[:20]), return_tensors="pt")["input_ids"][:, :512]
    with torch.no_grad():
        agree = (target(ids).logits.argmax(-1) == draft(ids).logits.argmax(-1)).float().mean().item()
    assert agree > 0.5
    prompt = "Question: What color is the snow? Answer:"
    out = target.generate(**tok(prompt, return_tensors="pt"), max_new_tokens=3)
    assert tok.decode(out[0], skip_special_tokens=True).startswith(prompt + " The ")  # learned the answer format
    # both models share one tokenizer
    assert (tiny_models["tiny-llama"] / "tokenizer.json").read_bytes() == (
        tiny_models["tiny-llama-draft"] / "tokenizer.json").read_bytes()


def test_cached_model_is_reused(pipeline_env):
    path = tinymodel.ensure_tiny_model("tiny-llama")
    assert path.parent == pipeline_env / "cache" / "generated"
    manifest = read_manifest(path)
    assert manifest["key"] == tinymodel.generation_key("tiny-llama")
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}


@pytest.mark.slow
def test_generation_is_deterministic_and_race_free(tmp_path):
    """Two concurrent processes share one generation; another cache dir regenerates the same bytes."""
    script = ("import sys; from pipeline.stages.download.tinymodel import ensure_tiny_model; "
              "print(ensure_tiny_model('tiny-llama-draft', steps=3))")
    env_a = {"PIPELINE_CACHE": str(tmp_path / "a"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    env_b = {**env_a, "PIPELINE_CACHE": str(tmp_path / "b")}
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=e, stdout=subprocess.PIPE, text=True)
             for e in (env_a, env_a, env_b)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    generated = list((tmp_path / "a" / "generated").iterdir())
    assert [p.name for p in generated if not p.name.startswith(".")] == [Path(outs[0]).name]
    assert not [p for p in generated if p.name.startswith(".tmp-")]
    log = tmp_path / "a" / "logs" / f"generate-{Path(outs[0]).name}.log"  # the libraries' output, not the console
    assert log.read_text().startswith(f"# generate tiny-llama-draft -> {outs[0]} (")
    man_a, man_b = read_manifest(Path(outs[0])), read_manifest(Path(outs[2]))
    def content(m):  # the bytes, not when they were written
        return {rel: (rec["sha256"], rec["size"]) for rel, rec in m["files"].items()}

    assert content(man_a) == content(man_b)
    assert man_a["key"] == man_b["key"]


@pytest.mark.slow
def test_tiny_mistral_is_generated_as_its_family(tmp_path, monkeypatch):
    """One more family, generated like tiny-llama: transformers' MistralForCausalLM with the registry's numbers and
    the shared tokenizer (so tiny-llama-draft can draft for it)."""
    import json

    from transformers import AutoModelForCausalLM

    from pipeline.core.architectures import architecture_fields
    from pipeline.core.registry import Architecture

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    path = tinymodel.ensure_tiny_model("tiny-mistral", steps=2)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["sliding_window"] is None
    assert Architecture(**architecture_fields(config)) == get_model("tiny-mistral").architecture
    assert type(AutoModelForCausalLM.from_pretrained(path)).__name__ == "MistralForCausalLM"
    assert get_model("tiny-mistral").default_draft == "tiny-llama-draft"


@pytest.mark.slow
def test_tiny_mixtral_is_generated_as_its_family(tmp_path, monkeypatch):
    """The MoE family, generated like tiny-llama: transformers' MixtralForCausalLM with the registry's experts and
    top-k and the shared tokenizer (tiny-llama-draft drafts for it)."""
    import json

    from transformers import AutoModelForCausalLM

    from pipeline.core.architectures import architecture_fields
    from pipeline.core.registry import Architecture

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    entry = get_model("tiny-mixtral")
    path = tinymodel.ensure_tiny_model("tiny-mixtral", steps=2)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)
    assert Architecture(**architecture_fields(config)) == entry.architecture
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "MixtralForCausalLM" and len(model.model.layers[0].block_sparse_moe.experts) == 4
    assert entry.architecture.active_params < entry.architecture.total_params
    assert (path / "tokenizer.json").read_bytes() == (
        tinymodel.ensure_tiny_model("tiny-llama-draft", steps=2) / "tokenizer.json").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("name, cls, tied, extra", [
    ("tiny-qwen2", "Qwen2ForCausalLM", True, "self_attn.q_proj.bias"),
    ("tiny-qwen3", "Qwen3ForCausalLM", False, "self_attn.q_norm.weight"),
])
def test_tiny_qwen_is_generated_as_its_family(tmp_path, monkeypatch, name, cls, tied, extra):
    """Qwen2 (q/k/v biases, tied embeddings as the small Qwen2.5) and Qwen3 (per-head q/k norms), generated like
    tiny-llama with the shared tokenizer; the registry's architecture is what their config.json says."""
    import json

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from pipeline.core.architectures import architecture_fields
    from pipeline.core.registry import Architecture

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    path = tinymodel.ensure_tiny_model(name, steps=2)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [cls] and config["tie_word_embeddings"] is tied
    assert Architecture(**architecture_fields(config)) == get_model(name).architecture
    assert type(AutoModelForCausalLM.from_pretrained(path)).__name__ == cls
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert f"model.layers.0.{extra}" in f.keys()
        assert ("lm_head.weight" in f.keys()) is not tied
    assert get_model(name).tokenizer_family == get_model("tiny-llama").tokenizer_family


def test_an_eagle3_heads_key_follows_its_target_and_recipe(monkeypatch):
    """The head's cache key holds its target's generation key and its own recipe; a target's key holds neither."""
    from pipeline.stages.download import tiny_eagle3

    head, target = tinymodel.generation_key("tiny-llama-eagle3"), tinymodel.generation_key("tiny-llama")
    assert head != target
    monkeypatch.setitem(tiny_eagle3.HEAD_TRAIN, "steps", 1)
    assert tinymodel.generation_key("tiny-llama") == target
    assert tinymodel.generation_key("tiny-llama-eagle3") != head
    monkeypatch.undo()
    monkeypatch.setitem(tinymodel.TRAIN, "steps", 1)
    assert tinymodel.generation_key("tiny-llama-eagle3") != head
    assert "tiny-llama-eagle3" not in tinymodel.GENERATED_MODELS  # generated on demand, not in every session


@pytest.mark.slow
def test_eagle3_head_generation_is_deterministic(tiny_models, tmp_path, monkeypatch):
    """Two caches (sharing the session's target) generate the same head bytes; the manifest names the head."""
    import json

    paths = []
    for cache in ("a", "b"):
        generated = tmp_path / cache / "generated"
        generated.mkdir(parents=True)
        (generated / tiny_models["tiny-llama"].name).symlink_to(tiny_models["tiny-llama"], target_is_directory=True)
        monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / cache))
        paths.append(tinymodel.ensure_tiny_model("tiny-llama-eagle3", steps=2))
    man_a, man_b = read_manifest(paths[0]), read_manifest(paths[1])
    assert {k: v["sha256"] for k, v in man_a["files"].items()} == {k: v["sha256"] for k, v in man_b["files"].items()}
    assert man_a["name"] == "tiny-llama-eagle3" and man_a["train_steps"] == 2
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(man_a["files"])
    assert json.loads((paths[0] / "config.json").read_text())["draft_vocab_size"] == 512
