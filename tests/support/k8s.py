"""What a Kubernetes deployment in a test needs: a pipeline image the nodes could pull (one naming a registry)."""

PIPELINE_IMAGE = "registry.example.com/ml/trtllm-pipeline:0.1.0-26.04-trtllm-python-py3"
