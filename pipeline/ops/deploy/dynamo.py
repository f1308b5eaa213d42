"""`deploy --platform dynamo`: a NVIDIA Dynamo DynamoGraphDeployment serving a `--runtime pytorch` release.

What is rendered (`dynamo.yaml`, validated by `pipeline.ops.deploy.dynamo_validate` before anything is written):
- a ConfigMap `<name>-dynamo` with fetch-verify.sh (the release fetched, verified and unpacked on each worker node by
  the pipeline image's init container, as the Kubernetes target does; it also links the checkpoint to
  `/work/serve/<name>`) and the LLM-API YAML of each worker role: the build's own options (`llm_api_options`) with
  KV block reuse, and what the mode needs (disagg: `cache_transceiver_config` for the prefill -> decode KV
  transfer, overlap scheduler off on prefill; KV routing: `kv_cache_config.event_buffer_max_size` on the workers
  that publish KV events, aggregated and prefill, the buffer the events are read from);
- a `DynamoGraphDeployment` (`nvidia.com/v1beta1`): a Frontend (`python3 -m dynamo.frontend --router-mode kv |
  round-robin`) and either `replicas` aggregated workers or `replicas` prefill plus `replicas` decode workers
  (`python3 -m dynamo.trtllm --model-path ... --extra-engine-args <YAML> [--disaggregation-mode prefill|decode]
  [--publish-kv-events] --publish-metrics`), each worker the spec's TP x PP on one node or, across nodes, through
  the component's own `multinode.nodeCount`.

A speculative build's draft checkpoint or EAGLE-3 head travels in the release: fetch-verify links it as
`/work/serve/<name>.draft`, the `speculative_model_dir` of every worker role (Dynamo's own TensorRT-LLM EAGLE
example gives prefill and decode workers the same `speculative_config`: examples/backends/trtllm/engine_configs/
llama4/eagle/).

Refused with the fix: engine builds (Dynamo's TRT-LLM worker runs the PyTorch backend only), KV routing with block
reuse off, a disaggregated worker YAML
without cache transfer, and a Dynamo version outside `RELEASES` (one row per version: CRD apiVersion and schema, the
runtime image, the TensorRT-LLM its `[trtllm]` extra pins, the router flags it takes and those the next release
removes, which are never rendered).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.runtimes import runtime_of
from pipeline.core.errors import DeployError, SpecError
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import k8s, scheduling, topology
from pipeline.ops.deploy.dynamo_validate import DGD_KIND, DGD_SCHEMA, MAIN_CONTAINER, validate_dgd
from pipeline.ops.deploy.runtime import CONFIG, HTTP_PORT, SERVE_DIR, WORK
from pipeline.ops.deploy.serve_inputs import DRAFT_SUFFIX
from pipeline.ops.deploy.validate import validate_objects
from pipeline.planning.placement import Placement, place
from pipeline.stages.package.llmapi_options import llm_api_options

MODES = ("agg", "disagg")
ROUTERS = ("kv", "round-robin")
SYSTEM_PORT = 9090  # DYN_SYSTEM_PORT: a worker's /metrics (TensorRT-LLM's trtllm_* series with --publish-metrics)
SYSTEM_PORT_NAME = "system"
KV_EVENT_BUFFER = 100_000  # kv_cache_config.event_buffer_max_size (the worker's own default when unset)
CACHE_TRANSCEIVER = {"backend": "DEFAULT"}  # cache_transceiver_config of prefill and decode workers
WORKER_LABEL = {"app.kubernetes.io/component": "dynamo-worker"}  # the pods the PodMonitor scrapes


@dataclass(frozen=True)
class DynamoRelease:
    """What one Dynamo release takes: the CRD, the runtime image, the TensorRT-LLM its workers run, router flags."""

    version: str
    api_version: str
    schema: Path
    runtime_image: str
    trtllm: str  # the `[trtllm]` extra's TensorRT-LLM pin: the LLM-API YAML must be valid for it
    router_flags: dict[str, tuple[str, ...]]  # --router value -> the frontend's router argv
    removed_next: tuple[str, ...]  # frontend flags the next release removes (never rendered)


RELEASES: dict[str, DynamoRelease] = {
    "1.6.1": DynamoRelease(
        version="1.6.1", api_version="nvidia.com/v1beta1", schema=DGD_SCHEMA,
        runtime_image="nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1", trtllm="1.3.0rc29",
        router_flags={"kv": ("--router-mode", "kv", "--router-kv-events"), "round-robin": ("--router-mode",
                                                                                          "round-robin")},
        removed_next=("--router-kv-overlap-score-credit", "--router-kv-overlap-score-credit-decay",
                      "--router-kv-overlap-score-weight", "--router-temperature", "--router-queue-threshold",
                      "--router-prefill-policy", "--router-decode-policy", "--router-queue-policy", "--load-aware")),
}
DEFAULT_VERSION = "1.6.1"


def release_for(version: str | None) -> DynamoRelease:
    """The table's row of `version` (None: DEFAULT_VERSION); DeployError for any other."""
    version = version or DEFAULT_VERSION
    if version not in RELEASES:
        raise DeployError(f"--dynamo-version {version!r}: this pipeline renders Dynamo {', '.join(RELEASES)} only (its "
                          "CRD schema, images, router flags and TensorRT-LLM pin are checked); use --dynamo-version "
                          f"{DEFAULT_VERSION}")
    return RELEASES[version]


def check_build(spec: BuildSpec) -> None:
    """Refuse a build Dynamo's TRT-LLM worker cannot serve from the ConfigMap's options."""
    if not runtime_of(spec).deploys_on("dynamo"):
        raise DeployError(f"--platform dynamo: Dynamo's TRT-LLM worker runs TensorRT-LLM's PyTorch backend only, and "
                          f"this build is --runtime {spec.runtime} --target {spec.target}; build it with --runtime "
                          "pytorch, or deploy the engines with --platform k8s")


def publishes_kv_events(role: str, router: str) -> bool:
    """KV routing scores prefix overlap where prefill runs: aggregated and prefill workers publish KV events."""
    return router == "kv" and role != "decode"


def worker_options(spec: BuildSpec, role: str, router: str, served: str) -> dict[str, Any]:
    """The LLM-API options of a worker `role` (agg, prefill, decode) behind `router`: the build's own (a draft or
    EAGLE-3 head at the link fetch-verify makes for model `served`), with what the mode needs (see the module doc),
    checked by `check_worker_options`."""
    draft = f"{WORK}/{SERVE_DIR}/{served}{DRAFT_SUFFIX}" if spec.draft_model is not None else None
    options = llm_api_options(spec, draft_dir=draft).as_dict()
    kv = dict(options["kv_cache_config"])
    if publishes_kv_events(role, router):
        kv["event_buffer_max_size"] = KV_EVENT_BUFFER
    options["kv_cache_config"] = kv
    if role != "agg":
        options["cache_transceiver_config"] = dict(CACHE_TRANSCEIVER)
    if role == "prefill":
        options["disable_overlap_scheduler"] = True  # not supported on prefill-only workers
    check_worker_options(options, role, router)
    return options


def check_worker_options(options: dict[str, Any], role: str, router: str) -> None:
    """Refuse worker options the mode cannot run with: KV routing without block reuse (the router finds nothing to
    reuse) or KV events, a prefill/decode worker without cache transfer."""
    kv = options.get("kv_cache_config") or {}
    if router == "kv" and kv.get("enable_block_reuse") is False:
        raise DeployError("--router kv with KV block reuse off: the router routes on reused blocks and would find "
                          "none; drop --no-kv-reuse, or use --router round-robin")
    if publishes_kv_events(role, router) and not kv.get("event_buffer_max_size"):
        raise DeployError(f"{role} worker: --router kv needs kv_cache_config.event_buffer_max_size (the KV events the "
                          "router reads); re-render with this pipeline")
    if role != "agg" and not options.get("cache_transceiver_config"):
        raise DeployError(f"--mode disagg: the {role} worker has no cache_transceiver_config, so the prefill -> decode "
                          "KV transfer cannot run; re-render with this pipeline, or use --mode agg")


def options_file(role: str) -> str:
    return f"llm-api-{role}.yaml"


def options_yaml(options: dict[str, Any], release: DynamoRelease, role: str) -> str:
    head = (f"# LLM-API options of the Dynamo {release.version} {role} worker (--extra-engine-args). Its workers run "
            f"TensorRT-LLM {release.trtllm} (the [trtllm] extra's pin),\n# while these options are the build's "
            "(TensorRT-LLM 1.2 field names): they must be valid for that version.\n")
    return head + yaml.safe_dump(options, sort_keys=False)


@dataclass(frozen=True)
class Role:
    """One worker role of the graph (agg, prefill or decode): its spec (TP, limits), placement and copies."""

    name: str
    spec: BuildSpec
    placement: Placement
    copies: int


def worker_roles(spec: BuildSpec, placement: Placement, mode: str, replicas: int) -> tuple[Role, ...]:
    """The graph's worker roles: `replicas` aggregated workers, or prefill and decode workers: the spec's planned
    unit (`serving_target.disagg`: its prefill TP, each role's workers per unit, `replicas` units) or `replicas` of
    each at the spec's layout.

    Raises:
        DeployError: the planned prefill TP does not fit or place on this hardware.
    """
    disagg = spec.serving_target.disagg if spec.serving_target is not None else None
    if mode == "agg":
        return (Role("agg", spec, placement, replicas),)
    if disagg is None:
        return Role("prefill", spec, placement, replicas), Role("decode", spec, placement, replicas)
    try:
        prefill = topology.with_parallelism(spec, disagg.prefill_tp, 1, 1)
        prefill_placement = place(disagg.prefill_tp, 1, prefill.hardware)
    except SpecError as exc:
        raise DeployError(f"serving_target.disagg.prefill_tp={disagg.prefill_tp}: {exc}") from None
    return (Role("prefill", prefill, prefill_placement, replicas * disagg.prefill_workers),
            Role("decode", spec, placement, replicas * disagg.decode_workers))


def role_gpus(roles: tuple[Role, ...]) -> int:
    """GPUs the workers hold: each role's copies x its world size."""
    return sum(r.copies * r.placement.world_size for r in roles)


@dataclass(frozen=True)
class Graph:
    """What the graph serves and how: `k` the Kubernetes options (names, images, release, scheduling)."""

    k: k8s.K8sOptions
    roles: tuple[Role, ...]
    router: str
    release: DynamoRelease
    image: str


def _labels(g: Graph, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "trtllm-pipeline", "app.kubernetes.io/instance": g.k.name, **extra}


def _frontend(g: Graph) -> dict[str, Any]:
    args = ["-m", "dynamo.frontend", "--http-port", str(HTTP_PORT), *g.release.router_flags[g.router]]
    main = {"name": MAIN_CONTAINER, "image": g.image, "command": ["python3"], "args": args,
            "ports": [{"name": "http", "containerPort": HTTP_PORT}]}
    return {"name": "Frontend", "type": "frontend", "replicas": 1,
            "podTemplate": {"metadata": {"labels": _labels(g)}, "spec": {"containers": [main], **k8s._placement(g.k, 0)}}}


def _worker(g: Graph, r: Role, served: str) -> dict[str, Any]:
    """One worker component (role agg -> type worker) of `r.copies` copies, each `r.placement` wide."""
    role, p, gpus = r.name, r.placement, r.placement.ranks_per_node
    k = g.k if g.k.memory_bytes is None else g.k.model_copy(update={  # this role's pod: its ranks' CPUs and memory
        "cpus": scheduling.host_cpus(p), "memory_bytes": scheduling.host_memory_bytes(r.spec, p)})
    args = ["--model-path", f"{WORK}/{SERVE_DIR}/{served}", "--served-model-name", served,
            "--extra-engine-args", f"{CONFIG}/{options_file(role)}"]
    if role != "agg":
        args += ["--disaggregation-mode", role]
    if publishes_kv_events(role, g.router):
        args.append("--publish-kv-events")
    args.append("--publish-metrics")
    main = {"name": MAIN_CONTAINER, "image": g.image, "command": ["python3", "-m", "dynamo.trtllm"], "args": args,
            "env": [{"name": "WORK", "value": WORK}, {"name": "DYN_SYSTEM_PORT", "value": str(SYSTEM_PORT)},
                    *({"name": k, "value": v} for k, v in g.k.nccl_env.items())],
            "ports": [{"name": SYSTEM_PORT_NAME, "containerPort": SYSTEM_PORT}],
            "resources": k8s._server_resources(k, gpus),
            "volumeMounts": [{"name": "work", "mountPath": WORK}, {"name": "config", "mountPath": CONFIG}]}
    if g.k.extra_resources:  # RDMA registers (pins) memory
        main["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{g.k.name}-dynamo", "defaultMode": k8s.SCRIPT_MODE}},
        {"name": "work", "emptyDir": {"sizeLimit": k8s.quantity(g.k.work_bytes or 0)}}]
    if g.k.release_pvc:
        volumes.append({"name": "releases",
                        "persistentVolumeClaim": {"claimName": g.k.release_pvc, "readOnly": True}})
    pod = {"initContainers": [k8s._fetch_container(g.k, gpus, copy_kubectl=False)], "containers": [main],
           "volumes": volumes, **k8s._placement(g.k, gpus)}
    component: dict[str, Any] = {
        "name": {"agg": "TRTLLMWorker", "prefill": "prefill", "decode": "decode"}[role],
        "type": "worker" if role == "agg" else role, "replicas": r.copies,
        "podTemplate": {"metadata": {"labels": _labels(g, **WORKER_LABEL)}, "spec": pod}}
    if p.multi_node:
        component["multinode"] = {"nodeCount": p.nodes}
    return component


def graph_deployment(g: Graph) -> dict[str, Any]:
    served = g.k.name
    return {"apiVersion": g.release.api_version, "kind": DGD_KIND,
            "metadata": {"name": g.k.name, "namespace": g.k.namespace, "labels": _labels(g)},
            "spec": {"backendFramework": "trtllm",
                     "components": [_frontend(g), *(_worker(g, r, served) for r in g.roles)]}}


def render_graph(g: Graph, fetch_verify: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the ConfigMap and the DynamoGraphDeployment, both validated; a summary for dynamo.json)."""
    data = {"fetch-verify.sh": fetch_verify}
    for r in g.roles:
        data[options_file(r.name)] = options_yaml(worker_options(r.spec, r.name, g.router, g.k.name), g.release,
                                                  r.name)
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": f"{g.k.name}-dynamo", "namespace": g.k.namespace, "labels": _labels(g)},
              "data": data}
    dgd = graph_deployment(g)
    validate_objects([config])
    validate_dgd(dgd, api_version=g.release.api_version, schema=g.release.schema)
    summary = {"dynamo_version": g.release.version, "api_version": g.release.api_version,
               "mode": "agg" if g.roles[0].name == "agg" else "disagg", "router": g.router, "image": g.image,
               "worker_trtllm": g.release.trtllm,
               "components": {c["name"]: c["replicas"] for c in dgd["spec"]["components"]},
               "worker_tp": {r.name: r.placement.tp for r in g.roles}, "worker_gpus": role_gpus(g.roles),
               "note": f"the LLM-API YAMLs are the build's options; Dynamo {g.release.version}'s workers run "
                       f"TensorRT-LLM {g.release.trtllm}: they must be valid for that version"}
    return [config, dgd], summary

