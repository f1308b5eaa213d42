"""Compile stage: TensorRT-LLM 1.2.1 engines (target + optional draft) for SM 90 from exported checkpoints.

Modules: `flags` (the accepted trtllm-build flag set, as data), `checkpoint_config`, `plan` (pure argv/expected
values), `preflight` (host checks, fast fail on CPU), `runner` (the only code that runs trtllm-build), `verify`,
`manifest` (engine manifest, stage key, tokenizer equality), `stage` (`run_compile`), `cli` (the invoke task body).
Nothing here imports tensorrt_llm at module level.
"""

from pipeline.stages.compile.engine_plan import CompilePlan, EnginePlan, plan_compile
from pipeline.stages.compile.stage import run_compile

__all__ = ["CompilePlan", "EnginePlan", "plan_compile", "run_compile"]
