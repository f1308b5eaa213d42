#!/usr/bin/env bash
# The acceptance run for a GPU host, inside nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 (TensorRT-LLM 1.2.1):
# tiny engines with trtllm-build (TP 2 when two GPUs are visible, then with a draft), the engine check on those real
# engines (as written and re-serialized by BuildConfig; a changed value rejected), served through the C++
# tensorrtllm backend exactly as `invoke serve` launches them (leader mode; orchestrator draft-target under
# `mpirun -n 1`, every rank of both models spawned as a trtllmExecutorWorker), our smoke
# routes, NVIDIA's clients when TRTLLM_TRITON_CLIENTS names the release's triton_backend directory, and greedy text
# compared with the CPU reference backend; then EAGLE-3 on the PyTorch runtime (the tiny target with its generated head
# through the llmapi repository, drafts accepted, greedy text as the CPU reference's; Llama-3.1-8B with
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B too when ACCEPTANCE_EAGLE3_LLAMA8B=1, HF_TOKEN set). Where TensorRT-LLM or a
# GPU is missing, pytest reports every test skipped with its reason (-rs) and this script exits 3: a skipped
# acceptance run is never a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
"$PY" -m pytest -q -rs -p no:cacheprovider tests/test_gpu_acceptance.py "$@" | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi
if ! grep -qE '^[0-9]+ passed' "$log" || grep -qE ' skipped' "$log"; then
  echo "gpu acceptance: not run on this host (see the skip reasons above)" >&2
  exit 3
fi
echo "gpu acceptance: passed"
