"""Unified Hugging Face checkpoint export (runtime pytorch): ModelOpt's `export_hf_checkpoint` and its checks.

The PyTorch backend of TensorRT-LLM 1.2.1 loads this directory as its `model`: `config.json`, `model*.safetensors`
in HF naming, `hf_quant_config.json` (read first by `tensorrt_llm/_torch/model_config.py`
`ModelConfig.from_pretrained`) and the tokenizer files at the root. It is never sharded: TP/PP are applied at load.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pipeline.core.errors import CalibrationError
from pipeline.stages.calibrate.export import copy_tokenizer as export_copy_tokenizer
from pipeline.stages.calibrate.export import snap_prequant_scales
from pipeline.stages.calibrate.hf_checkpoint import HF_QUANT_CONFIG, read_quant_config

# Tensors kept in float32 in the export (scales); every other float32 tensor is stored in the export dtype.
_FLOAT32_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")


def export(model, out_dir: Path, *, dtype, exact: bool = True) -> Any:
    """Export a copy of `model` with `dtype` weights; return the fake-quant reference the export corresponds to.

    `exact=False` (models too large for the round-trip check) keeps memory at one extra `dtype` copy: the
    exporter (which replaces the weights it packs, so the model no longer runs) gets a plain copy and `model`
    itself, its fused layers' scales unified, is the reference.

    ModelOpt quantizes weights in the dtype it is given, and in bf16 the scaled weights are rounded once more than
    the fake quantizers round them; so the export runs on a float32 copy holding `dtype`-rounded values and the
    unquantized tensors are then stored in `dtype` (exactly, they are representable). The reference goes through
    the same steps: fused layers' scales unified (ModelOpt's `requantize_resmooth_fused_llm_layers`), then every
    unquantized parameter and pre-quant scale rounded to `dtype`, kept in float32 with unrounded rotary frequencies:
    what the quality gate and the round-trip check compare against.
    """
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    if not exact:
        return _export_in_dtype(model, out_dir, dtype=dtype)
    prepared = copy.deepcopy(model).to(dtype).float()
    _restore_rotary(prepared, model)
    exported = copy.deepcopy(prepared)
    try:
        with torch.inference_mode():
            export_hf_checkpoint(exported, dtype=torch.float32, export_dir=out_dir)
    except (AssertionError, NotImplementedError, ValueError, RuntimeError, KeyError) as exc:
        raise CalibrationError(f"ModelOpt HF export failed: {exc}; check the model and precision") from None
    _store_in_dtype(out_dir, dtype)
    with torch.no_grad():
        requantize_resmooth_fused_llm_layers(prepared)
        quantized = {f"{n}.weight" for n, m in prepared.named_modules() if _quantizes_weight(m)}
        for name, p in prepared.named_parameters():
            if name not in quantized:
                p.data = p.data.to(dtype).float()
    snap_prequant_scales(prepared, dtype)
    return prepared


def _export_in_dtype(model, out_dir: Path, *, dtype) -> Any:
    """Export a `dtype` copy of `model`; unify `model`'s fused-layer scales as the export does; return `model`."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    exported = copy.deepcopy(model)
    try:
        with torch.inference_mode():
            export_hf_checkpoint(exported, dtype=dtype, export_dir=out_dir)
    except (AssertionError, NotImplementedError, ValueError, RuntimeError, KeyError) as exc:
        raise CalibrationError(f"ModelOpt HF export failed: {exc}; check the model and precision") from None
    del exported
    _store_in_dtype(out_dir, dtype)
    with torch.no_grad():
        requantize_resmooth_fused_llm_layers(model)
    snap_prequant_scales(model, dtype)
    return model


def _quantizes_weight(module) -> bool:
    wq = getattr(module, "weight_quantizer", None)
    return wq is not None and getattr(wq, "is_enabled", False)


def _store_in_dtype(out_dir: Path, dtype) -> None:
    """Rewrite the export's float32 tensors other than scales in `dtype`, and `config.json`'s dtype with them."""
    import torch
    from safetensors.torch import load_file, save_file

    name = str(dtype).removeprefix("torch.")
    for f in sorted(out_dir.glob("*.safetensors")):
        tensors = load_file(str(f))
        for key, t in tensors.items():
            if t.dtype == torch.float32 and not key.endswith(_FLOAT32_SUFFIXES):
                tensors[key] = t.to(dtype)
        save_file(tensors, str(f), metadata={"format": "pt"})
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = name
    cfg.pop("torch_dtype", None)
    cfg_path.write_text(json.dumps(cfg, indent=4) + "\n")


def _restore_rotary(reference, model) -> None:
    """Put back the float32 rotary frequencies the dtype round trip rounded (the loaded model computes its own)."""
    for name, buf in model.named_buffers():
        if name.endswith("inv_freq"):
            parent, _, leaf = name.rpartition(".")
            reference.get_submodule(parent).register_buffer(leaf, buf.clone(), persistent=False)


def check(out_dir: Path, *, quant_algo: str | None, kv_algo: str | None, dtype: str) -> dict[str, Any]:
    """Check `hf_quant_config.json` against the recipe and `config.json`'s dtype; return the quantization mapping.

    Raises:
        CalibrationError: the export does not match the recipe.
    """
    if not (out_dir / "config.json").is_file() or not (out_dir / HF_QUANT_CONFIG).is_file():
        raise CalibrationError(f"ModelOpt HF export wrote no config.json / {HF_QUANT_CONFIG}; see the log above")
    q = read_quant_config(out_dir)
    got = (q.get("quant_algo"), q.get("kv_cache_quant_algo"))
    if got != (quant_algo, kv_algo):
        raise CalibrationError(
            f"{HF_QUANT_CONFIG}: quant_algo/kv_cache_quant_algo {got} != expected {(quant_algo, kv_algo)}; "
            "the ModelOpt version or config is wrong (pin nvidia-modelopt~=0.37.0)"
        )
    cfg = json.loads((out_dir / "config.json").read_text())
    written = cfg.get("dtype") or cfg.get("torch_dtype")
    if written != dtype:
        raise CalibrationError(f"exported config.json dtype {written!r} != {dtype!r}; re-run with --force")
    return q


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer (and generation config) files next to the weights, where HF loaders look for them."""
    return export_copy_tokenizer(src, dst, needed_by="the PyTorch backend")
