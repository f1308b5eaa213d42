"""Calibrate stage on the generated tiny Qwen2 / Qwen3 (CPU, real ModelOpt 0.37): both export formats, the round
trip into transformers' Qwen2ForCausalLM / Qwen3ForCausalLM, INT4-AWQ (which TensorRT-LLM 1.2.1 lists for Qwen2.5 on
both runtimes: examples/models/core/qwen/README.md, docs/source/features/quantization.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from pipeline.core.architectures import FAMILIES, support_blocker
from tests.support.calibrate_fixtures import calibrated

QWEN_MODELS = ("tiny-qwen2", "tiny-qwen3")


@pytest.fixture(scope="module")
def qwen_models(tmp_path_factory) -> dict[str, Path]:
    """The generated tiny Qwen models, trained once per session (or reused from PIPELINE_TEST_MODEL_CACHE)."""
    from pipeline.stages.download.tinymodel import ensure_tiny_model

    root = os.environ.get("PIPELINE_TEST_MODEL_CACHE") or str(tmp_path_factory.mktemp("qwen-model-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", root)
        return {name: ensure_tiny_model(name) for name in QWEN_MODELS}


def test_int4_awq_is_supported_for_qwen2_on_both_runtimes():
    assert support_blocker("qwen2", pytorch_backend=False, precision="int4_awq") is None
    assert support_blocker("qwen2", pytorch_backend=True, precision="int4_awq") is None
    assert "no int4_awq on the engine runtime" in support_blocker("qwen3", pytorch_backend=False,
                                                                   precision="int4_awq")


@pytest.mark.slow
def test_qwen2_int4_awq_engine_checkpoint_tp2(qwen_models):
    """AWQ (packed INT4, per-group scales, pre-quant scales) with Qwen2's q/k/v biases sharded over two ranks; the
    round trip dequantizes both ranks into Qwen2ForCausalLM within the AWQ tier."""
    # 2 calibration samples suffice for the layout, not always for the 1 % gate (the build measures that)
    res = calibrated(qwen_models, model="tiny-qwen2", precision="int4_awq", kv_cache="fp8", tp=2,
                     target="reference", quality_gate=False)
    cfg = json.loads((res.path / "config.json").read_text())
    assert (cfg["architecture"], cfg["qwen_type"], cfg["attn_bias"]) == ("Qwen2ForCausalLM", "qwen2", True)
    assert cfg["quantization"]["quant_algo"] == "W4A16_AWQ" and cfg["quantization"]["group_size"] == 128
    assert cfg["tie_word_embeddings"] is True and cfg["mapping"]["tp_size"] == 2
    for rank in range(2):
        w = load_file(str(res.path / f"rank{rank}.safetensors"))
        qkv = (8 + 2 * 4) * 32 // 2
        assert w["transformer.layers.0.attention.qkv.bias"].shape == (qkv,)
        assert w["transformer.layers.0.attention.qkv.weight"].shape == (qkv // 2, 256)  # two INT4 per byte
        assert "transformer.layers.0.attention.qkv.prequant_scaling_factor" in w
    m = res.manifest
    assert m.roundtrip.passed and m.recipe.quant_algo == "W4A16_AWQ"


@pytest.mark.slow
def test_qwen2_int4_awq_hf_checkpoint(qwen_models):
    """Runtime pytorch: ModelOpt's unified HF export of the AWQ Qwen2 keeps the biases, and loads back as
    Qwen2ForCausalLM."""
    from pipeline.stages.calibrate.hf_checkpoint import load_hf_checkpoint

    res = calibrated(qwen_models, model="tiny-qwen2", precision="int4_awq", kv_cache="fp8", runtime="pytorch",
                     target="reference", quality_gate=False)
    quant = json.loads((res.path / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "W4A16_AWQ"
    assert res.manifest.roundtrip.passed
    model = load_hf_checkpoint(res.path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.model.layers[0].self_attn.q_proj.bias is not None


@pytest.mark.slow
def test_qwen3_fp8_engine_checkpoint_tp2(qwen_models):
    """Qwen3's per-head q/k norms travel as attention.q_layernorm / k_layernorm on every rank; no biases."""
    res = calibrated(qwen_models, model="tiny-qwen3", precision="fp8", kv_cache="fp8", tp=2, target="reference")
    cfg = json.loads((res.path / "config.json").read_text())
    assert (cfg["architecture"], cfg["qwen_type"], cfg["attn_bias"]) == ("Qwen3ForCausalLM", "qwen3", False)
    assert FAMILIES["qwen3"].qk_norm
    for rank in range(2):
        w = load_file(str(res.path / f"rank{rank}.safetensors"))
        assert w["transformer.layers.3.attention.q_layernorm.weight"].shape == (32,)
        assert w["transformer.layers.3.attention.k_layernorm.weight"].shape == (32,)
        assert not any(k.endswith(".bias") for k in w)
    assert res.manifest.roundtrip.passed and res.manifest.roundtrip.max_rel_logit_err < 1e-2
    assert res.manifest.quality.passed
