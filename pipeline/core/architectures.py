"""Model families as data: what transformers, ModelOpt 0.37 and TensorRT-LLM 1.2.1 call each one and expect of it.

One `Family` per supported decoder (Llama, Qwen2/2.5, Qwen3, Mistral, Mixtral). Every fact names the upstream file
it was read from (`SOURCES`); the tests are keyed by those files. NVIDIA/TensorRT-LLM has no tagged 1.2.1 copy in
the code index: the files were read at the stored versions named in `SOURCES`, whose model code is the 1.2-era
engine path (`tensorrt_llm/models/`, removed from main after 1.2).

- transformers 4.57: the `architectures[0]` class and `model_type` of the Hub `config.json`.
- ModelOpt 0.37 (`modelopt/torch/export/model_utils.py` MODEL_NAME_TO_TYPE, matched case-insensitively against
  the class name): the `decoder_type` of its exporters ("llama" for Llama/Mistral/Mixtral, "qwen" for Qwen2/3).
  Its TensorRT-LLM exporter (`tensorrt_llm_utils.py` convert_to_tensorrt_llm_config) writes the checkpoint config
  through `MODEL_MAP[architecture].config_class.from_hugging_face` when tensorrt_llm imports, else by hand for
  decoder types gpt/gemma/llama/... only: "qwen" raises NotImplementedError there. Its weight conversion
  (`layer_utils.py`, `model_config_export.py`) treats "qwen" like "llama" for a dense decoder ("qwen" differs only
  in MoE layers and Qwen-1's implicit activation), q/k/v biases and per-head q/k norms included; so a dense Qwen
  engine checkpoint is exported with the "llama" decoder (`trtllm_export_decoder`) and its config completed with the
  QWenConfig fields (`trtllm_config_fields`). MoE experts are exported TP-sharded (`mapping.moe_tp_size = tp_size`,
  `moe_ep_size = 1`) with `moe: {num_experts, top_k, normalization_mode: 1}` (RENORMALIZE).
- TensorRT-LLM 1.2.1 engine path (`tensorrt_llm/models/__init__.py` MODEL_MAP): Llama/Mistral/Mixtral ->
  LLaMAForCausalLM (`models/llama/config.py` LLaMAConfig: Mixtral adds `moe` from num_local_experts /
  num_experts_per_tok with RENORMALIZE and hidden_act swiglu); Qwen2/Qwen3 -> QWenForCausalLM
  (`models/qwen/config.py` QWenConfig: `qwen_type` = HF model_type, attn_bias True for qwen2, False for qwen3;
  `models/qwen/model.py`: q/k layernorms for qwen3, `attention.qkv.bias` when attn_bias; `models/qwen/convert.py`:
  the tensor names `attention.q_layernorm` / `attention.k_layernorm`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Where each fact was read (NVIDIA/TensorRT-LLM at the stored commit named; ModelOpt from the installed 0.37.0).
SOURCES = {
    "model_map": "NVIDIA/TensorRT-LLM tensorrt_llm/models/__init__.py (MODEL_MAP)",
    "llama_config": "NVIDIA/TensorRT-LLM tensorrt_llm/models/llama/config.py @ 04100fd0 (LLaMAConfig)",
    "qwen_config": "NVIDIA/TensorRT-LLM tensorrt_llm/models/qwen/config.py @ 0428c188 (QWenConfig)",
    "moe": "NVIDIA/TensorRT-LLM tensorrt_llm/layers/moe.py @ 03961722 (MoeConfig, MixtureOfExperts)",
    "llama_convert": "NVIDIA/TensorRT-LLM tensorrt_llm/models/llama/convert.py @ 04a2cacb (MoE weights: "
                     "block_sparse_moe w3w1 -> mlp.fc, w2 -> mlp.proj, gate -> mlp.router)",
    "mapping": "NVIDIA/TensorRT-LLM tensorrt_llm/mapping.py @ 05ebebb2 (Mapping)",
    "engine_quant": "NVIDIA/TensorRT-LLM docs/source/legacy/reference/precision.md @ 1690890e (TensorRT backend "
                    "matrix)",
    "qwen_model": "NVIDIA/TensorRT-LLM tensorrt_llm/models/qwen/model.py @ 04a2cacb (QWenDecoderLayer: Attention "
                  "bias=attn_bias, dense_bias=False; QWenForCausalLM: lm_head ColumnLinear)",
    "qwen_convert": "NVIDIA/TensorRT-LLM tensorrt_llm/models/qwen/convert.py @ 0428c188 (qwen3 q_norm/k_norm -> "
                    "attention.q_layernorm/k_layernorm; tied lm_head written as the embedding)",
    "qwen_readme": "NVIDIA/TensorRT-LLM examples/models/core/qwen/README.md @ 000a01de (Support Matrix)",
    "pytorch_quant": "NVIDIA/TensorRT-LLM docs/source/features/quantization.md @ f53fb4c8 (Model Supported Matrix)",
    "modelopt_type": "modelopt 0.37.0 modelopt/torch/export/model_utils.py (MODEL_NAME_TO_TYPE)",
    "modelopt_trtllm": "modelopt 0.37.0 modelopt/torch/export/tensorrt_llm_utils.py (convert_to_tensorrt_llm_config)",
    "modelopt_weights": "modelopt 0.37.0 modelopt/torch/export/layer_utils.py, model_config_export.py (decoder_type)",
}

ALL_PRECISIONS = frozenset({"bf16", "fp16", "fp8", "int4_awq", "w4a8_awq", "int8_sq"})


@dataclass(frozen=True)
class Support:
    """Precisions one runtime supports for a family, and the source that says so."""

    precisions: frozenset[str]
    source: str


@dataclass(frozen=True)
class Family:
    """One decoder family: its names in each tool and what 1.2.1 supports for it per runtime."""

    name: str
    hf_architecture: str  # transformers class (config.json `architectures[0]`)
    hf_model_type: str
    trtllm_class: str  # MODEL_MAP value the checkpoint `architecture` maps to (engine path)
    modelopt_decoder_type: str
    attn_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3)
    moe: bool = False
    qwen_type: str | None = None  # QWenConfig.qwen_type
    # ModelOpt decoder type whose weight conversion writes the TensorRT-LLM checkpoint (its manual config writer
    # knows "llama"; a dense Qwen converts identically under it, see the module docstring)
    trtllm_export_decoder: str = "llama"
    engine: Support = field(default_factory=lambda: Support(ALL_PRECISIONS, SOURCES["engine_quant"]))
    pytorch: Support = field(default_factory=lambda: Support(ALL_PRECISIONS, SOURCES["pytorch_quant"]))


_16BIT = frozenset({"bf16", "fp16"})

FAMILIES: dict[str, Family] = {
    f.name: f for f in (
        # precision.md: LLaMA FP8, W8A8 SQ, W4A16 AWQ (W4A8 AWQ: this pipeline's tested Llama recipe, built with
        # fp16 activations as upstream's W4A8-AWQ recipes: trtllm_rules.COMPUTE_DTYPE);
        # quantization.md: LLaMA / LLaMA-v2 / LLaMA 3 rows FP8, W4A8 AWQ, W4A16 AWQ.
        Family("llama", "LlamaForCausalLM", "llama", "LLaMAForCausalLM", "llama",
               engine=Support(ALL_PRECISIONS, SOURCES["engine_quant"] + ": LLaMA row"),
               pytorch=Support(_16BIT | {"fp8", "int4_awq", "w4a8_awq"}, SOURCES["pytorch_quant"] + ": LLaMA rows")),
        Family("mistral", "MistralForCausalLM", "mistral", "LLaMAForCausalLM", "llama",
               engine=Support(_16BIT | {"fp8", "int8_sq", "int4_awq"}, SOURCES["engine_quant"] + ": Mistral row"),
               pytorch=Support(_16BIT | {"fp8", "int4_awq"}, SOURCES["pytorch_quant"] + ": Mistral row")),
        Family("mixtral", "MixtralForCausalLM", "mixtral", "LLaMAForCausalLM", "llama", moe=True,
               engine=Support(_16BIT | {"fp8"}, SOURCES["engine_quant"] + ": Mixtral row (no W8A8 SQ, no W4A16 AWQ)"),
               pytorch=Support(_16BIT | {"fp8"}, SOURCES["pytorch_quant"] + ": Mixtral row (FP8, NVFP4)")),
        Family("qwen2", "Qwen2ForCausalLM", "qwen2", "QWenForCausalLM", "qwen", attn_bias=True, qwen_type="qwen2",
               engine=Support(_16BIT | {"fp8", "int8_sq", "int4_awq"}, SOURCES["qwen_readme"] + ": Qwen2.5 rows"),
               pytorch=Support(_16BIT | {"fp8", "int4_awq", "w4a8_awq"}, SOURCES["pytorch_quant"] + ": Qwen-2/2.5 row")),
        Family("qwen3", "Qwen3ForCausalLM", "qwen3", "QWenForCausalLM", "qwen", qk_norm=True, qwen_type="qwen3",
               engine=Support(_16BIT | {"fp8"}, SOURCES["qwen_readme"] + ": Qwen3-32B row (no AWQ, no SQ)"),
               pytorch=Support(_16BIT | {"fp8", "int4_awq"}, SOURCES["pytorch_quant"] + ": Qwen-3 row")),
    )
}
BY_HF_ARCHITECTURE = {f.hf_architecture: f for f in FAMILIES.values()}


def family(name: str) -> Family:
    """The family called `name` (a registry `architecture.family`)."""
    return FAMILIES[name]


def support_blocker(name: str, *, pytorch_backend: bool, precision: str) -> str | None:
    """Why TensorRT-LLM 1.2.1 does not run `precision` for this family on `runtime`, with the source; None when it
    does. KV-cache dtypes are runtime-wide (FP8 KV is listed for every family on both runtimes)."""
    fam = FAMILIES[name]
    support, runtime = (fam.pytorch, "pytorch") if pytorch_backend else (fam.engine, "engine")
    if precision in support.precisions:
        return None
    ok = ", ".join(p for p in ("bf16", "fp16", "fp8", "int4_awq", "w4a8_awq", "int8_sq") if p in support.precisions)
    return (f"{fam.hf_architecture} has no {precision} on the {runtime} runtime in TensorRT-LLM 1.2.1 "
            f"(source: {support.source}); supported there: {ok}")


def checkpoint_fields(arch: Any) -> dict[str, Any]:
    """The family-specific fields of a TensorRT-LLM 1.2.1 checkpoint `config.json` for `arch` (an
    `registry.Architecture`): what LLaMAConfig / QWenConfig `to_dict` adds beyond PretrainedConfig. Llama adds
    nothing the pipeline checks; the checkpoint `architecture` is the HF class name (MODEL_MAP's key)."""
    fam = FAMILIES[arch.family]
    out: dict[str, Any] = {"architecture": fam.hf_architecture}
    if fam.qwen_type:
        out.update(qwen_type=fam.qwen_type, attn_bias=fam.attn_bias)
    if fam.moe:
        out["hidden_act"] = "swiglu"  # LLaMAConfig.from_hugging_face: mixtral's gated activation made explicit
        out["moe"] = {"num_experts": arch.num_experts, "top_k": arch.experts_per_token,
                      "normalization_mode": 1}  # MoeConfig.ExpertScaleNormalizationMode.RENORMALIZE
    return out


def moe_checkpoint_tensors(arch: Any, *, moe_tp: int) -> dict[str, tuple[int, ...]]:
    """Per-rank shapes of one MoE layer's weights in a TensorRT-LLM 1.2.1 checkpoint (`layers/moe.py`
    MixtureOfExperts, names as `models/llama/convert.py` writes them): the router replicated in float32
    ([experts, hidden]; tp_size 1), `fc` = [w3; w1] per expert ([experts, 2 x FFN / moe_tp, hidden]; gated
    activation fused horizontally), `proj` = w2 ([experts, hidden, FFN / moe_tp])."""
    e, h, i = arch.num_experts, arch.hidden_size, arch.intermediate_size // moe_tp
    return {"mlp.router.weight": (e, h), "mlp.fc.weight": (e, 2 * i, h), "mlp.proj.weight": (e, h, i)}


def trtllm_config_fields(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The fields TensorRT-LLM 1.2.1's config class of this model's family writes beyond what ModelOpt 0.37's manual
    exporter writes (`architecture`, sizes, `norm_epsilon`, `rotary_base`, `mapping`, `quantization`, ...), derived
    from the Hub `config.json` as `QWenConfig.from_hugging_face` derives them and serialized as its `to_dict` does
    (dense Qwen2/Qwen3: no MoE, no multimodal types). Empty for the Llama-class families: LLaMAConfig's own fields
    are what the manual exporter writes.

    Its numbers are taken as `registry.hub_architecture` checked them (`rope_theta`, `tie_word_embeddings`);
    `seq_length` and `use_logn_attn` are checked here.

    Raises:
        UnsupportedArchitecture: the config's class is not one of the families.
        UnusableConfigField: `seq_length` is not a positive integer or `use_logn_attn` not a boolean.
    """
    fam = _family_of(hf_config)
    if not fam.qwen_type:
        return {}
    seq_length, logn = _or(hf_config.get("seq_length"), 8192), _or(hf_config.get("use_logn_attn"), False)
    if not _count(seq_length):
        raise UnusableConfigField(f"config.json field 'seq_length'={seq_length!r}: expected a positive integer")
    if not isinstance(logn, bool):
        raise UnusableConfigField(f"config.json field 'use_logn_attn'={logn!r}: expected true or false")
    return {
        "qwen_type": hf_config.get("model_type", fam.qwen_type),
        "attn_bias": fam.attn_bias,  # qwen3: False, every other qwen_type: True
        "mlp_bias": False,
        "rotary_base": float(hf_config.get("rope_theta", 100000.0)),
        "rotary_scaling": hf_config.get("rope_scaling"),
        "disable_weight_only_quant_plugin": False,
        "use_logn_attn": logn,
        "seq_length": seq_length,
        "moe": {"num_experts": 0, "top_k": 0, "normalization_mode": 0},  # MoeConfig(0, 0, NONE)
        "moe_intermediate_size": 0,
        "moe_shared_expert_intermediate_size": 0,
        "num_labels": 1,
        "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", False)),
    }


def _family_of(config: dict[str, Any]) -> Family:
    archs = config.get("architectures") or []
    fam = BY_HF_ARCHITECTURE.get(archs[0]) if isinstance(archs, list) and archs else None
    if fam is None:
        known = ", ".join(sorted(BY_HF_ARCHITECTURE))
        raise UnsupportedArchitecture(f"architecture {archs or config.get('model_type')!r} is not supported "
                                      f"(supported: {known})")
    return fam


def hf_config_fields(arch: Any) -> dict[str, Any]:
    """The transformers `config.json` fields of `arch` (an `registry.Architecture`) for its family's class."""
    fam = FAMILIES[arch.family]
    cfg: dict[str, Any] = {
        "architectures": [fam.hf_architecture], "model_type": fam.hf_model_type, "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size, "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings, "rope_theta": arch.rope_theta,
    }
    if fam.name in ("mistral", "mixtral", "qwen2", "qwen3"):
        cfg["sliding_window"] = arch.sliding_window
    if fam.name in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = arch.sliding_window is not None
    if fam.moe:
        cfg.update(num_local_experts=arch.num_experts, num_experts_per_tok=arch.experts_per_token)
    return cfg


class UnsupportedArchitecture(ValueError):
    """A config.json whose class or fields no family here covers."""


class UnusableConfigField(UnsupportedArchitecture):
    """A config.json number is missing, of the wrong type or out of range (the message names the field)."""


# `registry.Architecture` field -> its transformers `config.json` key, where the two differ.
HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
           "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"}


def _count(value: Any) -> bool:
    """Whether `value` is a JSON integer above 0 (not a bool, a float or a string)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _effective_sliding_window(config: dict[str, Any]) -> Any:
    """The attention window the model really uses: Qwen configs carry `sliding_window` with
    `use_sliding_window: false` (off); Mistral/Mixtral use it whenever it is set (null on v0.3 / Mixtral); a window
    that covers every position is none. Anything else is passed on as written, for `Architecture` to judge."""
    window, positions = config.get("sliding_window"), config.get("max_position_embeddings")
    if config.get("use_sliding_window") is False or window is None:
        return None
    return None if _count(window) and _count(positions) and window >= positions else window


def architecture_fields(config: dict[str, Any]) -> dict[str, Any]:
    """`registry.Architecture` fields from a Hub `config.json` (transformers 4.57 names and defaults), the values as
    written: `registry.hub_architecture` checks their types and ranges (and derives an absent `head_dim`).

    Raises:
        UnsupportedArchitecture: the class is not one of the families.
        UnusableConfigField: a required number is missing.
    """
    fam = _family_of(config)
    try:
        heads, hidden = config["num_attention_heads"], config["hidden_size"]
        out: dict[str, Any] = {
            "family": fam.name, "num_layers": config["num_hidden_layers"], "hidden_size": hidden,
            "num_heads": heads, "num_kv_heads": _or(config.get("num_key_value_heads"), heads),
            "intermediate_size": config["intermediate_size"], "vocab_size": config["vocab_size"],
            "max_position_embeddings": config["max_position_embeddings"],
            "tie_word_embeddings": _or(config.get("tie_word_embeddings"), False),
            "rope_theta": _or(config.get("rope_theta"), 10000.0),
            "head_dim": config.get("head_dim"), "sliding_window": _effective_sliding_window(config),
        }
        if fam.moe:
            out.update(num_experts=config["num_local_experts"], experts_per_token=config["num_experts_per_tok"])
    except KeyError as exc:
        raise UnusableConfigField(f"{fam.hf_architecture} config.json lacks a usable {exc}") from None
    return out


def _or(value: Any, default: Any) -> Any:
    """`value`, or `default` where the config leaves it out or null (transformers' defaults)."""
    return default if value is None else value
