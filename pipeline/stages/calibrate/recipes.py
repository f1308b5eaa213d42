"""Precision recipe -> ModelOpt 0.37 quantization config and the TensorRT-LLM quant algos the export must show."""

from __future__ import annotations

import copy
from typing import Any

from pipeline.core.trtllm_rules import KV_QUANT_ALGO, QUANT_ALGO

# precision -> ModelOpt config name (None: no weight/activation quantization)
MTQ_CONFIG = {
    "fp8": "FP8_DEFAULT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "bf16": None,
    "fp16": None,
}
AWQ = ("int4_awq", "w4a8_awq")
_KV_PATTERN = "*[kv]_bmm_quantizer"


def expected_algos(precision: str, kv: str) -> tuple[str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo) the exported config.json must carry."""
    return QUANT_ALGO[precision], KV_QUANT_ALGO[kv]


def recipe_name(precision: str, kv: str) -> str:
    parts = [MTQ_CONFIG[precision] or "NONE"]
    if KV_QUANT_ALGO[kv]:
        parts.append("FP8_KV_CFG" if kv == "fp8" else "INT8_KV(num_bits=8)")
    return "+".join(parts)


def quant_config(precision: str, kv: str, *, awq_block_size: int = 128) -> dict[str, Any] | None:
    """The `mtq.quantize` config for a recipe, or None when nothing is quantized (bf16/fp16 with a 16-bit KV)."""
    import modelopt.torch.quantization as mtq

    name = MTQ_CONFIG[precision]
    kv_algo = KV_QUANT_ALGO[kv]
    if name is None and kv_algo is None:
        return None
    if name is None:
        cfg: dict[str, Any] = {"quant_cfg": {"default": {"enable": False}}, "algorithm": "max"}
    else:
        cfg = copy.deepcopy(getattr(mtq, name))
    if precision in AWQ:
        wq = cfg["quant_cfg"]["*weight_quantizer"]
        (wq[0] if isinstance(wq, list) else wq)["block_sizes"][-1] = awq_block_size
    if kv == "fp8":
        # The calibrated FP8 KV config (not the fp8_cast preset: the legacy exporter writes kv_cache_quant_algo null).
        cfg["quant_cfg"].update({k: v for k, v in mtq.FP8_KV_CFG["quant_cfg"].items() if k != "default"})
    elif kv == "int8":
        cfg["quant_cfg"][_KV_PATTERN] = {"num_bits": 8, "axis": None, "enable": True}
    return cfg


KV_QUANTIZERS_OFF = {_KV_PATTERN: {"enable": False}}
