"""Backends: one object per (runtime, target), chosen once here; the rest of the pipeline asks it.

    engine  × trtllm     EngineTriton       trtllm-build engines, Triton's C++ tensorrtllm backend
    pytorch × trtllm     PytorchLlmapi      unified HF checkpoint, Triton `llmapi` model / trtllm-serve
    engine  × reference  EngineReference    TensorRT-LLM checkpoint on CPU (PyTorch), ensemble layout
    pytorch × reference  PytorchReference   HF checkpoint on CPU (transformers), llmapi layout

`backend_for(spec)` is the only place that looks at a spec's `runtime` and `target`; `checkpoint_format(runtime)`
answers for a recorded runtime alone (calibrate's output directory). Backend modules import stages inside their
methods, so any module may ask a backend at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.backends.base import Backend, CheckpointFormat, PackageInputs
from pipeline.backends.engine_triton import EngineTriton
from pipeline.backends.formats import HF_CHECKPOINT, TRTLLM_CHECKPOINT
from pipeline.backends.pytorch_llmapi import PytorchLlmapi
from pipeline.backends.reference import EngineReference, PytorchReference
from pipeline.core.errors import SpecError

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

__all__ = ["BACKENDS", "Backend", "CheckpointFormat", "PackageInputs", "backend_for", "backend_named",
           "checkpoint_format"]

BACKENDS: dict[tuple[str, str], Backend] = {
    (b.runtime, b.target): b for b in (EngineTriton(), PytorchLlmapi(), EngineReference(), PytorchReference())
}
_FORMATS: dict[str, CheckpointFormat] = {f.runtime: f for f in (TRTLLM_CHECKPOINT, HF_CHECKPOINT)}


def backend_named(runtime: str, target: str) -> Backend:
    """The backend of a recorded (runtime, target) pair, e.g. a manifest's.

    Raises:
        SpecError: a pair no backend serves.
    """
    try:
        return BACKENDS[(runtime, target)]
    except KeyError:
        raise SpecError(f"runtime {runtime!r} with target {target!r} has no backend; use runtime engine|pytorch "
                        "and target trtllm|reference") from None


def backend_for(spec: BuildSpec) -> Backend:
    """The backend that builds and serves `spec`."""
    return backend_named(spec.runtime, spec.target)


def checkpoint_format(runtime: str) -> CheckpointFormat:
    """What calibrate exports for `runtime` (engine: TensorRT-LLM checkpoint; pytorch: unified HF checkpoint).

    Raises:
        SpecError: an unknown runtime.
    """
    try:
        return _FORMATS[runtime]
    except KeyError:
        raise SpecError(f"runtime {runtime!r} is not one of {', '.join(_FORMATS)}") from None
