"""ModelOpt 0.37's exports of a tiny Mixtral and a tiny Qwen2 (random weights, FP8 + FP8 KV, on CPU) against the
family adapters (pipeline/core/architectures.py): the TensorRT-LLM checkpoint config.json carries exactly the fields
TensorRT-LLM 1.2.1's LLaMAConfig reads for Mixtral (tensorrt_llm/models/llama/config.py: `moe`, swiglu; mapping.py:
moe_tp_size x moe_ep_size = tp_size), the router stays unquantized, and a Qwen engine checkpoint cannot be written
without TensorRT-LLM (modelopt/torch/export/tensorrt_llm_utils.py), which is why `check` refuses it on a CPU host."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.core.architectures import FAMILIES, architecture_fields, checkpoint_fields
from pipeline.core.registry import Architecture

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def _quantized(config):
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    cfg["quant_cfg"].update(mtq.FP8_KV_CFG["quant_cfg"])
    data = torch.randint(0, TINY["vocab_size"], (2, 16))
    mtq.quantize(model, cfg, lambda m: [m(data[i:i + 1]) for i in range(2)])
    return model


@pytest.mark.slow
def test_mixtral_trtllm_checkpoint_matches_the_adapter(tmp_path):
    import torch
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint
    from transformers import MixtralConfig

    config = MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2, architectures=["MixtralForCausalLM"])
    arch = Architecture(**architecture_fields(config.to_dict()))
    model = _quantized(config)
    export_tensorrt_llm_checkpoint(copy.deepcopy(model), decoder_type=FAMILIES["mixtral"].modelopt_decoder_type,
                                   dtype=torch.bfloat16, export_dir=tmp_path / "trt", inference_tensor_parallel=2)
    ckpt = json.loads((tmp_path / "trt" / "config.json").read_text())
    for key, want in checkpoint_fields(arch).items():
        assert ckpt[key] == want, key
    assert ckpt["mapping"]["moe_tp_size"] == 2 and ckpt["mapping"]["moe_ep_size"] == 1
    routers = [m for m in ckpt["quantization"]["exclude_modules"] if m.endswith("mlp.router")]
    assert len(routers) == TINY["num_hidden_layers"]  # the router (HF `gate`) is left unquantized
    export_hf_checkpoint(copy.deepcopy(model), export_dir=tmp_path / "hf")
    quant = json.loads((tmp_path / "hf" / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "FP8" and quant["kv_cache_quant_algo"] == "FP8"
    assert sum(m.endswith("block_sparse_moe.gate") for m in quant["exclude_modules"]) == TINY["num_hidden_layers"]


@pytest.mark.slow
def test_qwen2_trtllm_export_needs_tensorrt_llm_and_hf_export_works(tmp_path):
    import torch
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint
    from transformers import Qwen2Config

    pytest.importorskip("modelopt")
    try:
        import tensorrt_llm  # noqa: F401
        pytest.skip("TensorRT-LLM is installed: the exporter uses QWenConfig here")
    except ImportError:
        pass
    config = Qwen2Config(**TINY, architectures=["Qwen2ForCausalLM"])
    model = _quantized(config)
    assert not FAMILIES["qwen2"].cpu_trtllm_export
    with pytest.raises(NotImplementedError, match="Cannot export tensorrt_llm checkpoint for model qwen"):
        export_tensorrt_llm_checkpoint(copy.deepcopy(model), decoder_type="qwen", dtype=torch.bfloat16,
                                       export_dir=tmp_path / "trt", inference_tensor_parallel=1)
    export_hf_checkpoint(copy.deepcopy(model), export_dir=tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf["architectures"] == ["Qwen2ForCausalLM"]
    assert Architecture(**architecture_fields(hf)).family == "qwen2"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert "model.layers.0.self_attn.q_proj.bias" in f.keys()  # Qwen2's q/k/v biases (attn_bias) survive


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen3-8b"])
def test_build_refuses_families_calibrate_cannot_round_trip_before_download(model, tmp_path, monkeypatch):
    """No byte is downloaded for a family the calibrate stage cannot load back: build fails at its check stage."""
    from pipeline.core.errors import CalibrationError
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.build import build

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model=model, precision="fp8", runtime="pytorch", target="reference", tp=2)
    with pytest.raises(CalibrationError, match="is planned and checked .* load LlamaForCausalLM, "
                                               "MistralForCausalLM, MixtralForCausalLM only") as info:
        build(spec, progress=None)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))
