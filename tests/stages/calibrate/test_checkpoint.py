"""Loading exported TensorRT-LLM checkpoints back into transformers' LlamaForCausalLM (all ranks, dequantized)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.core.errors import CalibrationError, PipelineError
from pipeline.stages.calibrate.checkpoint import CheckpointError, _unpack_int4, load_checkpoint_as_hf, read_checkpoint
from tests.support.calibrate_fixtures import calibrated, leftovers, make_spec, run_in_root

IDS = torch.tensor([[1, 17, 250, 33, 900, 5, 64, 301, 12, 77, 2, 400]])


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def test_int4_unpack_inverts_modelopt_packing():
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    torch.manual_seed(0)
    q = torch.randint(-8, 8, (6, 256)).float()
    scale = torch.ones(6, 2)
    packed = pack_int4_in_uint8(q, scale).view(torch.int8)
    assert packed.shape == (3, 256)
    assert torch.equal(_unpack_int4(packed), q)


@pytest.mark.slow
def test_tp2_pp2_sharding_round_trips(tiny_models):
    one = calibrated(tiny_models, precision="fp8", kv_cache="bf16", quality_gate=False)
    four = calibrated(tiny_models, precision="fp8", kv_cache="bf16", tp=2, pp=2, quality_gate=False)
    assert one.manifest.calibration.fingerprint == four.manifest.calibration.fingerprint
    assert len(list(four.path.glob("rank*.safetensors"))) == 4
    a, b = load_checkpoint_as_hf(one.path), load_checkpoint_as_hf(four.path)
    assert type(a).__name__ == "LlamaForCausalLM" and a.config.num_hidden_layers == 4
    torch.testing.assert_close(_logits(b), _logits(a), rtol=1e-5, atol=1e-5)
    sd1, sd4 = read_checkpoint(one.path).state_dict, read_checkpoint(four.path).state_dict
    assert sd1.keys() == sd4.keys()
    for k in sd1:
        torch.testing.assert_close(sd4[k], sd1[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow
def test_loaded_model_generates_and_simulates_activations(tiny_models):
    res = calibrated(tiny_models, precision="fp8", kv_cache="bf16", quality_gate=False)
    model = load_checkpoint_as_hf(res.path)
    plain = load_checkpoint_as_hf(res.path, activation_quant=False)
    la, lp = _logits(model), _logits(plain)
    assert not torch.equal(la, lp) and torch.allclose(la, lp, atol=0.5)  # FP8 activations: small, real effect
    out = model.generate(IDS[:, :4], max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 9)
    half = load_checkpoint_as_hf(res.path, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16


@pytest.mark.slow
def test_corrupted_scale_diverges(tiny_models, tmp_path):
    res = calibrated(tiny_models, precision="fp8", kv_cache="bf16", quality_gate=False)
    bad = tmp_path / "bad"
    shutil.copytree(res.path, bad)
    w = load_file(str(bad / "rank0.safetensors"))
    w["transformer.layers.1.mlp.proj.weights_scaling_factor"] *= 4
    save_file(w, str(bad / "rank0.safetensors"))
    good, broken = _logits(load_checkpoint_as_hf(res.path)), _logits(load_checkpoint_as_hf(bad))
    assert (good - broken).abs().max() / good.abs().max() > 1e-2


@pytest.mark.slow
def test_stage_round_trip_fails_on_corrupted_scale(tiny_models, tmp_path, monkeypatch):
    from pipeline.stages.calibrate import export as exp
    from pipeline.stages.calibrate.stage import run_calibrate

    real_check = exp.check

    def check_then_corrupt(out_dir, **kw):
        cfg = real_check(out_dir, **kw)
        w = load_file(str(out_dir / "rank0.safetensors"))
        w["transformer.layers.0.attention.dense.weights_scaling_factor"] *= 2
        save_file(w, str(out_dir / "rank0.safetensors"))
        return cfg

    monkeypatch.setattr(exp, "check", check_then_corrupt)
    spec = make_spec(precision="fp8", kv_cache="bf16", quality_gate=False, calib_seed=7)
    with pytest.raises(CalibrationError, match="round-trip check failed") as err:
        run_in_root(tmp_path, run_calibrate, spec, source=tiny_models["tiny-llama"])
    assert err.value.exit_code == 2
    assert not [p for p in leftovers(tmp_path) if p.endswith("/checkpoint") or ".tmp-" in p]


def test_incomplete_or_foreign_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="config.json does not exist"):
        read_checkpoint(tmp_path)
    cfg = {
        "architecture": "LlamaForCausalLM",
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "hidden_size": 256,
        "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
        "quantization": {"quant_algo": "FP8"},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "rank0.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="missing rank1.safetensors"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization": {"quant_algo": "NVFP4"}}))
    with pytest.raises(CheckpointError, match="NVFP4.*not supported"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architecture": "GPTForCausalLM"}))
    with pytest.raises(PipelineError, match="GPTForCausalLM"):
        load_checkpoint_as_hf(tmp_path)
