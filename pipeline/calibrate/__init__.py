"""Calibrate stage: ModelOpt post-training quantization, quality gate, TP/PP-sharded TensorRT-LLM checkpoint export.

`run_calibrate(spec, role=...)` is the entry point; heavy imports (torch, modelopt, transformers) happen inside it.
"""

from .stage import CheckpointResult, run_calibrate

__all__ = ["CheckpointResult", "run_calibrate"]
