"""`invoke deploy`: render every file of a deployment in memory, validate it, then write the directory in one rename.

Nothing half-written: the files go to a temporary sibling directory that replaces the destination only once all of
them are rendered, validated and written.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from pipeline import __version__
from pipeline.core.runtimes import runtime_of
from pipeline.core.artifacts import atomic_dir, output_root
from pipeline.core.errors import DeployError, SpecError, io_error
from pipeline.core.layout import release_file
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import k8s, names, scheduling, slurm
from pipeline.ops.deploy.images import PIPELINE_HOME, TRTLLM_VERSION, ngc_image, pipeline_image
from pipeline.ops.deploy.runtime import Runtime, fetch_verify_script, kubexec_script, leader_script, runtime_for
from pipeline.ops.deploy.source import DeploySource
from pipeline.ops.deploy.validate import validate_objects
from pipeline.ops.monitoring.dashboard import dashboard_config_map, dashboard_json
from pipeline.ops.monitoring.rules import prometheus_rule, rules_file, watch_plan
from pipeline.ops.monitoring.scrape import pod_monitor, scrape_config_file
from pipeline.planning.placement import Placement
from pipeline.stages.check import resolve_checked_spec
from pipeline.stages.resources import calibration_memory, serving_host_bytes

Platform = Literal["k8s", "slurm"]
NAME_MAX = 40  # DNS-1123, short enough for LWS pod names
NAME_RE = re.compile(rf"^[a-z0-9]([-a-z0-9]{{0,{NAME_MAX - 2}}}[a-z0-9])?$")
MARKER = "deploy.json"  # every deployment directory holds it: only such a directory is replaced with --force
SERVE_CPUS_PER_RANK = 4  # Slurm --cpus-per-task of a GPU serving rank (`serving_cpus`)
MATRIX_CPUS_PER_GPU = 4  # Slurm --cpus-per-task of a GPU build cell, per GPU (`matrix_cpus`)
MONITORING_OWN_LABELS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/instance", "grafana_dashboard"})
SCRAPE_TARGETS = "prometheus-targets.json"  # Slurm: the file_sd file serve.sbatch writes into the deployment directory


class DeployOptions(BaseModel):
    platform: Platform
    name: str
    namespace: str = "default"
    image: str | None = None
    pipeline_image: str | None = None
    pipeline_cmd: str = f"invoke -r {PIPELINE_HOME}"
    release_url: str | None = None
    release_secret: str | None = None  # k8s: a Secret whose key `header` the fetch sends with release_url
    release_volume: str | None = None  # k8s: a PVC name; slurm: a directory on the cluster
    partition: str | None = None
    account: str | None = None  # Slurm only, like qos, constraint and time_limit
    qos: str | None = None
    constraint: str | None = None
    time_limit: str | None = None
    container: bool = True
    exclusive: bool = False  # Slurm only, like mpi and keep_work
    mpi: str = "pmix"
    keep_work: bool = False
    serve_mode: str | None = None  # triton | trtllm-serve; None: the runtime's default (runtime.runtime_for)
    replicas: int = 1  # serving copies, each of the placement's world size (`replicas_for`)
    monitoring_labels: dict[str, str] = {}  # k8s: extra metadata labels of the PrometheusRule/PodMonitor/ConfigMap
    prefix_cache_alert: bool = False  # alert on a low prefix-cache hit ratio without a declared shared prefix
    hf_secret: str = "hf-token"
    output_pvc: str = "trtllm-build-output"
    node_selector: dict[str, str] = {}  # k8s only, like what follows (pipeline.ops.deploy.scheduling)
    tolerations: list[dict[str, str]] = [scheduling.GPU_TOLERATION]
    gpu_product: str | None = None  # the GPU product label value to require; None: the spec GPU's
    gpu_affinity: bool = True
    rdma_resources: dict[str, str] = {}
    nccl_env: dict[str, str] = {}


def default_name(spec: BuildSpec) -> str:
    """`<model>-<precision>-tp<T>[-pp<P>][-draft]` (e.g. llama-70b-fp8-tp4-draft), the model part shortened to keep
    the whole within NAME_RE's 40 characters."""
    p = spec.parallelism
    suffix = f"-{spec.quantization.precision}-tp{p.tp}" + (f"-pp{p.pp}" if p.pp > 1 else "")
    suffix = re.sub(r"[^a-z0-9-]+", "-", suffix.lower()) + ("-draft" if spec.draft_model else "")
    model = re.sub(r"[^a-z0-9-]+", "-", spec.model.name.lower()).strip("-")
    return model[:NAME_MAX - len(suffix)].rstrip("-") + suffix


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise DeployError(f"--name {name!r}: a deployment name is 1-40 lowercase letters, digits and '-', starting "
                          "and ending with a letter or digit (Kubernetes DNS-1123); e.g. llama-405b-bf16-tp8-pp2")
    return name


def _images(o: DeployOptions, trtllm_version: str) -> tuple[str, str]:
    """(server image, pipeline image): the NGC image of the release's TensorRT-LLM (or --image), and ours FROM it."""
    if o.image and o.platform == "k8s":
        names.image_reference(o.image, "--image")  # before ours is named after its tag
    server = o.image or ngc_image(trtllm_version)
    pipe = o.pipeline_image or pipeline_image(server, __version__)
    if o.platform == "k8s" and names.registry_host(pipe) is None and not o.pipeline_image:
        raise DeployError(f"the nodes pull the pipeline image {pipe!r} (the fetch/verify init container, the build "
                          "matrix), which names no registry; build and push it (README \"GPU host quick start\"), "
                          "then pass --pipeline-image REGISTRY/trtllm-pipeline:TAG")
    return server, pipe


def _k8s_options(o: DeployOptions, src: DeploySource | None, server: str, pipe: str, gpu: str,
                 p: Placement | None = None) -> k8s.K8sOptions:
    """The Kubernetes options of a serving deployment (`src` and its placement `p`) or of a build matrix on `gpu`."""
    products = (o.gpu_product,) if o.gpu_product else scheduling.GPU_PRODUCTS[gpu] if o.gpu_affinity else ()
    return k8s.K8sOptions(
        name=o.name, namespace=o.namespace, server_image=server, pipeline_image=pipe, pipeline_cmd=o.pipeline_cmd,
        release_file=src.release_file if src else "", release_url=o.release_url,
        release_secret=o.release_secret, release_pvc=o.release_volume if not o.release_url else None, sha256=src.sha256 if src else None,
        hf_secret=o.hf_secret, output_pvc=o.output_pvc, replicas=o.replicas,
        work_bytes=k8s.work_bytes(src.spec, download=bool(o.release_url)) if src else None,
        node_selector=o.node_selector, tolerations=o.tolerations, gpu_products=products,
        cpus=scheduling.host_cpus(p) if p else None,
        memory_bytes=scheduling.host_memory_bytes(src.spec, p) if src and p else None,
        extra_resources=o.rdma_resources, nccl_env=o.nccl_env)


def _slurm_options(o: DeployOptions, directory: Path, src: DeploySource | None, server: str, pipe: str, *,
                   mem_bytes: int, cpus: int) -> slurm.SlurmOptions:
    return slurm.SlurmOptions(
        name=o.name, directory=str(directory), server_image=server, pipeline_image=pipe, pipeline_cmd=o.pipeline_cmd,
        container=o.container, partition=o.partition, account=o.account, qos=o.qos, constraint=o.constraint,
        time_limit=o.time_limit, replicas=o.replicas, release_file=src.release_file if src else "",
        release_url=o.release_url, release_dir=o.release_volume if not o.release_url else None,
        sha256=src.sha256 if src else None, exclusive=o.exclusive, mpi=o.mpi, keep_work=o.keep_work,
        mem_bytes=mem_bytes, cpus_per_task=cpus)


def serving_cpus(rt: Runtime, p: Placement) -> int:
    """Cores per serving task: SERVE_CPUS_PER_RANK per GPU rank it runs (its server threads, MPI progress; rank 0
    also the tokenizer models; a one-process runtime runs the node's ranks), 1 for the CPU reference server."""
    if not rt.gpus:
        return 1
    return SERVE_CPUS_PER_RANK * (1 if rt.ranks_launched else p.ranks_per_node)


def matrix_cpus(cells: list[BuildSpec], time_limit: str) -> int:
    """Cores per build cell: MATRIX_CPUS_PER_GPU per GPU of the widest GPU cell; CPU cells: enough cores to
    calibrate the slowest cell within `time_limit` (the calibration CPU-time estimate), at least 1."""
    gpus = max((c.parallelism.world_size for c in cells if runtime_of(c).gpu), default=0)
    if gpus:
        return MATRIX_CPUS_PER_GPU * gpus
    seconds = slurm.time_seconds(time_limit)
    work = max(calibration_memory(c, "target").cpu_seconds_per_core for c in cells)
    return max(1, math.ceil(work / seconds)) if seconds else 1


def matrix_mem_bytes(cells: list[BuildSpec]) -> int:
    """Host RAM of the hungriest cell: calibration beside its GPUs, or on the CPU for a CPU cell."""
    return max(calibration_memory(c, "target").host_bytes_with_gpu if runtime_of(c).gpu else
               calibration_memory(c, "target").cpu_ram_bytes for c in cells)


def replicas_for(spec: BuildSpec, given: int | None) -> int:
    """Serving replicas: `--replicas`, else those the spec's `serving_target` provisions (`plan --slo`), else 1."""
    if given is not None:
        return given
    return spec.serving_target.replicas if spec.serving_target else 1


def _summary(src: DeploySource, p: Placement, rt: Runtime, image: str, kind: str, replicas: int) -> dict[str, Any]:
    """deploy.json: `image` is what the ranks run, `gpus` what the deployment holds (0: the CPU reference server)."""
    return {"kind": kind, "model": src.spec.model.name, "precision": src.spec.quantization.precision,
            "target": src.spec.target, "runtime": src.spec.runtime, "replicas": replicas, "tp": p.tp, "pp": p.pp,
            "world_size": p.world_size, "nodes": p.nodes,
            "ranks_per_node": p.ranks_per_node, "gpus": p.world_size * replicas if rt.gpus else 0, "image": image,
            "trtllm_version": src.trtllm_version,
            "release_file": src.release_file, "sha256": src.sha256, "origin": src.origin,
            "summary": src.spec.summary()}


def render_serving(o: DeployOptions, src: DeploySource, p: Placement, directory: Path) -> dict[str, str]:
    """filename -> content of a serving deployment (Kubernetes objects validated strictly)."""
    if not (o.release_url or o.release_volume):
        raise DeployError("deploy: say where the nodes get the release: --release-url URL (http/https) or "
                          "--release-volume NAME (k8s: a PersistentVolumeClaim; slurm: a shared directory)")
    if not runtime_of(src.spec).deploys_on(o.platform):
        raise DeployError(f"deploy serves TensorRT-LLM on GPUs, but this build is --target {src.spec.target} (the "
                          "CPU reference backend); serve it with `invoke serve`, deploy a --target trtllm build, or "
                          "(runtime engine, tests and demos) deploy it with --platform slurm")
    server, pipe = _images(o, src.trtllm_version)
    rt = runtime_for(src.spec, o.name, placement=p, platform=o.platform, serve_mode=o.serve_mode)
    scripts = {"fetch-verify.sh": fetch_verify_script(rt), "rank.sh": rt.rank_script}
    if o.platform == "k8s":
        if p.multi_node:
            scripts |= {"launch-leader.sh": leader_script(), "kubexec.sh": kubexec_script()}
        if rt.ready_script:
            scripts[k8s.READY_SCRIPT] = rt.ready_script
        objects = k8s.serving_objects(_k8s_options(o, src, server, pipe, src.spec.hardware.gpu, p), rt, p, scripts)
        validate_objects(objects)
        kind = "LeaderWorkerSet" if p.multi_node else "Deployment"
        files = {"serving.yaml": yaml.safe_dump_all(objects, sort_keys=False)}
    else:
        kind = "sbatch"
        targets = str(directory / SCRAPE_TARGETS) if rt.scrape else None
        opts = _slurm_options(o, directory, src, server, pipe, cpus=serving_cpus(rt, p), mem_bytes=serving_host_bytes(
            src.spec, ranks_per_node=p.ranks_per_node, world_size=p.world_size))
        files = {**scripts, "serve.sbatch": slurm.serve_script(opts, rt, p, scrape_targets=targets)}
        if not o.keep_work:
            files[slurm.REMOVE_WORK] = slurm.remove_work_script()
    files |= monitoring_files(o, src, p, rt, directory)
    image = pipe if rt.pipeline_image else server
    files[MARKER] = json.dumps(_summary(src, p, rt, image, kind, o.replicas) | {"server": rt.name}, indent=2) + "\n"
    return files


def monitoring_files(o: DeployOptions, src: DeploySource, p: Placement, rt: Runtime,
                     directory: Path) -> dict[str, str]:
    """Prometheus rules, how Prometheus scrapes the server as `job="<name>"` (Triton's metrics port, or trtllm-serve's
    `/prometheus/metrics`), and the Grafana dashboard. k8s: a PrometheusRule, a PodMonitor and a dashboard ConfigMap
    (validated), labelled with `o.monitoring_labels` for the operator's selectors; Slurm: a plain rules file and a
    `scrape_configs` snippet reading the target file serve.sbatch writes. Both: the dashboard's JSON."""
    if rt.scrape is None:
        return {}
    k8s_gpus = f'namespace="{o.namespace}",pod=~"{o.name}-.+"'  # dcgm-exporter's pod mapping
    w = watch_plan(src.spec, deployment=o.name, gpus=p.world_size * o.replicas, source=rt.scrape.source,
                   prefix_alert=o.prefix_cache_alert, gpu_selector=k8s_gpus if o.platform == "k8s" else "")
    if o.platform != "k8s":
        targets = slurm.replica_targets(str(directory / SCRAPE_TARGETS), o.replicas)
        return {"prometheus-rules.yml": rules_file(w),
                "prometheus-scrape.yml": scrape_config_file(o.name, targets, path=rt.scrape.path),
                "dashboard.json": dashboard_json(w)}
    labels = {**o.monitoring_labels, "app.kubernetes.io/name": "trtllm-pipeline", "app.kubernetes.io/instance": o.name}
    objects = [prometheus_rule(w, namespace=o.namespace, labels=labels),
               pod_monitor(o.name, namespace=o.namespace, labels=labels, port=rt.scrape.port, path=rt.scrape.path,
                           pod_selector=k8s.server_pod_selector(o.name, multi_node=p.multi_node)),
               dashboard_config_map(w, namespace=o.namespace, labels=labels)]
    validate_objects(objects)
    return {"monitoring.yaml": yaml.safe_dump_all(objects, sort_keys=False), "dashboard.json": dashboard_json(w)}


def matrix_cells(matrix: str, base: dict[str, Any]) -> list[BuildSpec]:
    """`MODEL:PRECISION[:TP],...` -> validated specs (the other spec flags in `base` apply to every cell)."""
    cells = []
    for item in (c.strip() for c in matrix.split(",")):
        parts = item.split(":")
        if not item or len(parts) not in (2, 3):
            raise DeployError(f"--matrix item {item!r}: expected MODEL:PRECISION[:TP], e.g. "
                              "--matrix tiny-llama:fp8,tiny-llama:int4_awq")
        over = {**base, "model": parts[0], "precision": parts[1]}
        if len(parts) == 3:
            over["tp"] = parts[2]
        try:
            cells.append(resolve_checked_spec(**over))
        except SpecError as exc:
            raise DeployError(f"--matrix item {item!r}: {exc}") from None
    return cells


def _cell_args(spec: BuildSpec) -> list[str]:
    p = spec.parallelism
    return ["--model", spec.model.name, "--precision", spec.quantization.precision, "--tp", str(p.tp),
            "--pp", str(p.pp), "--target", spec.target, "--gpu", spec.hardware.gpu]


def render_matrix(o: DeployOptions, cells: list[BuildSpec], directory: Path, output: str) -> dict[str, str]:
    """filename -> content of a build matrix (Indexed Job / job array running build-cell.sh)."""
    gpus = max((c.parallelism.world_size for c in cells if runtime_of(c).gpu), default=0)
    server, pipe = _images(o, TRTLLM_VERSION)
    scripts = {"build-cell.sh": slurm.build_cell_script([_cell_args(c) for c in cells],
                                                        [release_file(c, __version__) for c in cells])}
    if o.platform == "k8s":
        opts = _k8s_options(o, None, server, pipe, cells[0].hardware.gpu).model_copy(
            update={"cpus": matrix_cpus(cells, o.time_limit or slurm.MATRIX_TIME),
                    "memory_bytes": matrix_mem_bytes(cells)})
        objects = k8s.matrix_job(opts, len(cells), gpus, scripts)
        validate_objects(objects)
        files = {"build-matrix.yaml": yaml.safe_dump_all(objects, sort_keys=False)}
    else:
        opts = _slurm_options(o, directory, None, server, pipe, mem_bytes=matrix_mem_bytes(cells),
                              cpus=matrix_cpus(cells, o.time_limit or slurm.MATRIX_TIME))
        files = {**scripts, "build-matrix.sbatch": slurm.matrix_script(opts, len(cells), gpus, output)}
    summary = {"kind": "build-matrix", "platform": o.platform, "cells": [c.summary() for c in cells]}
    return files | {MARKER: json.dumps(summary, indent=2) + "\n"}


def deploy_dir(output: str | None, name: str, platform: str) -> Path:
    """--output as given (relative to the output tree), default `<output tree>/deploy/<platform>/<name>` (k8s and
    slurm files of one name side by side)."""
    if not output:
        return output_root() / "deploy" / platform / name
    path = Path(output)
    return (path if path.is_absolute() else output_root() / path).resolve()


def write_directory(dest: Path, files: dict[str, str], *, force: bool) -> Path:
    """Write `files` (+ an empty logs/) into `dest` atomically; an existing `dest` is replaced only with `force`, and
    only when it is an earlier deployment (it holds `deploy.json`) and not the output root, a checkout, $HOME or /."""
    if dest.exists() and not force:
        raise DeployError(f"{dest} exists; pass --force to replace it or choose another --output")
    try:
        with atomic_dir(dest, marker=MARKER, fix="choose another --output (a new directory, or an earlier deployment)"
                        ) as tmp:
            for name, text in files.items():
                (tmp / name).write_text(text)
                if name.endswith((".sh", ".sbatch")):
                    (tmp / name).chmod(0o755)
            (tmp / "logs").mkdir()
    except OSError as exc:
        raise io_error(exc, f"writing the deployment {dest}") from None
    return dest
