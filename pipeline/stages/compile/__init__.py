"""Compile stage: TensorRT-LLM 1.2.1 engines (target + optional draft) for SM 90 from exported checkpoints.

Modules: `flags` (the accepted trtllm-build flag set, as data), `checkpoint_config`, `plan` (pure argv/expected
values), `preflight` (host checks, fast fail on CPU), `runner` (the only code that runs trtllm-build), `verify`,
`manifest` (engine manifest, stage key, tokenizer equality), `stage` (`run_compile`), `cli` (the invoke task body).
Nothing here imports tensorrt_llm at module level.
"""

import importlib

_EXPORTS = {"CompilePlan": "engine_plan", "EnginePlan": "engine_plan", "plan_compile": "engine_plan",
            "run_compile": "stage"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """The package's names, imported on first use (importing one submodule does not load the others)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
