# GPU build/serve host image: NGC Triton with the TensorRT-LLM 1.2.1 backend + this pipeline.
#
# Which tag carries TensorRT-LLM 1.2.1: triton-inference-server/tensorrtllm_backend branch r26.04 (and r26.05-r26.07),
# dockerfile/Dockerfile.triton.trt_llm_backend, pins TENSORRTLLM_REPO_TAG=release/1.2.1, TENSORRTLLM_VER=1.2.1,
# TRT_VER=10.14.1.48 on the base nvcr.io/nvidia/tritonserver:25.12-py3-min; r26.03 still pinned 1.2.0rc8, and
# Triton's compatibility matrix lists 25.12-trtllm-python-py3 with TensorRT-LLM 1.1.0 / TensorRT 10.13.3.9.
# So the first NGC release image with TensorRT-LLM 1.2.1 is 26.04-trtllm-python-py3 (Python 3.12, CUDA 13).
# The check below fails the build if the tag ever ships another TensorRT-LLM (engines are version-locked).
ARG TRITON_VERSION=26.04
FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-trtllm-python-py3

ARG TRTLLM_VERSION=1.2.1
RUN python3 -c "import importlib.metadata as m, sys; v = m.version('tensorrt_llm'); \
sys.exit(0 if v == '${TRTLLM_VERSION}' else f'image has tensorrt_llm {v}, the pipeline needs ${TRTLLM_VERSION}')"
# The same image serves --runtime pytorch: trtllm-serve / trtllm-llmapi-launch (OpenAI server) and the Python
# backend the Triton `llmapi` model runs on (tensorrt_llm.LLM on the PyTorch backend); fail early without them.
RUN command -v trtllm-serve >/dev/null && command -v trtllm-llmapi-launch >/dev/null

WORKDIR /opt/trtllm-pipeline
COPY pyproject.toml README.md tasks.py ./
COPY pipeline ./pipeline
# Keep the image's own torch / TensorRT / TensorRT-LLM / ModelOpt / transformers exactly as NVIDIA built them:
# every package already installed is a constraint (client/protobuf stacks excepted: the pipeline pins its own).
RUN python3 -m pip freeze | grep -v ' @ ' | grep -viE '^(tritonclient|protobuf|grpcio)==' > /tmp/image-constraints.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/image-constraints.txt . \
 && rm /tmp/image-constraints.txt \
 && invoke --list >/dev/null

# Outputs (engines/, triton_repo/, releases/) and the download cache live on mounted volumes.
ENV PIPELINE_ROOT=/workspace/out \
    PIPELINE_CACHE=/workspace/cache \
    HF_HOME=/workspace/cache/hf
VOLUME ["/workspace/out", "/workspace/cache"]
# HTTP, gRPC, metrics
EXPOSE 8000 8001 8002
# Run invoke tasks from the package dir (tasks.py), e.g.:
#   docker run --gpus all -v $PWD/out:/workspace/out -v $PWD/cache:/workspace/cache IMAGE \
#     invoke build --model llama-70b --precision fp8 --tp 4
#   ... IMAGE invoke build --model llama-70b --precision fp8 --tp 4 --runtime pytorch     (HF checkpoint, no engines)
#   ... -p 8000:8000 IMAGE invoke serve --mode trtllm-serve --host 0.0.0.0 --model llama-70b --precision fp8 \
#     --tp 4 --runtime pytorch                                                            (OpenAI /v1/completions)
CMD ["invoke", "--list"]
