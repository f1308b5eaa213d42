"""The calibrate exporters: what each checkpoint format (`pipeline.core.runtimes.CheckpointFormat`) runs to write,
check and re-load a checkpoint, chosen once by the format's name.

torch and the exporters load when a method runs: choosing an exporter stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pipeline.core.runtimes import CheckpointFormat
from pipeline.stages.calibrate.export import copy_tokenizer as _copy_tokenizer


class Exporter(Protocol):
    """Export a calibrated model in one checkpoint format, and load the result back."""

    def export(self, model: Any, out: Path, *, tp: int, pp: int, dtype: str, exact: bool, quant_algo: str | None,
               kv_algo: str | None) -> tuple[Any, dict[str, Any]]:
        """Export `model` (weights in `dtype`) into `out` and check it: (the fake-quant model the export corresponds
        to, the manifest's `checkpoint` fields). `exact=False`: too large for an exact float32 reference copy."""
        ...

    def load(self, checkpoint: Path) -> Any:
        """The exported checkpoint as a transformers model on CPU (the round-trip check)."""
        ...


class TrtllmExporter:
    """TensorRT-LLM checkpoint: config.json + rank<N>.safetensors per TP×PP rank."""

    def export(self, model: Any, out: Path, *, tp: int, pp: int, dtype: str, exact: bool, quant_algo: str | None,
               kv_algo: str | None) -> tuple[Any, dict[str, Any]]:
        import torch

        from pipeline.stages.calibrate import export as exp

        exported = exp.export(model, out, tp=tp, pp=pp, dtype=getattr(torch, dtype))
        cfg = exp.check(out, quant_algo=quant_algo, kv_algo=kv_algo, tp=tp, pp=pp)
        return exported, {key: cfg.get(key) for key in ("quantization", "mapping", "dtype")}

    def load(self, checkpoint: Path) -> Any:
        from pipeline.stages.calibrate.checkpoint import load_checkpoint_as_hf

        return load_checkpoint_as_hf(checkpoint)


class HfExporter:
    """Unified Hugging Face checkpoint (ModelOpt `export_hf_checkpoint`): unsharded."""

    def export(self, model: Any, out: Path, *, tp: int, pp: int, dtype: str, exact: bool, quant_algo: str | None,
               kv_algo: str | None) -> tuple[Any, dict[str, Any]]:
        import torch

        from pipeline.stages.calibrate import export_hf

        exported = export_hf.export(model, out, dtype=getattr(torch, dtype), exact=exact)
        hf_q = export_hf.check(out, quant_algo=quant_algo, kv_algo=kv_algo, dtype=dtype)
        return exported, {"format": "hf", "hf_quant_config": hf_q, "dtype": dtype}

    def load(self, checkpoint: Path) -> Any:
        from pipeline.stages.calibrate.hf_checkpoint import load_hf_checkpoint

        return load_hf_checkpoint(checkpoint)


EXPORTERS: dict[str, Exporter] = {"trtllm": TrtllmExporter(), "hf": HfExporter()}


def exporter(fmt: CheckpointFormat) -> Exporter:
    """The exporter of `fmt`."""
    return EXPORTERS[fmt.name]


def copy_tokenizer(fmt: CheckpointFormat, src: Path, checkpoint: Path) -> list[str]:
    """Copy the tokenizer files of the HF model dir `src` to where `fmt` keeps them in `checkpoint`; the names."""
    return _copy_tokenizer(src, fmt.tokenizer_dir(checkpoint), needed_by=fmt.tokenizer_needed_by)
