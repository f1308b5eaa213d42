"""What runs on the nodes: the shell scripts of a deployment (shared by Kubernetes and Slurm) and the server's ports.

A `Runtime` is the slot a serving stack fills: the per-rank program, its health endpoints and ports, and what the
node's fetch-verify step adds. The engine runtime runs `tritonserver` over the release's model repository as its
launch plan says (`pipeline.stages.package.launch_plan`, the plan `serve` uses): leader mode, one process per rank
(rank 0 serves HTTP/gRPC/metrics and every model, the others load only `tensorrt_llm`); orchestrator mode
(draft-target), one process, `mpirun --allow-run-as-root --oversubscribe -n 1 tritonserver ...`, whose backend spawns
each model's ranks; or one process. The PyTorch runtime runs TensorRT-LLM's OpenAI server on the release's Hugging
Face checkpoint: the argv of `pipeline.stages.package.serve_plan` (`trtllm-serve MODEL --backend pytorch ...
--extra_llm_api_options YAML`), under `trtllm-llmapi-launch` on every rank when a launcher (mpirun over pods,
`srun --mpi=pmix`) starts world-size ranks, as one process that spawns its own workers otherwise; probes on its
`/health` route. An engine release can be served the same way instead of by tritonserver (`--serve-mode
trtllm-serve`): serve_plan's `trtllm-serve ENGINE --backend tensorrt --tokenizer TOK ...` over the installed
release's engine and tokenizer. The reference runtime (a --target reference build, CPU; tests and demos) runs the
pipeline's own `invoke serve` on the installed repository as one process. Which one runs is the spec's runtime ×
target row's serve mode (`RuntimeTarget.served_as`), one `ServeMode` object each (`SERVED`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

from pipeline.core.errors import DeployError
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy.serve_inputs import OPTIONS_FILE, TOKENIZER_LINK
from pipeline.ops.deploy.stub_watch import STUB_WATCH, ready_script
from pipeline.ops.monitoring.rules import Source
from pipeline.planning.placement import Placement
from pipeline.stages.package.launch_plan import (SERVER_STACK_BYTES, Endpoints, LaunchPlan, ServerArgs, plan_launch,
                                                 shape_from_spec)
from pipeline.stages.package.serve_plan import LLMAPI_LAUNCH, engine_serve_argv, serve_argv

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
METRICS_PORT_NAME = "metrics"  # Triton's metrics container port
# Triton's TTFT histogram (nv_inference_first_response_histogram_ms), read by the monitoring rules; rank 0 only
HISTOGRAM_LATENCIES = "--metrics-config=histogram_latencies=true"
WORK = "/work"  # node-local: the downloaded release, the unpacked tree, the installed repository path
CONFIG = "/config"  # the scripts (ConfigMap on Kubernetes, the deployment directory under Slurm)
SERVE_DIR = "serve"  # under $WORK, trtllm-serve: the model (and tokenizer) links and the LLM-API options YAML
SERVE_MODES = ("triton", "trtllm-serve")  # deploy --serve-mode, as serve --mode


@dataclass(frozen=True)
class Scrape:
    """Where Prometheus reads a runtime's metrics, and whose metric names they are (`monitoring.rules.Source`)."""

    port: str  # a name in Runtime.ports
    path: str
    source: Source


TRITON_SCRAPE = Scrape(METRICS_PORT_NAME, "/metrics", "triton")
# trtllm-serve 1.2: `/metrics` is JSON iteration stats; Prometheus text is `/prometheus/metrics` on the HTTP port,
# mounted with `return_perf_metrics: true` (serve_inputs writes it; tensorrt_llm/serve/openai_server.py, mount_metrics)
TRTLLM_SERVE_SCRAPE = Scrape("http", "/prometheus/metrics", "trtllm-serve")


@dataclass(frozen=True)
class Runtime:
    name: str
    ready_path: str
    live_path: str
    rank_script: str  # /bin/sh: one rank (its rank number from MPI or Slurm), or the one process
    ports: tuple[tuple[str, int], ...]  # (name, port) the serving pod exposes
    ranks_launched: bool  # the platform starts world-size processes (else one process per deployment)
    node_setup: str = ""  # /bin/sh lines fetch-verify.sh runs after installing the repository ($repo, $work)
    gpus: bool = True  # the ranks use GPUs (Slurm asks for them; the CPU reference runtime does not)
    pipeline_image: bool = False  # the ranks run the pipeline itself (its image, not the server's)
    ports_from_env: bool = False  # rank.sh takes HTTP_PORT / GRPC_PORT / METRICS_PORT from the environment
    ready_script: str = ""  # /bin/sh readiness check run in the serving container (Kubernetes exec probe); "": HTTP
    own_mpirun: bool = False  # the one process is an `mpirun -n 1` of its own (orchestrator): no PMI from the platform
    scrape: Scrape | None = None  # what Prometheus scrapes (None: no monitoring files)

FETCH_VERIFY = """#!/bin/sh
# Runs on every node before the server: fetch the release (curl resumes a partial download and retries), verify
# the tarball in one read (release.json's sha256 against the pinned one, every header against the canonical tarball of
# that release.json, every member's type, mode, size and sha256, and the
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
      --retry-connrefused --continue-at - ${RELEASE_AUTH_HEADER:+--header "$RELEASE_AUTH_HEADER"} \\
      --output "$tarball.part" "$RELEASE_URL"; do
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


REPO_WORD = "@REPO@"  # in a launch plan's argv: the node's installed repository, "$repo" in the rank script


def engine_launch_plan(spec: BuildSpec, p: Placement) -> LaunchPlan:
    """The launch plan of the release's Triton repository on the deployment's nodes (the one `serve` uses).

    Raises:
        DeployError: a layout upstream cannot launch (draft-target with its target across nodes, GPU ids beyond a
            node's GPUs).
    """
    endpoints = Endpoints("0.0.0.0", HTTP_PORT, GRPC_PORT, METRICS_PORT)
    server = ServerArgs(REPO_WORD, "tritonserver", endpoints, shm_prefix="prefix")
    return plan_launch(shape_from_spec(spec), server, nodes=p.nodes, gpus_per_node=p.ranks_per_node, error=DeployError)


def _plan_word(arg: str) -> str:
    """`arg` quoted for /bin/sh, the repository placeholder left to the script's $repo."""
    return '"$repo"'.join(shlex.quote(part) if part else "" for part in arg.split(REPO_WORD))


# tritonserver's threads get SERVER_STACK_BYTES stacks on every rank, as `serve` gives them (see launch_plan.py):
# the soft RLIMIT_STACK raised to it in KiB, capped by the hard limit, never lowered.
STACK_LIMIT = f"""\
stack_kib={SERVER_STACK_BYTES // 1024}
hard_kib=$(ulimit -H -s)
[ "$hard_kib" = unlimited ] || [ "$hard_kib" -ge "$stack_kib" ] || stack_kib=$hard_kib
soft_kib=$(ulimit -S -s)
[ "$soft_kib" = unlimited ] || [ "$soft_kib" -ge "$stack_kib" ] || ulimit -S -s "$stack_kib"
"""


def with_latency_histograms(argv: list[str], rank: int) -> list[str]:
    """Rank 0's tritonserver also exports latency histograms (TTFT for the alerts): the flag goes right after the
    `tritonserver` word, so it stays with that program inside an `mpirun ... : ...` line."""
    if rank != 0 or "tritonserver" not in argv:
        return argv
    at = argv.index("tritonserver") + 1
    return [*argv[:at], HISTOGRAM_LATENCIES, *argv[at:]]


def _engine_rank_script(plan: LaunchPlan) -> str:
    """/bin/sh: the plan's env and STACK_LIMIT, then the argv of this process's rank (MPI or Slurm rank; 0 for one
    process). Rank 0 holds the Python models and runs under the stub watchdog (`pipeline.ops.deploy.stub_watch`).

    Orchestrator mode runs launch_triton_server.py's `mpirun --allow-run-as-root --oversubscribe -n 1 tritonserver
    ...` (its `--oversubscribe` option, "mainly for SLURM MPI usecases"): under Slurm that mpirun takes its slots from
    the job, one task, and the backend's MPI_Comm_spawn of every model's ranks needs more than that.
    """
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(plan.env.items()))
    cases = "".join(f"  {i}) {f'serve_watched {HTTP_PORT}' if i == 0 else 'exec'} "
                    f"{' '.join(_plan_word(a) for a in with_latency_histograms(plan.process_argv(i, oversubscribe=True), i))}"
                    " ;;\n" for i in range(plan.processes))
    return f"""#!/bin/sh
# The engine runtime, {plan.mode} mode: {plan.processes} process(es); rank 0 serves HTTP/gRPC/metrics.
# upstream: {plan.source}
set -eu
rank="${{OMPI_COMM_WORLD_RANK:-${{SLURM_PROCID:-0}}}}"
repo=$(cat "${{WORK:-/work}}/REPO")
{STUB_WATCH}{STACK_LIMIT}{env}case "$rank" in
{cases}  *) echo "error: rank $rank is outside the {plan.processes} process(es) of this launch plan" >&2; exit 2 ;;
esac
"""


def engine_runtime(spec: BuildSpec, p: Placement) -> Runtime:
    """tritonserver over the release's repository as its launch plan says: leader mode -> the platform starts
    world-size ranks; single -> one process; orchestrator -> one process, its own `mpirun -n 1` (the backend spawns
    each model's ranks from it)."""
    plan = engine_launch_plan(spec, p)
    ports = (("http", HTTP_PORT), ("grpc", GRPC_PORT), (METRICS_PORT_NAME, METRICS_PORT))
    return Runtime("engine", "/v2/health/ready", "/v2/health/live", _engine_rank_script(plan), ports,
                   ranks_launched=plan.ranks_launched, ready_script=ready_script(HTTP_PORT),
                   own_mpirun=plan.own_mpirun, scrape=TRITON_SCRAPE)


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
    return _trtllm_serve_runtime("pytorch", pytorch_rank_argv(spec, served_name, launched=launched), served_name,
                                 launched=launched, what="the release's checkpoint")


def engine_serve_rank_argv(spec: BuildSpec, served_name: str, *, launched: bool) -> list[str]:
    """The rank program of an engine under trtllm-serve (paths under WORK, written by serve_inputs --engine)."""
    serve = engine_serve_argv(spec, engine_dir=f"{WORK}/{SERVE_DIR}/{served_name}",
                              tokenizer_dir=f"{WORK}/{SERVE_DIR}/{TOKENIZER_LINK}",
                              options_file=f"{WORK}/{SERVE_DIR}/{OPTIONS_FILE}", host="0.0.0.0", port=HTTP_PORT)
    return [LLMAPI_LAUNCH, *serve] if launched else serve


def engine_serve_runtime(spec: BuildSpec, served_name: str, *, launched: bool) -> Runtime:
    """trtllm-serve --backend tensorrt on the release's engine; `launched`: the platform starts world-size ranks."""
    return _trtllm_serve_runtime("engine-trtllm-serve", engine_serve_rank_argv(spec, served_name, launched=launched),
                                 served_name, launched=launched, what="the release's engine", engine=True)


def _trtllm_serve_runtime(name: str, argv: list[str], served_name: str, *, launched: bool, what: str,
                          engine: bool = False) -> Runtime:
    line = " ".join(_shell_word(a) for a in argv)
    how = "every rank runs trtllm-llmapi-launch, rank 0 serves HTTP" if launched else \
        "one process, the LLM spawns its TP/PP workers"
    script = f"""#!/bin/sh
# TensorRT-LLM's OpenAI server on {what} ({how}).
set -eu
WORK="${{WORK:-{WORK}}}"
exec {line}
"""
    flag = "--engine " if engine else ""
    setup = (f'${{PIPELINE_PYTHON:-python3}} -m pipeline.ops.deploy.serve_inputs {flag}"$repo" "$work/{SERVE_DIR}" '
             f"{shlex.quote(served_name)}\n")
    return Runtime(name, "/health", "/health", script, (("http", HTTP_PORT),), ranks_launched=launched,
                   node_setup=setup, scrape=TRTLLM_SERVE_SCRAPE)


REFERENCE_RANK = f"""#!/bin/sh
# The reference runtime (CPU; tests and demos): the pipeline's tritonserver over the installed repository, one
# process; ports from HTTP_PORT / GRPC_PORT / METRICS_PORT (default {HTTP_PORT} / {GRPC_PORT} / {METRICS_PORT}).
set -eu
repo=$(cat "${{WORK:-{WORK}}}/REPO")
pipeline="${{PIPELINE:-invoke -r /opt/trtllm-pipeline}}"
exec $pipeline serve --repo "$repo" --host 0.0.0.0 --http-port "${{HTTP_PORT:-{HTTP_PORT}}}" \\
  --grpc-port "${{GRPC_PORT:-{GRPC_PORT}}}" --metrics-port "${{METRICS_PORT:-{METRICS_PORT}}}"
"""


def reference_runtime() -> Runtime:
    """A --target reference build (CPU): `invoke serve` on the installed repository, one process, no GPUs."""
    ports = (("http", HTTP_PORT), ("grpc", GRPC_PORT), (METRICS_PORT_NAME, METRICS_PORT))
    return Runtime("reference", "/v2/health/ready", "/v2/health/live", REFERENCE_RANK, ports, ranks_launched=False,
                   gpus=False, pipeline_image=True, ports_from_env=True, scrape=TRITON_SCRAPE)


class ServeMode(Protocol):
    """One way of serving a release on the deployed nodes (`RuntimeTarget.serve_modes` names it)."""

    def runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str) -> Runtime:
        ...


class TritonEngine:
    """tritonserver over the engines, as the release's launch plan says."""

    def runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str) -> Runtime:
        return engine_runtime(spec, placement)


class TrtllmServeEngine:
    """`trtllm-serve --backend tensorrt` over the engines."""

    def runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str) -> Runtime:
        return engine_serve_runtime(spec, served_name, launched=launched_ranks(placement, platform))


class TrtllmServePytorch:
    """`trtllm-serve --backend pytorch` over the Hugging Face checkpoint."""

    def runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str) -> Runtime:
        return pytorch_runtime(spec, served_name, launched=launched_ranks(placement, platform))


class TritonReference:
    """The CPU reference: `invoke serve` on the installed repository."""

    def runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str) -> Runtime:
        return reference_runtime()


SERVED: dict[str, ServeMode] = {"triton": TritonEngine(), "trtllm-serve-engine": TrtllmServeEngine(),
                                "trtllm-serve-pytorch": TrtllmServePytorch(), "triton-reference": TritonReference()}


def runtime_for(spec: BuildSpec, served_name: str, *, placement: Placement, platform: str,
                serve_mode: str | None = None) -> Runtime:
    """The runtime of `spec` on `placement` (`serve_mode`: triton or trtllm-serve; default: tritonserver for
    engines, trtllm-serve for runtime pytorch). trtllm-serve: Slurm and multi-node Kubernetes start world-size ranks
    (srun / mpirun over pods). Triton on engines: as its launch plan says.

    Raises:
        DeployError: an unknown serve mode, or one the spec's runtime × target refuses.
    """
    if serve_mode not in (None, *SERVE_MODES):
        raise DeployError(f"--serve-mode {serve_mode!r}: use one of {', '.join(SERVE_MODES)}")
    served = SERVED[runtime_of(spec).served_as(serve_mode)]
    return served.runtime(spec, served_name, placement=placement, platform=platform)


def launched_ranks(placement: Placement, platform: str) -> bool:
    """Whether a launcher starts the world-size ranks (multi-node pods, or srun under Slurm)."""
    return placement.multi_node or platform == "slurm"


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
