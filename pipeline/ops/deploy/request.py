"""A deployment request (`DeployRequest`, one field per `deploy` flag) checked and rendered: `deploy` picks the
topology, renders and writes the directory, and says what it wrote (`Deployed`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.core.errors import DeployError
from pipeline.core.layout import release_file
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import dynamo, names, render, scheduling, source, topology
from pipeline.planning.limits_choice import choose_limits


@dataclass(frozen=True)
class DeployRequest:
    """What `deploy` is asked for; None: the default its help names. Numbers and choices arrive checked
    (`pipeline.cli.flags`); combinations are checked here."""

    platform: str | None = None
    release: str | None = None
    output: str | None = None
    name: str | None = None
    namespace: str | None = None
    release_url: str | None = None
    release_volume: str | None = None
    release_secret: str | None = None
    image: str | None = None
    pipeline_image: str | None = None
    pipeline_cmd: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str | None = None
    no_container: bool = False
    max_nodes: int | None = None
    matrix: str | None = None
    matrix_target: str | None = None
    matrix_output: str | None = None
    force: bool = False
    json: bool = False
    serve_mode: str | None = None
    replicas: int | None = None
    release_version: str | None = None
    exclusive: bool = False
    mpi: str | None = None
    keep_work: bool = False
    node_selector: list[str] = field(default_factory=list)
    toleration: list[str] = field(default_factory=list)
    gpu_product_label: str | None = None
    no_gpu_affinity: bool = False
    rdma_resource: list[str] = field(default_factory=list)
    nccl_env: list[str] = field(default_factory=list)
    monitoring_label: list[str] = field(default_factory=list)
    prefix_cache_alert: bool = False
    mode: str | None = None
    router: str | None = None
    dynamo_version: str | None = None

    def given(self, flags: dict[str, str]) -> list[str]:
        """The flags (`--flag`: field name) of `flags` this request sets."""
        return [flag for flag, name in flags.items() if getattr(self, name)]


_SLURM_ONLY = {"--account": "account", "--qos": "qos", "--constraint": "constraint", "--time": "time",
               "--exclusive": "exclusive", "--mpi": "mpi", "--keep-work": "keep_work"}
_K8S_ONLY = {"--node-selector": "node_selector", "--toleration": "toleration",
             "--gpu-product-label": "gpu_product_label", "--no-gpu-affinity": "no_gpu_affinity",
             "--rdma-resource": "rdma_resource", "--nccl-env": "nccl_env"}
_DYNAMO_ONLY = {"--mode": "mode", "--router": "router", "--dynamo-version": "dynamo_version"}
_KUBERNETES = ("k8s", "dynamo")  # platforms that render Kubernetes objects
_SERVING_ONLY = {"--replicas": "replicas", "--release-version": "release_version", "--exclusive": "exclusive",
                 "--mpi": "mpi", "--keep-work": "keep_work", "--monitoring-label": "monitoring_label",
                 "--prefix-cache-alert": "prefix_cache_alert"}


@dataclass(frozen=True)
class Deployed:
    """What `deploy` wrote: `summary` (deploy.json's content plus directory and files), the warnings of the spec it
    settled on, and one line for a person."""

    summary: dict[str, Any]
    warnings: tuple[str, ...]
    line: str


def _check_platform_flags(r: DeployRequest) -> None:
    if r.platform != "slurm" and (given := r.given(_SLURM_ONLY)):
        raise DeployError(f"{', '.join(given)}: Slurm options; drop them or use --platform slurm")
    if r.platform != "dynamo" and (given := r.given(_DYNAMO_ONLY)):
        raise DeployError(f"{', '.join(given)}: NVIDIA Dynamo options; drop them or use --platform dynamo")
    if r.platform not in _KUBERNETES and (given := r.given(_K8S_ONLY)):
        raise DeployError(f"{', '.join(given)}: Kubernetes options; drop them or use --platform k8s (Slurm: "
                          "--constraint)")
    if r.gpu_product_label and r.no_gpu_affinity:
        raise DeployError("--gpu-product-label and --no-gpu-affinity: give one of them")
    if r.monitoring_label and r.platform not in _KUBERNETES:
        raise DeployError("--monitoring-label labels the PrometheusRule, PodMonitor and dashboard ConfigMap; Slurm "
                          "deployments have none, so drop it or use --platform k8s")
    if r.release_secret and (r.platform not in _KUBERNETES or not r.release_url):
        raise DeployError("--release-secret names a Kubernetes Secret; on Slurm export RELEASE_AUTH_HEADER in the "
                          "shell that runs sbatch instead" if r.platform == "slurm" else
                          "--release-secret without --release-url; give the URL or drop --release-secret")


def deploy_options(r: DeployRequest, name: str, replicas: int = 1) -> render.DeployOptions:
    """The renderer's options for request `r`, deployment `name` with `replicas` copies, every flag checked."""
    if r.platform not in ("k8s", "slurm", "dynamo"):
        raise DeployError(f"--platform {r.platform!r}: choose k8s, slurm or dynamo")
    _check_platform_flags(r)
    labels = dict(names.kube_label(item, "--monitoring-label") for item in r.monitoring_label)
    if reserved := sorted(set(labels) & render.MONITORING_OWN_LABELS):
        raise DeployError(f"--monitoring-label {reserved[0]}: deploy sets that label itself; choose another key")
    if r.release_url:
        names.check_release_url(r.release_url)
    opts = dict(platform=r.platform, name=render.check_name(name), namespace=r.namespace or "default",
                image=r.image or (dynamo.release_for(r.dynamo_version).runtime_image if r.platform == "dynamo" else None),
                pipeline_image=r.pipeline_image, release_url=r.release_url,
                release_volume=r.release_volume, release_secret=r.release_secret, partition=r.partition,
                account=r.account, qos=r.qos, constraint=r.constraint, time_limit=r.time,
                container=not r.no_container, serve_mode=r.serve_mode, replicas=replicas,
                exclusive=r.exclusive, mpi=r.mpi or "pmix", keep_work=r.keep_work,
                node_selector=scheduling.node_selector(r.node_selector),
                tolerations=scheduling.tolerations(r.toleration),
                gpu_product=r.gpu_product_label and names.label_value(r.gpu_product_label, "--gpu-product-label"),
                gpu_affinity=not r.no_gpu_affinity,
                rdma_resources=scheduling.extended_resources(r.rdma_resource),
                nccl_env=scheduling.nccl_env(r.nccl_env),
                monitoring_labels=labels, prefix_cache_alert=r.prefix_cache_alert,
                mode=r.mode or "agg", router=r.router or "kv", dynamo_version=r.dynamo_version)
    if r.pipeline_cmd:
        opts["pipeline_cmd"] = r.pipeline_cmd
    return render.DeployOptions(**opts)


def deploy(spec: BuildSpec | None, r: DeployRequest) -> Deployed:
    """Render and write the deployment of a release (`r.release`) or of `spec` (serving), or a build matrix
    (`r.matrix`), validated before anything is written."""
    if not r.platform:
        raise DeployError("give --platform k8s or --platform slurm")
    if r.matrix:
        if given := r.given(_SERVING_ONLY):
            raise DeployError(f"{', '.join(given)}: serving options; drop them with --matrix")
        return _deploy_matrix(spec, r, r.matrix)
    if r.release:
        if r.release_version:
            raise DeployError("--release-version names a spec's release; --release reads its own name, drop one")
        src = source.from_release(r.release)
    elif spec is not None:
        src = source.from_spec(spec, r.release_version or __version__)
    else:
        raise DeployError("give --release PATH (a release) or the spec (--model ... / --spec FILE)")
    explicit = src.origin == "release" or bool({"tp", "pp"} & src.spec.parallelism.model_fields_set)
    chosen, placement = topology.choose(src.spec, explicit=explicit, max_nodes=r.max_nodes)
    if chosen.limit_reasons:  # limits the memory model chose follow the topology deploy chose
        chosen = choose_limits(chosen)
    if src.origin == "spec":
        src = source.from_spec(chosen, r.release_version or __version__)
    else:
        src = src.model_copy(update={"spec": chosen})
    o = deploy_options(_planned_mode(r, chosen), r.name or render.default_name(chosen),
                       render.replicas_for(chosen, r.replicas))
    if r.platform == "slurm" and r.release_volume and not r.release_url:
        source.check_released(r.release_volume, src)
    dest = render.deploy_dir(r.output, o.name, o.platform)
    files = render.render_serving(o, src, placement, dest)
    render.write_directory(dest, files, force=r.force)
    summary = json.loads(files["deploy.json"]) | {"directory": str(dest), "files": sorted(files)}
    copies = f"{summary['replicas']} replicas x " if summary["replicas"] > 1 else ""
    shape = (f"{placement.nodes} node(s) x {placement.ranks_per_node} GPUs (tp={placement.tp}, pp={placement.pp}, "
             f"{placement.world_size} ranks)") if summary["gpus"] else f"one CPU process ({summary['server']})"
    if o.platform == "dynamo":
        role = "aggregated" if o.mode == "agg" else "decode"
        copies = (f"{summary['replicas']} {o.mode} workers on {summary['gpus']} GPUs (each role's TP: dynamo.json), "
                  f"each {role} worker ")
    line = f"ok: {dest}: {summary['kind']}, {copies}{shape}, image {summary['image']}"
    return Deployed(summary, tuple(chosen.warnings), line)


def _planned_mode(r: DeployRequest, spec: BuildSpec) -> DeployRequest:
    """`r` with Dynamo's mode the spec's plan sets: disagg for a planned disaggregated unit (`serving_target.disagg`),
    which only Dynamo deploys and `--mode agg` contradicts."""
    disagg = spec.serving_target.disagg if spec.serving_target is not None else None
    if disagg is None:
        return r
    unit = (f"serving_target.disagg: {disagg.prefill_workers} prefill (tp={disagg.prefill_tp}) + "
            f"{disagg.decode_workers} decode workers per unit")
    if r.platform != "dynamo":
        raise DeployError(f"the spec plans disaggregated serving ({unit}): deploy it with --platform dynamo, or "
                          "re-plan with `plan --slo --serving-mode agg` for aggregated replicas")
    if r.mode == "agg":
        raise DeployError(f"--mode agg: the spec plans disaggregated serving ({unit}); drop --mode, or re-plan with "
                          "`plan --slo --serving-mode agg`")
    return replace(r, mode="disagg")


def _deploy_matrix(spec: BuildSpec | None, r: DeployRequest, matrix: str) -> Deployed:
    base = {"target": r.matrix_target or "trtllm"}
    if spec is not None:
        base["gpu"] = spec.hardware.gpu
    cells = render.matrix_cells(matrix, base)
    o = deploy_options(_matrix_request(r), r.name or "build-matrix")
    dest = render.deploy_dir(r.output, o.name, o.platform)
    if r.platform == "slurm" and not (r.matrix_output and Path(r.matrix_output).is_absolute()):
        raise DeployError("--matrix on slurm: give --matrix-output /shared/dir (absolute) for the cells' outputs")
    if r.platform == "k8s" and r.matrix_output:
        o = o.model_copy(update={"output_pvc": r.matrix_output})
    files = render.render_matrix(o, cells, dest, r.matrix_output or "")
    render.write_directory(dest, files, force=r.force)
    summary = {"kind": "build-matrix", "platform": r.platform, "directory": str(dest), "files": sorted(files),
               "cells": [c.summary() for c in cells], "releases": [release_file(c, __version__) for c in cells]}
    return Deployed(summary, (), f"ok: {dest}: build matrix of {len(cells)} cells ({r.platform})")


def _matrix_request(r: DeployRequest) -> DeployRequest:
    """The matrix jobs serve nothing and fetch no release: the serving-only fields are dropped."""
    return replace(r, release_url=None, release_volume=None, serve_mode=None)
