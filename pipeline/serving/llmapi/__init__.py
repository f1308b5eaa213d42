"""The TensorRT-LLM 1.2.1 LLM API (PyTorch backend): its OpenAI client and what `serve --mode trtllm-serve` serves
here (the command itself: `pipeline.stages.package.serve_plan`)."""
