# GPU build/serve host image: NGC Triton with the TensorRT-LLM 1.2.1 backend + this pipeline + kubectl.
# Build (the tag `invoke deploy` uses by default, pipeline.ops.deploy.images.DEFAULT_PIPELINE_IMAGE):
#   docker build -t trtllm-pipeline:0.1.0-26.04-trtllm-python-py3 .
# Another Triton release: --build-arg TRITON_VERSION=yy.mm and tag it trtllm-pipeline:0.1.0-<yy.mm>-trtllm-python-py3.
#
# Which tag carries TensorRT-LLM 1.2.1: 26.04-trtllm-python-py3, UNVERIFIED from NVIDIA's own pages. Searched: Triton's
# compatibility matrix (docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/
# compatibility.html, container trtllm-python-py3) stops at 25.12 = TensorRT-LLM 1.1.0; the release notes
# release-notes/rel-26-04.html (CUDA 13.2.1) as read list no component versions; tensorrtllm_backend's
# dockerfile/Dockerfile.triton.trt_llm_backend is readable only at its 25.04/25.06 bases (an earlier note here cited
# its r26.04 branch pinning TENSORRTLLM_REPO_TAG=release/1.2.1). Only users' notes name "Triton 26.04 = v2.68.0 ...
# TRT-LLM 1.2.1". The check below fails the build if the tag ships another TensorRT-LLM (engines are version-locked).
ARG TRITON_VERSION=26.04
FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-trtllm-python-py3

ARG TRTLLM_VERSION=1.2.1
RUN python3 -c "import importlib.metadata as m, sys; v = m.version('tensorrt_llm'); \
sys.exit(0 if v == '${TRTLLM_VERSION}' else f'image has tensorrt_llm {v}, the pipeline needs ${TRTLLM_VERSION}')"
# The same image serves --runtime pytorch: trtllm-serve / trtllm-llmapi-launch (OpenAI server) and the Python
# backend the Triton `llmapi` model runs on (tensorrt_llm.LLM on the PyTorch backend); fail early without them.
RUN command -v trtllm-serve >/dev/null && command -v trtllm-llmapi-launch >/dev/null

# kubectl: the LeaderWorkerSet leader's mpirun reaches its worker pods with `kubectl exec` (fetch-verify copies this
# binary into the pod's work volume). The release binary from dl.k8s.io, pinned by version and sha256 per
# architecture (the sha256 of dl.k8s.io's v1.36.0 linux/amd64 and linux/arm64 binaries, the same values pinned by
# several independent public projects; any mismatch fails the build). kubectl talks to API servers one minor
# version either side: for another cluster version pass all three build args (sha256 from <url>.sha256).
ARG KUBECTL_VERSION=v1.36.0
ARG KUBECTL_SHA256_AMD64=123d8c8844f46b1244c547fffb3c17180c0c26dac9890589fe7e67763298748e
ARG KUBECTL_SHA256_ARM64=9f9d9c44a7b5264515ac9da5991584e2395bd50662e651132337e7b4d0c56f8f
RUN case "$(uname -m)" in \
      x86_64) arch=amd64 sum="${KUBECTL_SHA256_AMD64}" ;; \
      aarch64) arch=arm64 sum="${KUBECTL_SHA256_ARM64}" ;; \
      *) echo "no kubectl pin for $(uname -m)" >&2; exit 1 ;; \
    esac \
 && curl -fsSL --retry 5 -o /tmp/kubectl "https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/linux/${arch}/kubectl" \
 && echo "${sum}  /tmp/kubectl" | sha256sum -c - \
 && install -m 0755 /tmp/kubectl /usr/local/bin/kubectl \
 && rm /tmp/kubectl \
 && kubectl version --client
ENV KUBECTL=/usr/local/bin/kubectl

WORKDIR /opt/trtllm-pipeline
COPY pyproject.toml README.md tasks.py ./
COPY pipeline ./pipeline
# Install this repository against the image's stack without freezing it: only the engine contract (ENGINE_STACK in
# pipeline/ops/deploy/images.py: tensorrt_llm and torch, at the versions installed here) is a constraint; the rest of
# our requirements (pyproject.toml: transformers 4.57.x, nvidia-modelopt 0.37.x, numpy<2, ...) are the ranges
# TensorRT-LLM 1.2.1 itself requires, so the image's own versions satisfy them and stay (tests/ops/deploy/test_images.py
# checks the ranges against its requirements.txt). The constraints come from the standard library alone.
RUN python3 -m pipeline.ops.deploy.images > /tmp/engine-stack.txt \
 && cat /tmp/engine-stack.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/engine-stack.txt . \
 && rm /tmp/engine-stack.txt \
 && invoke --list >/dev/null \
 && trtllm-pipeline --list >/dev/null

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
#   ... -p 8000-8002:8000-8002 IMAGE invoke serve --host 0.0.0.0 --model llama-70b --precision fp8 --tp 4
#     (Triton on 8000/8001/8002, launched as the launch plan says: leader-mode ranks, or one orchestrator process
#     for draft-target)
#   ... -p 8000:8000 IMAGE invoke serve --mode trtllm-serve --host 0.0.0.0 --model llama-70b --precision fp8 \
#     --tp 4 [--runtime pytorch]                             (OpenAI /v1/chat/completions, on the engine or checkpoint)
CMD ["invoke", "--list"]
