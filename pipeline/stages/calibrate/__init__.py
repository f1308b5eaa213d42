"""Calibrate stage: ModelOpt post-training quantization, quality gate, TP/PP-sharded TensorRT-LLM checkpoint export.

`pipeline.stages.calibrate.stage.run_calibrate(spec, role=...)` is the entry point; heavy imports (torch, modelopt,
transformers) happen inside it. `data` (calibration text loading) is light and used by the spec's rules.
"""
