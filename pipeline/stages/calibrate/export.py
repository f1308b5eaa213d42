"""TensorRT-LLM checkpoint export (ModelOpt's legacy exporter), its structural checks, and the tokenizer copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.core.architectures import BY_HF_ARCHITECTURE as FAMILIES_BY_CLASS
from pipeline.core.architectures import trtllm_config_fields
from pipeline.core.errors import CalibrationError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
)


def export(model, out_dir: Path, *, tp: int, pp: int, dtype) -> Any:
    """Export `model` in place (the exporter mutates its input) and return it.

    The mutated model is the fake-quant model exactly as exported (fused q/k/v and gate/up share scales, pre-quant
    scales rounded to the export dtype, FP8 weights and activation amaxes as the checkpoint's codes and scales give
    them back), which is what the quality gate and the round-trip check compare against.
    Exporting in place keeps a single copy of the weights on the devices (no deep copy: 70B is 131 GiB in bf16).
    The weights go through the family's `trtllm_export_decoder`; the config is then completed with the fields the
    family's TensorRT-LLM config class writes (`complete_config`).
    """
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    hf_config = model.config.to_dict()
    try:
        decoder = FAMILIES_BY_CLASS[hf_config["architectures"][0]].trtllm_export_decoder
    except (KeyError, IndexError, TypeError):
        raise CalibrationError(f"model class {hf_config.get('architectures')} has no family adapter; "
                               f"supported: {', '.join(sorted(FAMILIES_BY_CLASS))}") from None
    try:
        with torch.inference_mode():
            export_tensorrt_llm_checkpoint(
                model,
                decoder,
                dtype,
                export_dir=out_dir,
                inference_tensor_parallel=tp,
                inference_pipeline_parallel=pp,
            )
    except (AssertionError, NotImplementedError, ValueError, RuntimeError) as exc:
        raise CalibrationError(
            f"ModelOpt export failed for tp={tp} pp={pp}: {exc}; check the model and parallelism"
        ) from None
    complete_config(out_dir, hf_config)
    snap_prequant_scales(model, dtype)
    share_expert_input_amax(model)
    snap_activation_amax(model)
    snap_fp8_weights(model)
    return model


def complete_config(out_dir: Path, hf_config: dict[str, Any]) -> None:
    """Add to the written `config.json` the family's TensorRT-LLM config-class fields it lacks (QWenConfig's for
    Qwen; none for the Llama-class families). Fields already written, e.g. by ModelOpt through TensorRT-LLM's own
    config class where tensorrt_llm is installed, are kept."""
    path = out_dir / "config.json"
    if not path.is_file():
        return  # `check` names the missing config
    cfg = json.loads(path.read_text())
    missing = {k: v for k, v in trtllm_config_fields(hf_config).items() if k not in cfg}
    if missing:
        path.write_text(json.dumps({**cfg, **missing}, indent=4))


def snap_prequant_scales(model, dtype) -> None:
    """Round AWQ/SmoothQuant pre-quant scales to the export dtype, as they are stored in the checkpoint."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    for mod in model.modules():
        pqs = getattr(mod, "_pre_quant_scale", None) if isinstance(mod, TensorQuantizer) else None
        if pqs is not None:
            pqs.data = pqs.data.to(dtype).to(pqs.dtype)


def share_expert_input_amax(model) -> None:
    """Give every expert of a MoE block the largest input amax of its experts, per linear (w1, w2, w3): the
    checkpoint stores one activation scale for all experts (ModelOpt 0.37 `layer_utils._build_stacked_linear`: "the
    moe plugin only supports a single activation scaling factor"), so the fake-quant model computes what it holds."""
    import torch

    for block in model.modules():
        experts = getattr(block, "experts", None)
        if not isinstance(experts, torch.nn.ModuleList) or not hasattr(block, "gate"):
            continue
        for name, _ in experts[0].named_children():
            quantizers = [getattr(getattr(e, name), "input_quantizer", None) for e in experts]
            live = [q for q in quantizers if q is not None and q.is_enabled and q.amax is not None]
            if len(live) != len(experts):
                continue
            top = torch.stack([q.amax.float().reshape(()) for q in live]).max()
            for q in live:
                q.amax = top.to(q.amax.dtype).reshape(q.amax.shape)


def snap_activation_amax(model) -> None:
    """Give every per-tensor input quantizer the amax its checkpoint scale gives back: the checkpoint stores
    `amax / maxbound` (float32, ModelOpt 0.37 `quant_utils.get_scaling_factor`) and its reader rebuilds
    `scale * maxbound`: for about one FP8 amax in ten that is a float32 neighbour of the calibrated one, and for one
    in twenty its `maxbound / amax` differs, which moves some activations to the neighbouring code."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    for mod in model.modules():
        q = getattr(mod, "input_quantizer", None)
        if not isinstance(q, TensorQuantizer) or not q.is_enabled or q.block_sizes:
            continue
        amax = getattr(q, "amax", None)
        if amax is not None and amax.numel() == 1:
            q.amax = ((amax.float() / q.maxbound) * q.maxbound).to(amax.dtype)


def snap_fp8_weights(model) -> None:
    """Set per-tensor FP8 weights to the values the checkpoint holds: ModelOpt 0.37 stores the E4M3 cast of
    `w / scale` (`quant_utils.to_quantized_weight`: round half to even) with `scale = amax / 448`, which its reader
    and the engine dequantize as `code * scale`. The fake quantizer computes `w * (448 / amax)`, which lands a weight
    lying exactly between two FP8 values on either side (a trained model whose amax has few significant bits has
    hundreds of such ties per layer), and dequantizes with `1 / (448 / amax)`, one float32 ulp off `scale` for about
    a third of all amaxes; FP8 activation rounding downstream amplifies that ulp (a random llama-1b-shaped model:
    7 % logit error after 4 layers). Float32 weights (CPU calibration) take `code * scale` exactly and their
    quantizer is switched off; 16-bit ones cannot hold it, so they are snapped to the FP8 grid and keep it."""
    import torch
    from modelopt.torch.quantization.nn import TensorQuantizer

    for mod in model.modules():
        q = getattr(mod, "weight_quantizer", None)
        if not isinstance(q, TensorQuantizer) or not q.is_enabled or q.num_bits != (4, 3) or q.block_sizes:
            continue
        amax = getattr(q, "amax", None)
        if amax is None or amax.numel() != 1:
            continue
        w = mod.weight
        scale = (amax.float() / q.maxbound).to(w.device)
        w.data = ((w.data.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(w.dtype)
        if w.dtype == torch.float32:
            q.disable()


def check(out_dir: Path, *, quant_algo: str | None, kv_algo: str | None, tp: int, pp: int) -> dict[str, Any]:
    """Check the written config (quant algos, mapping) and that rank files = tp*pp; return the config.

    Raises:
        CalibrationError: the export does not match the recipe.
    """
    path = out_dir / "config.json"
    if not path.is_file():
        raise CalibrationError("ModelOpt export wrote no config.json; see the log above")
    cfg = json.loads(path.read_text())
    q = cfg.get("quantization") or {}
    got = (q.get("quant_algo"), q.get("kv_cache_quant_algo"))
    if got != (quant_algo, kv_algo):
        raise CalibrationError(
            f"exported quant_algo/kv_cache_quant_algo {got} != expected {(quant_algo, kv_algo)}; "
            "the ModelOpt version or config is wrong (pin nvidia-modelopt~=0.37.0)"
        )
    m = cfg.get("mapping") or {}
    if (m.get("tp_size"), m.get("pp_size"), m.get("world_size")) != (tp, pp, tp * pp):
        raise CalibrationError(f"exported mapping {m} != tp={tp} pp={pp}; re-run with --force")
    ranks = sorted(p.name for p in out_dir.glob("rank*.safetensors"))
    want = sorted(f"rank{i}.safetensors" for i in range(tp * pp))
    if ranks != want:
        raise CalibrationError(f"export wrote {ranks}, expected {want} (tp*pp={tp * pp}); re-run with --force")
    return cfg


def copy_tokenizer(src: Path, dst: Path, *, needed_by: str = "the Triton repo") -> list[str]:
    """Copy the tokenizer (and generation config) files of a HF model dir into `dst`."""
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
        raise CalibrationError(f"{src} has no tokenizer.json or tokenizer.model; {needed_by} needs the tokenizer")
    return copied
