"""tiny-mixtral through the calibrate stage (real ModelOpt 0.37 on CPU, FP8 + FP8 KV): the TensorRT-LLM checkpoint
matches TensorRT-LLM 1.2.1's schema for a Mixtral LLaMAForCausalLM, one test per upstream file it was read from; the
round trip maps the stacked, TP-sharded experts back into transformers' MixtralForCausalLM within the quality gate;
the Hugging Face export (runtime pytorch) loads back the same way. INT4-AWQ is refused by `check` (support matrix)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.core.architectures import SOURCES, checkpoint_fields, moe_checkpoint_tensors
from pipeline.core.errors import SpecError
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from tests.support.calibrate_fixtures import calibrated

TP = 2
ARCH = get_model("tiny-mixtral").architecture


@pytest.fixture(scope="module")
def mixtral_models(tmp_path_factory) -> dict[str, Path]:
    """The generated tiny-mixtral (PIPELINE_TEST_MODEL_CACHE reuses it across sessions, like `tiny_models`)."""
    from pipeline.stages.download.tinymodel import ensure_tiny_model

    root = os.environ.get("PIPELINE_TEST_MODEL_CACHE") or str(tmp_path_factory.mktemp("mixtral-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", root)
        return {"tiny-mixtral": ensure_tiny_model("tiny-mixtral")}


@pytest.fixture(scope="module")
def engine_ckpt(mixtral_models):
    return calibrated(mixtral_models, model="tiny-mixtral", precision="fp8", tp=TP, target="reference")


def _rank(ckpt: Path, r: int) -> dict:
    from safetensors.torch import load_file

    return load_file(str(ckpt / f"rank{r}.safetensors"))


@pytest.mark.slow
def test_llama_config_fields(engine_ckpt):
    """tensorrt_llm/models/llama/config.py: LLaMAConfig for Mixtral adds `moe` (RENORMALIZE) and swiglu."""
    assert "models/llama/config.py" in SOURCES["llama_config"]
    cfg = json.loads((engine_ckpt.path / "config.json").read_text())
    for key, want in checkpoint_fields(ARCH).items():
        assert cfg[key] == want, key
    assert cfg["moe"] == {"num_experts": 4, "top_k": 2, "normalization_mode": 1}


@pytest.mark.slow
def test_mapping_fields(engine_ckpt):
    """tensorrt_llm/mapping.py: moe_tp_size x moe_ep_size == tp_size; ModelOpt shards experts by TP (EP 1)."""
    assert "mapping.py" in SOURCES["mapping"]
    m = json.loads((engine_ckpt.path / "config.json").read_text())["mapping"]
    assert (m["tp_size"], m["moe_tp_size"], m["moe_ep_size"]) == (TP, TP, 1)


@pytest.mark.slow
def test_moe_layer_tensors(engine_ckpt):
    """tensorrt_llm/layers/moe.py: per rank, router [E, H] float32 (tp 1), fc [E, 2*I/tp, H], proj [E, H, I/tp];
    FP8 per expert (one weight scale each), one activation scale for all experts (ModelOpt 0.37)."""
    import torch

    assert "layers/moe.py" in SOURCES["moe"]
    shapes = moe_checkpoint_tensors(ARCH, moe_tp=TP)
    ranks = [_rank(engine_ckpt.path, r) for r in range(TP)]
    for layer in range(ARCH.num_layers):
        pre = f"transformer.layers.{layer}."
        for w in ranks:
            for name, shape in shapes.items():
                assert tuple(w[pre + name].shape) == shape, name
            assert w[pre + "mlp.router.weight"].dtype == torch.float32
            for lin in ("mlp.fc", "mlp.proj"):
                assert w[f"{pre}{lin}.weight"].dtype == torch.float8_e4m3fn
                assert tuple(w[f"{pre}{lin}.weights_scaling_factor"].shape) == (ARCH.num_experts, 1)
                assert w[f"{pre}{lin}.activation_scaling_factor"].numel() == 1
            assert not any(k.startswith(pre + "mlp.gate") for k in w)  # no dense GatedMLP in a MoE layer
        assert torch.equal(ranks[0][pre + "mlp.router.weight"], ranks[1][pre + "mlp.router.weight"])


@pytest.mark.slow
def test_convert_names_and_expert_order(engine_ckpt, mixtral_models):
    """tensorrt_llm/models/llama/convert.py: block_sparse_moe.gate -> mlp.router (never quantized), w3w1 = [w3; w1]
    -> mlp.fc, w2 -> mlp.proj. The loader puts each half back: its w1/w3 match the source model's, not swapped."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.stages.calibrate.checkpoint import load_checkpoint_as_hf

    assert "models/llama/convert.py" in SOURCES["llama_convert"]
    q = json.loads((engine_ckpt.path / "config.json").read_text())["quantization"]
    routers = {m for m in q["exclude_modules"] if m.endswith("mlp.router")}
    assert routers == {f"transformer.layers.{i}.mlp.router" for i in range(ARCH.num_layers)}
    loaded = load_checkpoint_as_hf(engine_ckpt.path, activation_quant=False)
    source = AutoModelForCausalLM.from_pretrained(mixtral_models["tiny-mixtral"], dtype=torch.float32)
    assert type(loaded).__name__ == "MixtralForCausalLM"
    for e in range(ARCH.num_experts):
        got = loaded.model.layers[0].block_sparse_moe.experts[e]
        want = source.model.layers[0].block_sparse_moe.experts[e]
        for name in ("w1", "w2", "w3"):
            a, b = getattr(got, name).weight, getattr(want, name).weight
            assert (a - b).abs().max() <= 0.07 * b.abs().max(), (e, name)  # within FP8 rounding
        assert (got.w1.weight - want.w3.weight).abs().max() > 0.2 * want.w3.weight.abs().max()
    gate = loaded.model.layers[0].block_sparse_moe.gate.weight
    assert torch.allclose(gate, source.model.layers[0].block_sparse_moe.gate.weight, atol=1e-2)


@pytest.mark.slow
def test_round_trip_within_the_quality_gate(engine_ckpt):
    m = engine_ckpt.manifest
    assert m.roundtrip.passed and m.roundtrip.top1_agreement >= 0.98
    assert m.quality.ppl_delta_pct <= get_model("tiny-mixtral").calibration.max_ppl_delta_pct
    assert m.recipe.quant_algo == "FP8" and m.recipe.kv_cache_quant_algo == "FP8"


@pytest.mark.slow
def test_hf_export_loads_back_as_mixtral(mixtral_models):
    """runtime pytorch: ModelOpt's HF export keeps per-expert w1/w2/w3 with their own scales and the router
    (`block_sparse_moe.gate`) unquantized; it loads back into MixtralForCausalLM within the gate."""
    from pipeline.stages.calibrate.hf_checkpoint import load_hf_checkpoint

    res = calibrated(mixtral_models, model="tiny-mixtral", precision="fp8", runtime="pytorch", target="reference")
    quant = json.loads((res.path / "hf_quant_config.json").read_text())["quantization"]
    gates = {m for m in quant["exclude_modules"] if m.endswith("block_sparse_moe.gate")}
    assert gates == {f"model.layers.{i}.block_sparse_moe.gate" for i in range(ARCH.num_layers)}
    assert res.manifest.roundtrip.passed
    assert type(load_hf_checkpoint(res.path)).__name__ == "MixtralForCausalLM"


@pytest.mark.parametrize("runtime", ["engine", "pytorch"])
def test_int4_awq_is_refused_by_check(runtime):
    """The support matrix has no W4A16 AWQ for Mixtral on either runtime: refused before any work."""
    with pytest.raises(SpecError, match="MixtralForCausalLM has no int4_awq on the .* runtime"):
        resolve_spec(model="tiny-mixtral", precision="int4_awq", runtime=runtime, target="reference")
