"""How a Triton model repository is launched: one pure plan shared by `serve` (this host), Kubernetes and Slurm.

`plan_launch(shape, server, ...)` maps what the repository holds (its TensorRT-LLM models and their world sizes, or an
LLM-API model, or the CPU reference backend) and the host shape (nodes, GPUs per node) to a mode, the processes
the platform starts (each one's exact `tritonserver` argv, rank 0 first) and the environment they need.

| mode | repository | processes | env |
|---|---|---|---|
| single | one `tensorrt_llm`, TP×PP = 1 | 1 | |
| leader | one `tensorrt_llm`, TP×PP = N > 1 | N under MPI: rank 0 serves the endpoints and every model, ranks >= 1 load only `tensorrt_llm` (endpoints off) | |
| orchestrator | draft + target (two `tensorrtllm` models) | 1, under `mpirun -n 1`: the backend MPI_Comm_spawns each model's ranks on its `gpu_device_ids` | TRTLLM_ORCHESTRATOR(_SPAWN_PROCESSES)=1 |
| llmapi | runtime-pytorch, GPU, TP×PP = N | N = 1: one process (the LLM spawns its workers); N > 1: N under MPI, each `trtllm-llmapi-launch tritonserver ...` (rank 0 runs the server, the others TensorRT-LLM's MPI workers) | |
| cpu-reference | Python-backend reference | 1 (nvidia-pytriton's tritonserver) | |

Upstream sources (read in the code index, never copied):
- TensorRT-LLM `triton_backend/scripts/launch_triton_server.py` (commits 0b06796b and 0a2e2c1f in the index; the same
  argv; tensorrtllm_backend's `scripts/launch_triton_server.py` is that launcher): `get_cmd` starts `mpirun
  --allow-run-as-root [--oversubscribe]` and, per rank i, `-n 1 [trtllm-llmapi-launch] tritonserver
  --model-repository=R [--exit-timeout-secs=T] <ports> ... --disable-auto-complete-config
  --backend-config=python,shm-region-prefix-name=prefix{i}_ :`, ranks != 0 with `--model-control-mode=explicit
  --load-model=<tensorrt_llm_model_name>`; MPI stays on (`use_mpi`) unless `--no-mpi`, also for `--multi-model` at
  world size 1. `__main__` with `--multi-model` asserts ORCHESTRATOR_ASSERT below and sets the orchestrator env;
  `add_multi_model_config` (Triton > 24.06, spawn on) adds `--pinned-memory-pool-byte-size=0
  --enable-peer-access=false` and `--cuda-memory-pool-byte-size={j}:0` for every GPU j. `--trtllm_llmapi_launch`
  is how TensorRT-LLM's own Triton test (`tests/integration/defs/triton_server/test_triton_llm.py`) starts the
  `llmapi` model at TP 4 (`--no-mpi` at TP 1). tests/data/launch_triton_server_get_cmd.json records get_cmd's output
  for the layouts tests/stages/package/test_launch_plan.py compares with ours, flag by flag.
- TensorRT-LLM `tensorrt_llm/llmapi/trtllm-llmapi-launch`: rank 0 runs the command (the server) beside the MGMN
  leader, ranks >= 1 run `tensorrt_llm.llmapi.mgmn_worker_node` (their command is not run).
- TensorRT-LLM `cpp/tensorrt_llm/executor/executorImpl.cpp`: `initializeOrchestrator` checks "When using the
  orchestrator mode and isOrchestrator is true, expect MPI worldSize to be 1." and `MPI_Comm_spawn`s tp*pp*cp
  workers from `MPI_COMM_SELF`; `initializeWorkers` checks "When specifying deviceIds, deviceIds (%lu) * numNodes (%u)
  must be equal to tp*pp*cp". Nothing refuses two models sharing a GPU (the draft on the target's first GPU is the
  recommended layout, examples/draft_target_model/README.md).
- tensorrtllm_backend `docs/llama_multi_instance.md`: "If `MPI_Comm_Spawn` is used, it is not possible to distribute
  the model across multiple nodes." Leader mode runs under mpirun/srun across nodes.

Our argv adds, to the launcher's, the endpoint addresses, `--log-verbose`, and endpoints off on leader ranks >= 1
(their backend never serves; upstream leaves them on the same ports). Orchestrator mode keeps spawning on
(upstream's default): one MPI process for every platform and no `participant_ids` in the configs. `--disable-spawn-processes` would need participant ids (rank 0 the orchestrator, then each model's
ranks: world size 1 + draft TP + target TP×PP) and an MPI world started by the platform; it buys fast logits only.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.core.errors import PipelineError, ServeError
from pipeline.core.manifests import RepoManifest
from pipeline.core.runtimes import RepoKind, runtime_named, runtime_of
from pipeline.stages.package import pbtxt
from pipeline.stages.package.serve_plan import LLMAPI_LAUNCH

Mode = Literal["single", "leader", "orchestrator", "llmapi", "cpu-reference"]
MODES: tuple[str, ...] = ("single", "leader", "orchestrator", "llmapi", "cpu-reference")
TARGET_MODEL, DRAFT_MODEL = "tensorrt_llm", "tensorrt_llm_draft"
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
# tritonserver's HTTP frontend (2.5x) copies a request body onto its worker thread's stack: with the usual 8 MiB
# stack a body of a few MB kills the server (SIGSEGV, measured from ~7 MB). Threads take RLIMIT_STACK as their stack
# size (reserved, touched only as used), so every rank runs with 1 GiB (`serve` here, the deployed rank scripts):
# bodies up to about that reach the models, which refuse oversized text by bytes. A front proxy must cap bodies below
# it.
SERVER_STACK_BYTES = 1 << 30
ORCHESTRATOR_ASSERT = ("World size must be 1 when using multi-model without disable-spawn-processes. Processes will "
                       "be spawned automatically to run the multi-GPU models")
UPSTREAM: dict[str, str] = {
    "single": "tensorrtllm_backend scripts/launch_triton_server.py --world_size 1: one tritonserver",
    "leader": "tensorrtllm_backend scripts/launch_triton_server.py get_cmd: mpirun -n 1 tritonserver ... : per rank; "
              "ranks != 0 --model-control-mode=explicit --load-model=tensorrt_llm, shm-region-prefix-name=prefix{i}_",
    "orchestrator": "tensorrtllm_backend scripts/launch_triton_server.py --multi-model: assert world_size == 1, "
                    f"'{ORCHESTRATOR_ASSERT}'; mpirun -n 1 tritonserver ... :; TRTLLM_ORCHESTRATOR=1, "
                    "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1; add_multi_model_config memory-pool flags; "
                    "executorImpl.cpp initializeOrchestrator MPI_Comm_spawn on this node",
    "llmapi": "TensorRT-LLM LLM API Triton model (tensorrt_llm.LLM in model.py): TP*PP 1, one tritonserver "
              "(launch_triton_server.py --no-mpi); more, launch_triton_server.py --trtllm_llmapi_launch: "
              "mpirun -n 1 trtllm-llmapi-launch tritonserver ... : per rank",
    "cpu-reference": "FACTS §5: the nvidia-pytriton tritonserver 2.51 with the Python backend",
}


@dataclass(frozen=True)
class EngineModel:
    """One TensorRT-LLM Triton model (`tensorrtllm` backend, or the LLM-API model): its TP×PP ranks and the GPUs its
    `gpu_device_ids` names (empty: unset)."""

    name: str
    world_size: int
    gpu_device_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class RepoShape:
    """What the launch depends on: the repository's kind and its TensorRT-LLM models."""

    kind: RepoKind
    engine_models: tuple[EngineModel, ...] = ()


@dataclass(frozen=True)
class Endpoints:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002


@dataclass(frozen=True)
class ServerArgs:
    """What every tritonserver process of a plan is started with.

    Args:
        repo: the repository (a path, or a shell word the caller substitutes).
        binary: the tritonserver program (the pytriton bundle's for cpu-reference; default: on PATH).
        shm_prefix: Python-backend shared-memory prefix; process i uses `rank_shm_prefix(shm_prefix, i)`.
        extra_args: appended to the single process's argv (cpu-reference: backend and cache directories).
    """

    repo: str
    binary: str = "tritonserver"
    endpoints: Endpoints = Endpoints()
    shm_prefix: str = "prefix"
    log_verbose: int = 0
    exit_timeout_s: int = 10
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    """The processes a platform starts for one repository: `ranks[i]` is process i's exact argv (tritonserver, or
    trtllm-llmapi-launch before it); `mpi`: they run under MPI (upstream get_cmd's `use_mpi`)."""

    mode: Mode
    ranks: tuple[tuple[str, ...], ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment (orchestrator vars)
    nodes: int = 1
    source: str = ""
    mpi: bool = False

    @property
    def processes(self) -> int:
        return len(self.ranks)

    @property
    def ranks_launched(self) -> bool:
        """The platform starts world-size processes (mpirun/srun); otherwise one process."""
        return self.processes > 1

    @property
    def own_mpirun(self) -> bool:
        """One process that runs under an `mpirun -n 1` of its own (orchestrator mode: MPI_Comm_spawn needs an MPI
        runtime that can spawn), started by the platform as a plain process."""
        return self.mpi and not self.ranks_launched

    def local_argv(self, mpirun: str = "mpirun", *, oversubscribe: bool = False) -> list[str]:
        """One command line that starts every process on this host: get_cmd's `mpirun --allow-run-as-root
        [--oversubscribe] -n 1 ... : -n 1 ...` when the plan runs under MPI (without its trailing `:`)."""
        if not self.mpi:
            return list(self.ranks[0])
        argv = [mpirun, "--allow-run-as-root", *(["--oversubscribe"] if oversubscribe else [])]
        for i, rank in enumerate(self.ranks):
            argv += [*([":"] if i else []), "-n", "1", *rank]
        return argv

    def process_argv(self, rank: int, *, oversubscribe: bool = False) -> list[str]:
        """What process `rank` runs when the platform starts the processes (deploy): its rank argv (the platform's
        MPI launcher starts world-size ones), or for an `own_mpirun` plan the whole `mpirun -n 1 ...` line."""
        return self.local_argv(oversubscribe=oversubscribe) if self.own_mpirun else list(self.ranks[rank])

    def format(self) -> str:
        """The plan as shell lines (env, then the command), with the mode and its upstream source as comments."""
        lines = [f"# mode {self.mode}: {self.processes} process(es) on {self.nodes} node(s)",
                 f"# upstream: {self.source}"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        lines.append(shlex.join(self.local_argv()))
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"mode": self.mode, "processes": self.processes, "nodes": self.nodes, "env": dict(self.env),
                "ranks": [list(r) for r in self.ranks], "mpi": self.mpi, "source": self.source}


# ------------------------------------------------------------------------------------------------- shapes
def shape_from_spec(spec) -> RepoShape:
    """The repository `package` makes from `spec` (no file read): its kind and TensorRT-LLM models."""
    kind = runtime_of(spec).repo_kind
    if kind == "llmapi":
        return RepoShape(kind, (EngineModel(TARGET_MODEL, spec.parallelism.world_size),))
    if kind != "engine":
        return RepoShape(kind)
    if spec.draft_model is None:
        return RepoShape("engine", (EngineModel(TARGET_MODEL, spec.parallelism.world_size),))
    return RepoShape("engine", (
        EngineModel(TARGET_MODEL, spec.parallelism.world_size, tuple(spec.target_gpu_device_ids)),
        EngineModel(DRAFT_MODEL, spec.draft_tp, tuple(spec.draft_gpu_device_ids)),
    ))


def _device_ids(text: str, model: str, error: type[PipelineError]) -> tuple[int, ...]:
    text = text.strip()
    if not text or text.startswith("${"):
        return ()
    if ";" in text:
        raise error(f"{model}: gpu_device_ids {text!r} lists several instances; this pipeline packages one instance "
                    "per model: re-run `invoke package`")
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise error(f"{model}: gpu_device_ids {text!r} is not a comma-separated list of GPU ids; "
                    "re-run `invoke package`") from None


def shape_from_repo(repo: Path, *, world_size: int | None = None,
                    error: type[PipelineError] = ServeError) -> RepoShape:
    """The kind and TensorRT-LLM models of the repository at `repo` (its manifest and config.pbtxt files).

    `world_size` overrides the manifest's for `tensorrt_llm` (and the LLM-API model); another engine model's world
    size is the length of its `gpu_device_ids` (1 when unset).
    """
    manifest = RepoManifest.read(repo, strict=False)
    backend = runtime_named(manifest.runtime, manifest.target) if manifest is not None else None
    if manifest is not None and backend is not None and backend.llmapi:
        return RepoShape(backend.repo_kind, (EngineModel(TARGET_MODEL, world_size or manifest.world_size),))
    models = []
    for cfg_path in sorted(Path(repo).glob("*/config.pbtxt")):
        cfg = pbtxt.read(cfg_path)
        if cfg.backend != "tensorrtllm":
            continue
        name = cfg_path.parent.name
        ids = _device_ids(pbtxt.parameter(cfg, "gpu_device_ids"), name, error)
        world = len(ids) or 1
        if name == TARGET_MODEL:
            world = world_size or (manifest.world_size if manifest is not None else world)
        models.append(EngineModel(name, world, ids))
    return RepoShape("engine", tuple(models)) if models else RepoShape("reference")


# ------------------------------------------------------------------------------------------------- the plan
def rank_shm_prefix(shm_prefix: str, rank: int) -> str:
    """Process `rank`'s Python-backend shared-memory prefix (upstream: prefix{i}_)."""
    return f"{shm_prefix}{rank}_"


def _common(server: ServerArgs) -> list[str]:
    ep = server.endpoints
    return [
        f"--model-repository={server.repo}",
        f"--http-address={ep.host}", f"--http-port={ep.http_port}",
        f"--grpc-address={ep.host}", f"--grpc-port={ep.grpc_port}",
        f"--metrics-address={ep.host}", f"--metrics-port={ep.metrics_port}",
        f"--backend-config=python,shm-region-prefix-name={rank_shm_prefix(server.shm_prefix, 0)}",
        f"--exit-timeout-secs={server.exit_timeout_s}",
        f"--log-verbose={server.log_verbose}",
    ]


def _worker(server: ServerArgs, model: str, rank: int) -> tuple[str, ...]:
    """Rank >= 1 (leader mode, LLM-API ranks): only the TensorRT-LLM model, no endpoints."""
    return (server.binary, f"--model-repository={server.repo}", "--allow-http=false", "--allow-grpc=false",
            "--allow-metrics=false", "--model-control-mode=explicit", f"--load-model={model}",
            f"--backend-config=python,shm-region-prefix-name={rank_shm_prefix(server.shm_prefix, rank)}",
            f"--exit-timeout-secs={server.exit_timeout_s}", f"--log-verbose={server.log_verbose}",
            "--disable-auto-complete-config")


def _check_orchestrator(models: tuple[EngineModel, ...], nodes: int, gpus_per_node: int | None,
                        error: type[PipelineError]) -> int:
    """The GPUs of the node the orchestrator's models use; refuses what the backend cannot spawn."""
    names = " + ".join(m.name for m in models)
    for m in models:
        if nodes > 1 or (gpus_per_node and m.world_size > gpus_per_node):
            where = f"{nodes} nodes" if nodes > 1 else f"{gpus_per_node} GPUs per node"
            raise error(
                f"{names} (draft-target) runs in orchestrator mode, which spawns every model's ranks on the server's "
                f"own node (MPI_Comm_spawn; tensorrtllm_backend docs/llama_multi_instance.md), but {m.name} has "
                f"{m.world_size} ranks over {where}; keep the target within one node (tp×pp <= GPUs per node) "
                "or serve it without --draft (leader mode spans nodes)")
        ids = m.gpu_device_ids
        if ids and len(ids) != m.world_size:
            raise error(f"{m.name}: gpu_device_ids {','.join(map(str, ids))} name {len(ids)} GPU(s) for "
                        f"{m.world_size} rank(s) (the executor requires one per rank); re-run `invoke package`")
        if len(set(ids)) != len(ids):
            raise error(f"{m.name}: gpu_device_ids {','.join(map(str, ids))} repeat a GPU (one rank per GPU within "
                        "a model); fix --draft-gpu-device-ids and re-run `invoke package`")
        if gpus_per_node and ids and max(ids) >= gpus_per_node:
            raise error(f"{m.name}: gpu_device_ids {','.join(map(str, ids))} go beyond the node's {gpus_per_node} "
                        "GPU(s); place the draft on the target's GPUs (--draft-gpu-device-ids 0) or give the node "
                        "more GPUs")
    used = [i for m in models for i in (m.gpu_device_ids or range(m.world_size))]
    return gpus_per_node or max(used) + 1


def plan_launch(shape: RepoShape, server: ServerArgs, *, nodes: int = 1, gpus_per_node: int | None = None,
                error: type[PipelineError] = ServeError) -> LaunchPlan:
    """The launch plan of a repository of `shape`, each process started as `server` says.

    Args:
        nodes, gpus_per_node: the host shape (`serve`: this host; deploy: the placement). GPUs per node, when
            known, bound each model's `gpu_device_ids` and size the orchestrator's memory-pool flags.
        error: the error class for layouts upstream cannot launch (ServeError / DeployError, exit 2).

    Raises:
        `error`: a draft-target repository whose target spans nodes or whose GPU ids the backend refuses.
    """
    binary, common = server.binary, _common(server)
    if shape.kind == "reference":
        return LaunchPlan("cpu-reference", ((binary, *common, *server.extra_args),),
                          source=UPSTREAM["cpu-reference"])
    models = shape.engine_models
    if shape.kind == "llmapi":
        world = models[0].world_size if models else 1
        first = (binary, *common, "--disable-auto-complete-config")
        if world <= 1:
            return LaunchPlan("llmapi", (first,), source=UPSTREAM["llmapi"])
        ranks = [(LLMAPI_LAUNCH, *first)] + [
            (LLMAPI_LAUNCH, *_worker(server, models[0].name, r)) for r in range(1, world)]
        return LaunchPlan("llmapi", tuple(ranks), nodes=nodes, source=UPSTREAM["llmapi"], mpi=True)
    if len(models) > 1:
        gpus = _check_orchestrator(models, nodes, gpus_per_node, error)
        pools = ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
                 *(f"--cuda-memory-pool-byte-size={j}:0" for j in range(gpus))]
        argv = (binary, *common, *pools, "--disable-auto-complete-config")
        return LaunchPlan("orchestrator", (argv,), dict(ORCHESTRATOR_ENV), 1, UPSTREAM["orchestrator"], mpi=True)
    world = models[0].world_size if models else 1
    first = (binary, *common, "--disable-auto-complete-config")
    if world <= 1:
        return LaunchPlan("single", (first,), source=UPSTREAM["single"])
    ranks = [first] + [_worker(server, models[0].name, r) for r in range(1, world)]
    return LaunchPlan("leader", tuple(ranks), nodes=nodes, source=UPSTREAM["leader"], mpi=True)
