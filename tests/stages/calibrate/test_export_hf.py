"""Calibrate for runtime pytorch: ModelOpt's unified HF export on the tiny Llama (CPU), checked and loaded back."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline.stages.calibrate.checkpoint import CheckpointError
from pipeline.stages.calibrate.hf_checkpoint import load_hf_checkpoint, read_quant_config
from tests.support.calibrate_fixtures import calibrated

HF_COMBOS = [("fp8", "fp8"), ("int4_awq", "bf16"), ("w4a8_awq", "fp8"), ("bf16", "bf16")]


@pytest.mark.slow
@pytest.mark.parametrize("precision, kv", HF_COMBOS, ids=[f"{p}-kv_{k}" for p, k in HF_COMBOS])
def test_hf_export_layout_quant_config_and_roundtrip(tiny_models, precision, kv):
    res = calibrated(tiny_models, precision=precision, kv_cache=kv, runtime="pytorch", quality_gate=False, tp=2)
    ck = res.path
    assert ck.name == "hf_checkpoint" and ck.parent.name == res.manifest.build_id
    q = json.loads((ck / "hf_quant_config.json").read_text())["quantization"]
    want = {"fp8": "FP8", "int4_awq": "W4A16_AWQ", "w4a8_awq": "W4A8_AWQ", "bf16": None}[precision]
    assert q["quant_algo"] == want
    assert q["kv_cache_quant_algo"] == ("FP8" if kv == "fp8" else None)
    if want:
        assert q["exclude_modules"] == ["lm_head"]
    if precision in ("int4_awq", "w4a8_awq"):
        assert (q["group_size"], q["has_zero_point"], q["pre_quant_scale"]) == (128, False, True)
    cfg = json.loads((ck / "config.json").read_text())
    half = "float16" if precision == "w4a8_awq" else "bfloat16"  # W4A8-AWQ computes in fp16 on both runtimes
    assert cfg["dtype"] == half and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["quantization_config"]["quant_method"] == "modelopt"
    assert not list(ck.glob("rank*.safetensors"))  # unsharded: tp is applied by the PyTorch backend at load
    w = load_file(str(ck / "model.safetensors"))
    v = "model.layers.0.self_attn.v_proj"
    if precision == "fp8":
        assert w[f"{v}.weight"].dtype == torch.float8_e4m3fn and w[f"{v}.weight"].shape == (128, 256)
        assert w[f"{v}.weight_scale"].dtype == torch.float32 and f"{v}.input_scale" in w
    elif precision in ("int4_awq", "w4a8_awq"):
        assert w[f"{v}.weight"].dtype == torch.uint8 and w[f"{v}.weight"].shape == (64, 256)
        assert w[f"{v}.weight_scale"].shape == (128, 2)
        assert (f"{v}.weight_scale_2" in w) == (precision == "w4a8_awq")
    else:
        assert w[f"{v}.weight"].dtype == torch.bfloat16
    assert (f"{v}.v_scale" in w) == (kv == "fp8")
    assert w["lm_head.weight"].dtype == getattr(torch, half) and w["model.norm.weight"].dtype == getattr(torch, half)
    assert (ck / "tokenizer.json").is_file() and "tokenizer.json" in res.manifest.files
    m = res.manifest
    assert m.roundtrip.passed is True and m.checkpoint.format == "hf"
    assert m.factors["runtime"] == "pytorch" and m.parallelism == {"tp": 1, "pp": 1, "world_size": 1}
    assert m.checkpoint.hf_quant_config["quant_algo"] == want


@pytest.mark.slow
def test_hf_export_reloads_close_to_the_source_and_differs_from_the_engine_build(tiny_models):
    hf = calibrated(tiny_models, precision="fp8", kv_cache="fp8", runtime="pytorch")
    engine = calibrated(tiny_models, precision="fp8", kv_cache="fp8")
    assert hf.manifest.build_id != engine.manifest.build_id and "runtime" not in engine.manifest.factors
    assert hf.manifest.quality.passed and abs(hf.manifest.quality.ppl_delta_pct) < 1.0
    model = load_hf_checkpoint(hf.path)
    ids = torch.tensor([[5, 17, 300, 42, 7, 99]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 6, 1024) and torch.isfinite(logits).all()


def test_unsupported_or_missing_quant_config(tmp_path):
    with pytest.raises(CheckpointError, match="hf_quant_config.json does not exist"):
        read_quant_config(tmp_path)
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    with pytest.raises(CheckpointError, match="quant_algo 'NVFP4' is not supported"):
        read_quant_config(tmp_path)
    (tmp_path / "hf_quant_config.json").write_text("[1]")
    with pytest.raises(CheckpointError, match="hf_quant_config.json is not a JSON object"):
        read_quant_config(tmp_path)
    (tmp_path / "hf_quant_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no 'quantization' mapping"):
        read_quant_config(tmp_path)


@pytest.mark.slow
def test_large_model_hf_export_packs_one_copy_and_matches_the_exact_export(tiny_models, tmp_path, monkeypatch):
    """Above the round-trip size the export packs a plain copy and the model itself is the gate's reference: the
    written checkpoint holds the same tensors as the exact (float32) export, up to bf16 rounding ties."""
    from pipeline.stages.calibrate import stage
    from tests.support.calibrate_fixtures import make_spec, run_in_root

    exact = calibrated(tiny_models, precision="fp8", kv_cache="fp8", runtime="pytorch")
    monkeypatch.setattr(stage, "ROUNDTRIP_MAX_PARAMS", 0)
    spec = make_spec(precision="fp8", kv_cache="fp8", runtime="pytorch")
    large = run_in_root(tmp_path, stage.run_calibrate, spec, role="target", source=tiny_models["tiny-llama"])
    assert large.manifest.roundtrip.passed is None and large.manifest.quality.passed
    a, b = load_file(str(exact.path / "model.safetensors")), load_file(str(large.path / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape for k in a)
    v = "model.layers.0.self_attn.v_proj.weight"
    same = (a[v].view(torch.uint8) == b[v].view(torch.uint8)).float().mean().item()
    assert b[v].dtype == torch.float8_e4m3fn and same > 0.95
    assert json.loads((large.path / "hf_quant_config.json").read_text()) == json.loads(
        (exact.path / "hf_quant_config.json").read_text())
