"""The TensorRT-LLM 1.2.1 LLM API (PyTorch backend): typed options and the trtllm-serve plan."""
