"""EAGLE-3 on the reference LLM-API engine: the generated tiny head's layout (what TensorRT-LLM 1.2's
`Eagle3ForCausalLM` loads), greedy output identical to the target's own with drafts accepted, acceptance measured
against draft-target and n-gram on the same prompts, and the `speculative_config` values upstream refuses."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pipeline.core.registry import get_model
from pipeline.stages.download.tinymodel import corpus_split, ensure_tiny_model
from tests.support.llmapi_fixtures import fabricated_fp8_export, hf_reference_module

K = 4
PROMPTS = ("the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat",
           "Once upon a time", "Question: What color is the snow? Answer:",
           "<|user|>Tell me about the river.<|end|><|assistant|>")


@pytest.fixture(scope="module")
def ref():
    return hf_reference_module("hf_reference_eagle3")


@pytest.fixture(scope="module")
def head(tiny_models) -> Path:
    """The generated head, in the session's model cache (beside the tiny models it was trained on)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", str(tiny_models["tiny-llama"].parents[1]))
        return ensure_tiny_model("tiny-llama-eagle3")


@pytest.fixture(scope="module")
def fp8_target(tiny_models, tmp_path_factory) -> Path:
    return fabricated_fp8_export(tiny_models["tiny-llama"], tmp_path_factory.mktemp("eagle3") / "hf_checkpoint")


def _spec(head: Path, **extra):
    return {"decoding_type": "Eagle", "max_draft_len": K, "speculative_model_dir": str(head),
            "eagle3_layers_to_capture": [0, 1, 2], **extra}


@pytest.mark.slow
def test_head_is_laid_out_as_tensorrt_llm_loads_it(head, tiny_models):
    import torch
    from safetensors import safe_open

    entry = get_model("tiny-llama-eagle3")
    arch, h = entry.architecture, entry.architecture.hidden_size
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["draft_vocab_size"] == entry.eagle3.draft_vocab_size == 512  # makes it EAGLE3LlamaForCausalLM
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"], config["vocab_size"]) == (
        arch.num_layers, h, arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.intermediate_size, arch.vocab_size)
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    target_config = json.loads((tiny_models["tiny-llama"] / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "rope_theta", "rms_norm_eps"):
        assert config[key] == target_config[key], key
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    m, a = "midlayer.", "midlayer.self_attn."
    assert set(t) == {"fc.weight", m + "input_layernorm.weight", m + "hidden_norm.weight", a + "q_proj.weight",
                      a + "k_proj.weight", a + "v_proj.weight", a + "o_proj.weight",
                      m + "post_attention_layernorm.weight", m + "mlp.gate_proj.weight", m + "mlp.up_proj.weight",
                      m + "mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}  # no embed_tokens
    kv = arch.num_kv_heads * arch.head_dim
    assert t["fc.weight"].shape == (h, 3 * h)  # three captured layers fused
    assert t[a + "q_proj.weight"].shape == (arch.num_heads * arch.head_dim, 2 * h)  # concat(embeds, hidden)
    assert t[a + "k_proj.weight"].shape == t[a + "v_proj.weight"].shape == (kv, 2 * h)
    assert t["lm_head.weight"].shape == (512, h)
    assert all(v.dtype == torch.bfloat16 for k, v in t.items() if k not in ("d2t", "t2d"))
    assert t["d2t"].dtype == torch.int64 and t["d2t"].shape == (512,)
    target_ids = torch.arange(512) + t["d2t"]
    assert int(target_ids.min()) >= 0 and int(target_ids.max()) < arch.vocab_size
    assert len(set(target_ids.tolist())) == 512
    assert t["t2d"].dtype == torch.bool and t["t2d"].shape == (arch.vocab_size,) and int(t["t2d"].sum()) == 512
    assert bool(t["t2d"][target_ids].all())
    # the head shares the target's tokenizer (copied: the download stage checks each model dir holds one)
    assert (head / "tokenizer.json").read_bytes() == (tiny_models["tiny-llama"] / "tokenizer.json").read_bytes()


def _run(ref, target_dir: Path, prompts, *, mode: str, head: Path | None = None, draft: Path | None = None):
    """Greedy generations of `prompts` on the reference engine in `mode`; (token lists, drafted, accepted, the
    requests' prefix-cache metrics)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    target = ref.load_model(str(target_dir), torch.float32)
    settings = {"max_batch_size": 2, "max_seq_len": 512, "tokens_per_block": 8, "block_reuse": True,
                "max_draft_len": 0 if mode == "none" else K,
                "max_matching_ngram_size": 3 if mode == "ngram" else 0}
    eagle = ref.load_eagle3(_spec(head), target, torch.float32) if mode == "eagle3" else None
    drafter = ref.load_model(str(draft), torch.float32) if mode == "draft-target" else None
    done, finished = {}, threading.Event()

    def on_step(seq, final):
        if final:
            done[seq.handle] = seq
            if len(done) == len(prompts):
                finished.set()

    engine = ref.Engine(target, tok, ref.EngineSettings(**settings), draft=drafter, eagle=eagle, on_step=on_step)
    try:
        for i, prompt in enumerate(prompts):
            engine.submit(ref.Sequence(i, tok(prompt)["input_ids"], {"max_tokens": 24}, tok.eos_token_id))
        assert finished.wait(300)
    finally:
        engine.shutdown()
    seqs = [done[i] for i in range(len(prompts))]
    assert not [s.stop_reason for s in seqs if s.finish_reason == "error"]
    return ([s.generated for s in seqs], sum(s.perf["total_draft_tokens"] for s in seqs),
            sum(s.perf["total_accepted_draft_tokens"] for s in seqs), [s.perf["reused_blocks"] for s in seqs])


def _prompts():
    _, heldout = corpus_split()  # text the head was not trained on
    return (*PROMPTS, *(p[:60] for p in heldout[:8]))


@pytest.mark.slow
def test_eagle3_greedy_output_is_the_targets_own_and_drafts_are_accepted(ref, head, fp8_target, tiny_models):
    prompts = _prompts()
    # the same prompt twice: the second request reuses prefix blocks, so its head context starts later
    prompts = (*prompts, prompts[0])
    expected, _, _, _ = _run(ref, fp8_target, prompts, mode="none")
    got, drafted, accepted, reused = _run(ref, fp8_target, prompts, mode="eagle3", head=head)
    assert got == expected
    assert reused[-1] > 0
    assert drafted >= K * len(prompts)
    rate = accepted / drafted
    print(f"eagle3: {accepted}/{drafted} drafts accepted ({100 * rate:.1f} %), mean accepted length {1 + K * rate:.2f}")
    assert rate > 0.4  # a random head accepts ~0


@pytest.mark.slow
def test_acceptance_per_mode_on_the_same_prompts(ref, head, fp8_target, tiny_models):
    """K=4 on the same prompts: EAGLE-3 (tiny head) vs draft-target (tiny-llama-draft) vs n-gram."""
    prompts = _prompts()
    expected, _, _, _ = _run(ref, fp8_target, prompts, mode="none")
    rates = {}
    for mode in ("ngram", "draft-target", "eagle3"):
        got, drafted, accepted, _ = _run(ref, fp8_target, prompts, mode=mode, head=head,
                                      draft=tiny_models["tiny-llama-draft"])
        assert got == expected, mode
        rates[mode] = accepted / drafted
        print(f"{mode}: acceptance {100 * rates[mode]:.1f} %, mean accepted length {1 + K * rates[mode]:.2f}")
    assert rates["eagle3"] > max(rates["ngram"], 0.6)


@pytest.mark.slow
@pytest.mark.parametrize("change, message", [
    ({"speculative_model_dir": None}, "EAGLE3 draft model must be specified"),
    ({"max_draft_len": None}, "max_draft_len is required for Eagle"),
    ({"eagle3_layers_to_capture": None}, "Not enough hidden layers for default EAGLE3 capture"),
    ({"eagle3_layers_to_capture": [0, 1]}, "fc.weight is [256, 768], but 2 captured layers"),
    ({"eagle3_layers_to_capture": [1, 2, 4]}, "must name layers of the target (0..3)"),
    ({"eagle3_one_model": "yes"}, "eagle3_one_model must be true or false"),
])
def test_bad_eagle_configs_are_refused_in_one_line(ref, head, tiny_models, change, message):
    import torch

    target = ref.load_model(str(tiny_models["tiny-llama"]), torch.float32)
    spec = {k: v for k, v in {**_spec(head), **change}.items() if v is not None}
    with pytest.raises(ValueError) as err:
        ref.load_eagle3(spec, target, torch.float32)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_model_without_draft_vocab_size_is_not_a_head(ref, tiny_models, tmp_path):
    import torch

    target = ref.load_model(str(tiny_models["tiny-llama"]), torch.float32)
    with pytest.raises(ValueError, match="has no draft_vocab_size, so it is not an EAGLE-3 head"):
        ref.load_eagle3(_spec(tiny_models["tiny-llama-draft"]), target, torch.float32)
    with pytest.raises(ValueError, match="holds no config.json"):
        ref.load_eagle3(_spec(tmp_path), target, torch.float32)


@pytest.fixture(scope="module")
def eagle_server(head, fp8_target, tmp_path_factory):
    """A reference llmapi repository packaged for n-gram, its model.yaml switched to the LLM-API Eagle options
    (what the eagle3 packaging writes), served by a real tritonserver."""
    import yaml

    from pipeline.core.spec import resolve_spec
    from pipeline.serving.serve import TritonServer
    from pipeline.stages.package.inputs import PackageInputs
    from pipeline.stages.package.llmapi_options import llm_api_options
    from pipeline.stages.package.llmapi_package import package_llmapi_repo

    root = tmp_path_factory.mktemp("eagle3-serve")
    spec = resolve_spec(model="tiny-llama", precision="fp8", speculative_decoding="ngram", draft_len=K,
                        max_matching_ngram_size=3, target="reference", runtime="pytorch")
    repo = package_llmapi_repo(spec, PackageInputs(checkpoint=fp8_target, output=root / "repos"),
                               options=llm_api_options(spec, draft_dir=None)).path
    model_yaml = repo / "tensorrt_llm" / "1" / "model.yaml"
    data = yaml.safe_load(model_yaml.read_text())
    data["speculative_config"] = {"decoding_type": "Eagle", "max_draft_len": K, "speculative_model_dir": str(head),
                                  "eagle3_layers_to_capture": [0, 1, 2], "eagle3_one_model": True}
    model_yaml.write_text(yaml.safe_dump(data))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", str(root / "cache"))
        srv = TritonServer(repo, ready_timeout_s=300)
        srv.start()
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[2]])
def test_served_eagle3_output_is_the_targets_own(eagle_server, fp8_target, prompt):
    from tests.stages.package.test_llmapi_reference import generate, local_greedy

    r = generate(eagle_server, prompt, sampling_param_max_tokens=16, sampling_param_return_perf_metrics=True)
    assert r["text_output"] == local_greedy(fp8_target, prompt, 16)
    assert 0 < r["total_accepted_draft_tokens"] <= r["total_draft_tokens"], r
    assert r["acceptance_rate"] == pytest.approx(r["total_accepted_draft_tokens"] / r["total_draft_tokens"])
