"""What runs on the nodes: the shell scripts of a deployment (shared by Kubernetes and Slurm) and the server's ports.

A `Runtime` is the slot a serving stack fills: the per-rank program, its health endpoints and ports, and what the
node's fetch-verify step adds. The engine runtime runs `tritonserver` over the release's model repository, one
process per rank (rank 0 serves HTTP/gRPC/metrics and every model; the other ranks load only the TensorRT-LLM
models, as the backend's launch_triton_server.py does). The PyTorch runtime runs TensorRT-LLM's OpenAI server on the
release's Hugging Face checkpoint: the argv of `pipeline.llmapi.serve_plan` (`trtllm-serve MODEL --backend pytorch
... --extra_llm_api_options YAML`), under `trtllm-llmapi-launch` on every rank when a launcher (mpirun over pods,
`srun --mpi=pmix`) starts world-size ranks, as one process that spawns its own workers otherwise; probes on its
`/health` route.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..llmapi.serve_plan import LLMAPI_LAUNCH, serve_argv
from ..spec import BuildSpec
from .serve_inputs import OPTIONS_FILE

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
WORK = "/work"  # node-local: the downloaded release, the unpacked tree, the installed repository path
CONFIG = "/config"  # the scripts (ConfigMap on Kubernetes, the deployment directory under Slurm)
SERVE_DIR = "serve"  # under $WORK, runtime pytorch: the checkpoint link and the LLM-API options YAML


@dataclass(frozen=True)
class Runtime:
    name: str
    ready_path: str
    live_path: str
    rank_script: str  # /bin/sh: one rank (its rank number from MPI or Slurm), or the one process
    ports: tuple[tuple[str, int], ...]  # (name, port) the serving pod exposes
    ranks_launched: bool  # the platform starts world-size processes (else one process per deployment)
    node_setup: str = ""  # /bin/sh lines fetch-verify.sh runs after installing the repository ($repo, $work)

FETCH_VERIFY = """#!/bin/sh
# Runs on every node before the server: fetch the release (curl resumes a partial download and retries), verify
# the tarball in one read (its sha256 against the pinned one, every member's type, mode, size and sha256, and the
# engine's TensorRT-LLM/GPU, or a pytorch release's TensorRT-LLM, against this host: exit 4 on a mismatch), unpack,
# install the repo. The tarball is verified rather than the unpacked tree: tar then only ever unpacks a checked
# archive, and a 68 GB release is read twice (verify, tar) instead of three times (sha256sum, tar, verify).
set -eu
work="${WORK:-/work}"
pipeline="${PIPELINE:-invoke -r /opt/trtllm-pipeline}"
name="${RELEASE_FILE%.tar.gz}"
name="${name%.tar}"
mkdir -p "$work/download" "$work/release"
if [ -n "${RELEASE_URL:-}" ]; then
  tarball="$work/download/$RELEASE_FILE"
  attempt=1
  until [ -f "$tarball" ] || curl --fail --location --silent --show-error --retry 5 --retry-delay 10 \\
      --retry-connrefused --continue-at - --output "$tarball.part" "$RELEASE_URL"; do
    if [ "$attempt" -ge "${FETCH_ATTEMPTS:-5}" ]; then
      echo "error: could not download $RELEASE_URL ($attempt attempts); check the URL and the network" >&2
      exit 5
    fi
    attempt=$((attempt + 1))
    sleep "${FETCH_RETRY_DELAY:-10}"
  done
  [ -f "$tarball" ] || mv "$tarball.part" "$tarball"
else
  tarball="${RELEASE_DIR:-/releases}/$RELEASE_FILE"
fi
rc=0
$pipeline verify "$tarball" ${RELEASE_SHA256:+--sha256 "$RELEASE_SHA256"} || rc=$?
if [ "$rc" -ne 0 ]; then
  if [ -n "${RELEASE_URL:-}" ] && [ "$rc" -eq 3 ]; then rm -f "$tarball"; fi  # corrupt: fetched again next time
  exit "$rc"
fi
rm -rf "$work/release/.tmp-$name" "$work/release/$name"
mkdir "$work/release/.tmp-$name"
tar -xf "$tarball" --no-same-owner -C "$work/release/.tmp-$name"
if [ ! -d "$work/release/.tmp-$name/$name" ]; then
  echo "error: $RELEASE_FILE does not hold $name/; give the tarball invoke release wrote, under its own name" >&2
  exit 2
fi
mv "$work/release/.tmp-$name/$name" "$work/release/$name"
rmdir "$work/release/.tmp-$name"
repo=$(find "$work/release/$name/triton_repo" -mindepth 1 -maxdepth 1 -type d | head -n 1)
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
    ports = (("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT))
    return Runtime("engine", "/v2/health/ready", "/v2/health/live", _engine_rank_script(spec), ports,
                   ranks_launched=True)


def _shell_word(arg: str) -> str:
    """`arg` quoted for /bin/sh, a leading WORK/ left to the node's $WORK (Slurm: a per-job directory)."""
    if arg.startswith(f"{WORK}/"):
        return '"$WORK"/' + shlex.quote(arg[len(WORK) + 1:])
    return shlex.quote(arg)


def pytorch_rank_argv(spec: BuildSpec, served_name: str, *, launched: bool) -> list[str]:
    """The rank program (paths under WORK): serve_plan's trtllm-serve argv, behind trtllm-llmapi-launch if
    `launched` (every one of world-size ranks runs it; rank 0 serves HTTP)."""
    serve = serve_argv(spec, model_dir=f"{WORK}/{SERVE_DIR}/{served_name}",
                       options_file=f"{WORK}/{SERVE_DIR}/{OPTIONS_FILE}", host="0.0.0.0", port=HTTP_PORT)
    return [LLMAPI_LAUNCH, *serve] if launched else serve


def pytorch_runtime(spec: BuildSpec, served_name: str, *, launched: bool) -> Runtime:
    """trtllm-serve on the release's HF checkpoint; `launched`: the platform starts world-size ranks."""
    argv = " ".join(_shell_word(a) for a in pytorch_rank_argv(spec, served_name, launched=launched))
    how = "every rank runs trtllm-llmapi-launch, rank 0 serves HTTP" if launched else \
        "one process, the LLM spawns its TP/PP workers"
    script = f"""#!/bin/sh
# The PyTorch runtime: TensorRT-LLM's OpenAI server on the release's checkpoint ({how}).
set -eu
WORK="${{WORK:-{WORK}}}"
exec {argv}
"""
    setup = (f'${{PIPELINE_PYTHON:-python3}} -m pipeline.deploy.serve_inputs "$repo" "$work/{SERVE_DIR}" '
             f"{shlex.quote(served_name)}\n")
    return Runtime("pytorch", "/health", "/health", script, (("http", HTTP_PORT),), ranks_launched=launched,
                   node_setup=setup)


def runtime_for(spec: BuildSpec, served_name: str, *, multi_node: bool, platform: str) -> Runtime:
    """The runtime of `spec`; Slurm and multi-node Kubernetes start world-size ranks (srun / mpirun over pods)."""
    if spec.runtime == "pytorch":
        return pytorch_runtime(spec, served_name, launched=multi_node or platform == "slurm")
    return engine_runtime(spec)


def fetch_verify_script(rt: Runtime) -> str:
    return FETCH_VERIFY + rt.node_setup


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
