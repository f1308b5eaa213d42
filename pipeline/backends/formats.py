"""The two calibrate export formats: the TensorRT-LLM checkpoint (engines and the engine-runtime CPU reference) and
the unified Hugging Face checkpoint (the PyTorch backend and its CPU reference).

The exporters, loaders and torch are imported inside the methods: asking a format for its directory name or key
factors stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrtllmCheckpoint:
    """TensorRT-LLM checkpoint: config.json + rank<N>.safetensors per TP×PP rank, the tokenizer in `tokenizer/`."""

    runtime: str = "engine"
    dirname: str = "checkpoint"
    sharded: bool = True
    export_label: str = "checkpoint export"
    key_factors: dict[str, str] = field(default_factory=dict)
    export_tier: str | None = None

    def tokenizer_dir(self, checkpoint: Path) -> Path:
        return Path(checkpoint) / "tokenizer"

    def copy_tokenizer(self, src: Path, checkpoint: Path) -> list[str]:
        from pipeline.stages.calibrate.export import copy_tokenizer

        return copy_tokenizer(src, self.tokenizer_dir(checkpoint))

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

    def export_copy_kind(self, *, roundtrip: bool) -> str:
        return "engine"


@dataclass(frozen=True)
class HfCheckpoint:
    """Unified Hugging Face checkpoint (ModelOpt `export_hf_checkpoint`): unsharded, the tokenizer at its root."""

    runtime: str = "pytorch"
    dirname: str = "hf_checkpoint"
    sharded: bool = False
    export_label: str = "Hugging Face checkpoint export"
    # a runtime-pytorch export differs in format; the engine runtime's keys (and build ids) stay as they were
    key_factors: dict[str, str] = field(default_factory=lambda: {"runtime": "pytorch"})
    export_tier: str | None = "hf_export"

    def tokenizer_dir(self, checkpoint: Path) -> Path:
        return Path(checkpoint)

    def copy_tokenizer(self, src: Path, checkpoint: Path) -> list[str]:
        from pipeline.stages.calibrate.export_hf import copy_tokenizer

        return copy_tokenizer(src, self.tokenizer_dir(checkpoint))

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

    def export_copy_kind(self, *, roundtrip: bool) -> str:
        return "pytorch" if roundtrip else "pytorch-large"


TRTLLM_CHECKPOINT = TrtllmCheckpoint()
HF_CHECKPOINT = HfCheckpoint()
