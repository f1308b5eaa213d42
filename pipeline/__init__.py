"""TensorRT-LLM build-and-deploy pipeline: spec -> checkpoint -> engines -> Triton repository."""

__version__ = "0.1.0"
