"""Read a ModelOpt unified Hugging Face checkpoint (runtime pytorch) back into its transformers class (for a
Mixtral export: per-expert `w1`/`w2`/`w3` with their own scales, router `gate` left unquantized).

`modelopt.torch.export.export_hf_checkpoint` writes `config.json` (with a `quantization_config` of
quant_method "modelopt", which transformers 4.57 has no quantizer for), `model*.safetensors` in HF naming and
`hf_quant_config.json` (`quantization.{quant_algo, kv_cache_quant_algo, group_size, exclude_modules}`, what
TensorRT-LLM's `ModelConfig.from_pretrained` reads first). Quantized linears carry `weight` (FP8 E4M3 or packed
INT4 in uint8), `weight_scale`, `weight_scale_2` (W4A8), `input_scale` and `pre_quant_scale` (AWQ); attention
projections carry the KV-cache `k_scale` / `v_scale`. This module dequantizes every linear with its own scales (the
arithmetic of `pipeline.stages.calibrate.checkpoint.dequant_linear`) and loads the stock class of the config's
`architectures` (Llama, Mistral, Qwen2, Qwen3: biases and q/k norms are plain tensors); activation quantization
is simulated with pre-hooks, the KV cache stays in the compute dtype.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.artifacts import read_config_json
from pipeline.core.safetensors_file import load_safetensors
from pipeline.stages.calibrate.checkpoint import (
    LOADABLE_ARCHITECTURES,
    CheckpointError,
    assemble_model,
    dequant_linear,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel

HF_QUANT_CONFIG = "hf_quant_config.json"
SUPPORTED_QUANT_ALGOS = (None, "FP8", "W4A16_AWQ", "W4A8_AWQ")
# HF export tensor suffix -> the TensorRT-LLM checkpoint name `dequant_linear` reads
_RENAME = {
    "weight": "weight",
    "weight_scale": "weights_scaling_factor",
    "weight_scale_2": "weights_scaling_factor_2",
    "input_scale": "activation_scaling_factor",
    "pre_quant_scale": "prequant_scaling_factor",
}
_KV_SCALES = ("k_scale", "v_scale")
_ACT_KIND: dict[str | None, str] = {"FP8": "fp8", "W4A8_AWQ": "fp8"}
_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors")  # a file name in the checkpoint directory


def read_quant_config(ckpt_dir: str | Path) -> dict[str, Any]:
    """`hf_quant_config.json`'s `quantization` mapping, checked to be one this loader supports.

    Raises:
        CheckpointError: the file is missing, not JSON, too large, or names an unsupported quant_algo.
    """
    path = Path(ckpt_dir) / HF_QUANT_CONFIG
    cfg = read_config_json(path, CheckpointError,
                           missing=f"{path} does not exist; point at a ModelOpt unified HF checkpoint",
                           fix="re-run `invoke calibrate --force`")
    q = cfg.get("quantization") if isinstance(cfg, dict) else None
    if not isinstance(q, dict):
        raise CheckpointError(f"{path}: no 'quantization' mapping; re-export with ModelOpt 0.37")
    if q.get("quant_algo") not in SUPPORTED_QUANT_ALGOS:
        raise CheckpointError(f"{path}: quant_algo {q.get('quant_algo')!r} is not supported; use one of "
                              f"{SUPPORTED_QUANT_ALGOS[1:]}")
    return q


def _hf_config(ckpt_dir: Path):
    from transformers import AutoConfig

    path = ckpt_dir / "config.json"
    cfg = read_config_json(path, CheckpointError, missing=f"{path} does not exist; point at a HF checkpoint",
                           fix="re-run `invoke calibrate --force`")
    if not set(cfg.get("architectures") or []) & set(LOADABLE_ARCHITECTURES):
        raise CheckpointError(f"{path}: architectures {cfg.get('architectures')} are not supported; loadable: "
                              f"{', '.join(LOADABLE_ARCHITECTURES)}")
    cfg = {k: v for k, v in cfg.items() if k not in ("quantization_config", "dtype", "torch_dtype")}
    return AutoConfig.for_model(**cfg)


def _tensors(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint (one `model.safetensors` or the shards its index lists)."""
    index = ckpt_dir / "model.safetensors.index.json"
    if index.is_file():
        fix = "re-export the checkpoint (invoke build --force calibrate)"
        weight_map = read_config_json(index, CheckpointError, missing=f"{index} is gone; {fix}", fix=fix).get(
            "weight_map")
        files = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        if not files or not all(isinstance(f, str) and _SHARD.fullmatch(f) for f in files):
            raise CheckpointError(f"{index}: 'weight_map' must map tensors to .safetensors files in that directory; "
                                  f"{fix}")
    else:
        files = ["model.safetensors"]
    missing = [f for f in files if not (ckpt_dir / f).is_file()]
    if missing:
        raise CheckpointError(f"{ckpt_dir}: missing {', '.join(missing)}; re-export the checkpoint")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_safetensors(ckpt_dir / f, fix="re-run `invoke build --force calibrate`"))
    return out


def read_hf_checkpoint(ckpt_dir: str | Path) -> tuple[Any, dict[str, torch.Tensor], dict[str, tuple]]:
    """(transformers config, dequantized float32 state dict, activation quantization per linear module).

    Raises:
        CheckpointError: a file or scale is missing or inconsistent with the quant config.
    """
    ckpt_dir = Path(ckpt_dir)
    algo = read_quant_config(ckpt_dir).get("quant_algo")
    hf_cfg = _hf_config(ckpt_dir)
    raw = _tensors(ckpt_dir)
    modules: dict[str, dict[str, torch.Tensor]] = {}
    sd: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        module, _, leaf = name.rpartition(".")
        if leaf in _KV_SCALES:
            continue  # the loaded model keeps its KV cache in the compute dtype
        if leaf in _RENAME and f"{module}.weight_scale" in raw:
            modules.setdefault(module, {})[_RENAME[leaf]] = t
        else:
            sd[name] = t.float()
    act_q: dict[str, tuple] = {}
    for module, tensors in modules.items():
        lin = dequant_linear(tensors, algo, module)
        sd[f"{module}.weight"] = lin.weight
        kind = _ACT_KIND.get(algo) if lin.act_scale is not None else None
        if kind or lin.prequant is not None:
            act_q[module] = (kind, lin.act_scale, lin.prequant)
    return hf_cfg, sd, act_q


def load_hf_checkpoint(ckpt_dir: str | Path, *, dtype: torch.dtype | None = None,
                       activation_quant: bool = True) -> PreTrainedModel:
    """Load a ModelOpt unified HF checkpoint dequantized as its transformers class (CPU).

    Args:
        ckpt_dir: the export directory (`config.json`, `hf_quant_config.json`, `model*.safetensors`).
        dtype: parameter dtype of the returned model (default float32).
        activation_quant: simulate FP8 activation quantization with forward pre-hooks.

    Raises:
        CheckpointError: the directory is not a complete, supported export.
    """
    import torch

    hf_cfg, sd, act_q = read_hf_checkpoint(ckpt_dir)
    return assemble_model(hf_cfg, sd, act_q, dtype=dtype or torch.float32, activation_quant=activation_quant,
                          source=ckpt_dir)
