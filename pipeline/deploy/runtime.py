"""What runs on the nodes: the shell scripts of a deployment (shared by Kubernetes and Slurm) and the server's ports.

A `Runtime` is the slot a serving stack fills: the per-rank program and its health endpoints. The engine runtime runs
`tritonserver` over the release's model repository, one process per rank (rank 0 serves HTTP/gRPC/metrics and every
model; the other ranks load only the TensorRT-LLM models, as the backend's launch_triton_server.py does). A PyTorch
runtime (`trtllm-llmapi-launch trtllm-serve ...`, /health) fills the same slot with its own rank program.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..spec import BuildSpec

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
WORK = "/work"  # node-local: the downloaded release, the unpacked tree, the installed repository path
CONFIG = "/config"  # the scripts (ConfigMap on Kubernetes, the deployment directory under Slurm)


@dataclass(frozen=True)
class Runtime:
    name: str
    ready_path: str
    live_path: str
    rank_script: str  # /bin/sh: one rank (its rank number from MPI or Slurm)


FETCH_VERIFY = """#!/bin/sh
# Runs on every node before the server: fetch the release, check its sha256, verify it on this node
# (hashes, and the engine's TensorRT-LLM/GPU against this host: exit 4 on a mismatch), unpack, install the repo.
set -eu
work="${WORK:-/work}"
pipeline="${PIPELINE:-invoke -r /opt/trtllm-pipeline}"
mkdir -p "$work/download" "$work/release"
if [ -n "${RELEASE_URL:-}" ]; then
  tarball="$work/download/$RELEASE_FILE"
  python3 -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1]) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)' "$RELEASE_URL" "$tarball"
else
  tarball="${RELEASE_DIR:-/releases}/$RELEASE_FILE"
fi
if [ -n "${RELEASE_SHA256:-}" ]; then
  echo "$RELEASE_SHA256  $tarball" | sha256sum -c -
fi
$pipeline verify "$tarball"
tar -xzf "$tarball" -C "$work/release"
repo=$(find "$work/release" -mindepth 3 -maxdepth 3 -type d -path '*/triton_repo/*' | head -n 1)
if [ -z "$repo" ]; then
  echo "error: no triton_repo/ in $RELEASE_FILE" >&2
  exit 2
fi
$pipeline install-repo --repo "$repo"
echo "$repo" > "$work/REPO"
if [ -n "${COPY_KUBECTL:-}" ]; then
  mkdir -p "$work/bin" && cp "$(command -v kubectl)" "$work/bin/kubectl"
fi
"""


def _engine_rank_script(spec: BuildSpec) -> str:
    engine_models = ["tensorrt_llm", *(["tensorrt_llm_draft"] if spec.draft_model else [])]
    loads = " ".join(f"--load-model={m}" for m in engine_models)
    endpoints = f"--http-port={HTTP_PORT} --grpc-port={GRPC_PORT} --metrics-port={METRICS_PORT}"
    return f"""#!/bin/sh
# One rank of the engine runtime: rank 0 serves HTTP/gRPC/metrics and every model, the others the engine models.
set -eu
rank="${{OMPI_COMM_WORLD_RANK:-${{SLURM_PROCID:-0}}}}"
repo=$(cat "${{WORK:-/work}}/REPO")
if [ "$rank" = 0 ]; then
  exec tritonserver --model-repository="$repo" {endpoints} --disable-auto-complete-config \\
    --backend-config=python,shm-region-prefix-name=prefix0_
fi
exec tritonserver --model-repository="$repo" --model-control-mode=explicit {loads} \\
  --allow-http=false --allow-grpc=false --allow-metrics=false --disable-auto-complete-config \\
  --backend-config=python,shm-region-prefix-name="prefix${{rank}}_"
"""


def engine_runtime(spec: BuildSpec) -> Runtime:
    return Runtime("engine", "/v2/health/ready", "/v2/health/live", _engine_rank_script(spec))


def leader_script(kubectl: str = f"{WORK}/bin/kubectl") -> str:
    """The LeaderWorkerSet leader: wait for its group's worker pods, then mpirun every rank over the pods."""
    k = shlex.quote(kubectl)
    return f"""#!/bin/sh
# LeaderWorkerSet leader: wait until the group's workers are Ready, then start every rank with mpirun
# (RANKS_PER_NODE slots per pod; mpirun reaches the worker pods with kubectl exec, see kubexec.sh).
set -eu
hosts="$POD_NAME:$RANKS_PER_NODE"
i=1
while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do
  until {k} get pod "$POD_NAME-$i" >/dev/null 2>&1; do sleep 5; done
  {k} wait --for=condition=Ready "pod/$POD_NAME-$i" --timeout=60m
  hosts="$hosts,$POD_NAME-$i:$RANKS_PER_NODE"
  i=$((i + 1))
done
exec mpirun --allow-run-as-root --mca plm_rsh_agent {CONFIG}/kubexec.sh -np "$WORLD_SIZE" --host "$hosts" \\
  -x WORK {CONFIG}/rank.sh
"""


def kubexec_script(kubectl: str = f"{WORK}/bin/kubectl") -> str:
    return f"""#!/bin/sh
# mpirun's remote-shell agent on Kubernetes: run the MPI daemon in the named pod's server container.
pod="$1"
shift
exec {shlex.quote(kubectl)} exec "$pod" -c server -- /bin/sh -c "$*"
"""
