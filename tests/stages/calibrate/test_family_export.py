"""ModelOpt 0.37's exports of a tiny Mixtral, Qwen2 and Qwen3 (random weights, FP8 + FP8 KV, on CPU) against the
family adapters (pipeline/core/architectures.py): the TensorRT-LLM checkpoint config.json carries exactly the fields
TensorRT-LLM 1.2.1's LLaMAConfig reads for Mixtral (tensorrt_llm/models/llama/config.py: `moe`, swiglu; mapping.py:
moe_tp_size x moe_ep_size = tp_size) and the router stays unquantized; a Qwen engine checkpoint, which ModelOpt
writes no config for without TensorRT-LLM (modelopt/torch/export/tensorrt_llm_utils.py), is exported through the
"llama" weight conversion and completed with QWenConfig's fields (tensorrt_llm/models/qwen/config.py), each rank
holding what QWenForCausalLM loads (models/qwen/model.py, convert.py)."""

from __future__ import annotations

import copy
import json

import pytest

from pipeline.core.architectures import SOURCES, FAMILIES, architecture_fields, checkpoint_fields
from pipeline.core.registry import Architecture

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def _quantized(config):
    """Random weights rounded to bf16 (as a Hub checkpoint holds them; buffers such as the rotary frequencies stay
    float32), held in float32, fake-quantized."""
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16).float()
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


# --- modelopt 0.37 tensorrt_llm_utils.py / layer_utils.py: "qwen" has no manual config writer, "llama" converts it ---
QWEN_CLASSES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM", True), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", False)}


def _qwen(family: str):
    """A tiny FP8 + FP8-KV fake-quantized Qwen2 (tied embeddings, as the small Qwen2.5) or Qwen3 on CPU."""
    import transformers

    cls, arch, tied = QWEN_CLASSES[family]
    return _quantized(getattr(transformers, cls)(**TINY, architectures=[arch], tie_word_embeddings=tied))


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(QWEN_CLASSES))
def test_modelopt_qwen_decoder_converts_weights_as_llama_and_writes_no_config(family, monkeypatch, tmp_path):
    """The "qwen" decoder type raises in the config writer only; its weights equal the "llama" decoder's, which is
    why `trtllm_export_decoder` is "llama" for the dense Qwen families."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint, model_config_export

    try:
        import tensorrt_llm  # noqa: F401
        pytest.skip("TensorRT-LLM is installed: the exporter uses QWenConfig here")
    except ImportError:
        pass
    model = _qwen(family)
    with pytest.raises(NotImplementedError, match="Cannot export tensorrt_llm checkpoint for model qwen"):
        export_tensorrt_llm_checkpoint(copy.deepcopy(model), decoder_type="qwen", dtype=torch.bfloat16,
                                       export_dir=tmp_path, inference_tensor_parallel=1)
    monkeypatch.setattr(model_config_export, "convert_to_tensorrt_llm_config", lambda *a, **k: {})
    ranks = {}
    for decoder in ("qwen", "llama"):
        ranks[decoder] = [w for _, w, _ in model_config_export.torch_to_tensorrt_llm_checkpoint(
            copy.deepcopy(model), decoder, torch.bfloat16, inference_tensor_parallel=2)]
    assert FAMILIES[family].trtllm_export_decoder == "llama" and FAMILIES[family].modelopt_decoder_type == "qwen"
    assert "layer_utils.py" in SOURCES["modelopt_weights"]
    for a, b in zip(ranks["qwen"], ranks["llama"], strict=True):
        assert sorted(a) == sorted(b)
        assert all(a[k].dtype == b[k].dtype and torch.equal(a[k].float(), b[k].float()) for k in a)


# --- TensorRT-LLM 1.2.1 tensorrt_llm/models/qwen/config.py: QWenConfig.from_hugging_face(...) arguments and to_dict --
def qwen_config_oracle(hf: dict, *, tp: int) -> dict:
    """What `QWenConfig.from_hugging_face(hf).to_dict()` holds for a dense Qwen2/Qwen3 (read from config.py: the
    `cls(...)` call and `to_dict`; fields left at PretrainedConfig defaults omitted), plus the mapping."""
    qwen3 = hf["model_type"] == "qwen3"
    return {
        "architecture": hf["architectures"][0], "dtype": "bfloat16", "num_hidden_layers": hf["num_hidden_layers"],
        "num_attention_heads": hf["num_attention_heads"], "hidden_size": hf["hidden_size"],
        "intermediate_size": hf["intermediate_size"], "num_key_value_heads": hf["num_key_value_heads"],
        "head_size": hf["head_dim"], "vocab_size": hf["vocab_size"], "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": hf["max_position_embeddings"], "hidden_act": hf["hidden_act"],
        "norm_epsilon": hf["rms_norm_eps"], "attn_bias": not qwen3, "rotary_base": hf["rope_theta"],
        "rotary_scaling": hf.get("rope_scaling"), "disable_weight_only_quant_plugin": False, "seq_length": 8192,
        "use_logn_attn": False, "qwen_type": hf["model_type"], "moe_intermediate_size": 0,
        "moe_shared_expert_intermediate_size": 0, "num_labels": 1, "mlp_bias": False,
        "tie_word_embeddings": hf["tie_word_embeddings"],
        "moe": {"num_experts": 0, "top_k": 0, "normalization_mode": 0},  # MoeConfig(0, 0, NONE).validate()
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
    }


def qwen_rank_tensors(hf: dict, *, tp: int, qk_norm: bool, attn_bias: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor QWenForCausalLM (models/qwen/model.py; names as models/qwen/convert.py writes them) loads from one
    rank of an FP8 + FP8-KV checkpoint: name -> (shape, safetensors dtype). ColumnLinear shards rows, RowLinear
    columns; the embedding is vocab-sharded (use_parallel_embedding, dim 0); the qk layernorms are per head."""
    h, hs, inter = hf["hidden_size"], hf["head_dim"], hf["intermediate_size"]
    qkv = (hf["num_attention_heads"] + 2 * hf["num_key_value_heads"]) // tp * hs
    out = {"transformer.vocab_embedding.weight": ((hf["vocab_size"] // tp, h), "BF16"),
           "transformer.ln_f.weight": ((h,), "BF16"), "lm_head.weight": ((hf["vocab_size"] // tp, h), "BF16")}
    linears = {"attention.qkv": (qkv, h), "attention.dense": (h, hf["num_attention_heads"] // tp * hs),
               "mlp.fc": (inter // tp, h), "mlp.gate": (inter // tp, h), "mlp.proj": (h, inter // tp)}
    for i in range(hf["num_hidden_layers"]):
        p = f"transformer.layers.{i}."
        out[p + "input_layernorm.weight"] = ((h,), "BF16")
        out[p + "post_layernorm.weight"] = ((h,), "BF16")
        out[p + "attention.kv_cache_scaling_factor"] = ((1,), "F32")
        for name, shape in linears.items():
            out[p + name + ".weight"] = (shape, "F8_E4M3")
            out[p + name + ".weights_scaling_factor"] = ((1,), "F32")
            out[p + name + ".activation_scaling_factor"] = ((1,), "F32")
        if attn_bias:
            out[p + "attention.qkv.bias"] = ((qkv,), "BF16")
        if qk_norm:
            out[p + "attention.q_layernorm.weight"] = ((hs,), "BF16")
            out[p + "attention.k_layernorm.weight"] = ((hs,), "BF16")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(QWEN_CLASSES))
def test_qwen_engine_checkpoint_is_what_qwen_for_causal_lm_loads(family, tmp_path):
    """The pipeline's export (pipeline/stages/calibrate/export.py) of a Qwen2/Qwen3 at tp=2: the config holds every
    QWenConfig field with the value from_hugging_face derives, each rank the names, shapes and dtypes
    QWenForCausalLM loads; the round trip rebuilds the transformers class within the exact tier."""
    import torch
    from safetensors import safe_open

    from pipeline.stages.calibrate import export, quality, recipes
    from pipeline.stages.calibrate.checkpoint import load_checkpoint_as_hf

    assert "models/qwen/config.py" in SOURCES["qwen_config"] and "models/qwen/model.py" in SOURCES["qwen_model"]
    assert "models/qwen/convert.py" in SOURCES["qwen_convert"]
    model = _qwen(family)
    hf = model.config.to_dict()
    exported = export.export(model, tmp_path, tp=2, pp=1, dtype=torch.bfloat16)
    ckpt = json.loads((tmp_path / "config.json").read_text())
    for key, want in qwen_config_oracle(hf, tp=2).items():
        assert ckpt[key] == want, key
    assert ckpt["quantization"]["quant_algo"] == "FP8" and ckpt["quantization"]["kv_cache_quant_algo"] == "FP8"
    fam = FAMILIES[family]
    want = qwen_rank_tensors(hf, tp=2, qk_norm=fam.qk_norm, attn_bias=fam.attn_bias)
    for rank in range(2):
        with safe_open(str(tmp_path / f"rank{rank}.safetensors"), "pt") as f:
            got = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
        assert {k: v for k, v in got.items() if k in want} == want
        assert set(got) - set(want) <= {f"transformer.layers.{i}.attention.{kv}_cache_scaling_factor"
                                        for i in range(TINY["num_hidden_layers"]) for kv in "kv"}
    loaded = load_checkpoint_as_hf(tmp_path)
    assert type(loaded).__name__ == QWEN_CLASSES[family][1]
    samples = [list(range(3, 40)), list(range(50, 90))]
    with mtq_off(exported, recipes.KV_QUANTIZERS_OFF):
        rt = quality.roundtrip(loaded, exported.float(), samples, torch.device("cpu"), tier="exact")
    assert rt.passed, rt


def mtq_off(model, cfg):
    import modelopt.torch.quantization as mtq

    return mtq.set_quantizer_by_cfg_context(model, cfg)


@pytest.mark.parametrize("model", ["mixtral-8x7b"])
def test_build_refuses_families_calibrate_cannot_round_trip_before_download(model, tmp_path, monkeypatch):
    """No byte is downloaded for a family the calibrate stage cannot load back: build fails at its check stage
    (every registry family loads today, so the loadable set is narrowed here)."""
    from pipeline.core.errors import CalibrationError
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.build import build
    from pipeline.stages.calibrate import stage as calibrate_stage

    monkeypatch.setattr(calibrate_stage, "SUPPORTED_ARCHITECTURES", ("LlamaForCausalLM", "MistralForCausalLM"))
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model=model, precision="fp8", runtime="pytorch", target="reference", tp=2)
    with pytest.raises(CalibrationError, match="is planned and checked .* load LlamaForCausalLM, "
                                               "MistralForCausalLM only") as info:
        build(spec, progress=None)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))
