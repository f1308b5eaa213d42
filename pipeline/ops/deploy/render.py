"""`invoke deploy`: render every file of a deployment in memory, validate it, then write the directory in one rename.

Nothing half-written: the files go to a temporary sibling directory that replaces the destination only once all of
them are rendered, validated and written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.core.artifacts import atomic_dir, output_root
from pipeline.core.errors import DeployError, SpecError, io_error
from pipeline.core.layout import release_file
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import dynamo, slurm
from pipeline.ops.deploy.images import TRTLLM_VERSION, ngc_image, pipeline_image
from pipeline.ops.deploy.options import DeployOptions
from pipeline.ops.deploy.platforms import PLATFORMS, DeployPlatform
from pipeline.ops.deploy.runtime import Runtime, fetch_verify_script, runtime_for
from pipeline.ops.deploy.source import DeploySource
from pipeline.ops.monitoring.rules import watch_plan
from pipeline.planning.placement import Placement
from pipeline.stages.check import resolve_checked_spec

NAME_MAX = 40  # DNS-1123, short enough for LWS pod names
NAME_RE = re.compile(rf"^[a-z0-9]([-a-z0-9]{{0,{NAME_MAX - 2}}}[a-z0-9])?$")
MARKER = "deploy.json"  # every deployment directory holds it: only such a directory is replaced with --force
MONITORING_OWN_LABELS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/instance", "grafana_dashboard"})


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


def _images(o: DeployOptions, platform: DeployPlatform, trtllm_version: str) -> tuple[str, str]:
    """(server image, pipeline image): the NGC image of the release's TensorRT-LLM (or --image), and ours FROM it."""
    platform.check_image(o)  # before ours is named after its tag
    server = o.image or ngc_image(trtllm_version)
    pipe = o.pipeline_image or pipeline_image(server, __version__)
    platform.check_pipeline_image(o, pipe)
    return server, pipe


def replicas_for(spec: BuildSpec, given: int | None) -> int:
    """Serving replicas: `--replicas`, else those the spec's `serving_target` provisions (`plan --slo`), else 1."""
    if given is not None:
        return given
    return spec.serving_target.replicas if spec.serving_target else 1


def copies(o: DeployOptions, spec: BuildSpec, p: Placement) -> tuple[int, int]:
    """(serving copies, the GPUs they hold): the replicas, each of the placement's world size; Dynamo: its worker
    roles' (`dynamo.worker_roles`)."""
    if o.platform != "dynamo":
        return o.replicas, o.replicas * p.world_size
    roles = dynamo.worker_roles(spec, p, o.mode, o.replicas)
    return sum(r.copies for r in roles), dynamo.role_gpus(roles)


def _summary(src: DeploySource, p: Placement, rt: Runtime, image: str, kind: str, held: tuple[int, int]
             ) -> dict[str, Any]:
    """deploy.json: `image` is what the ranks run, `gpus` what the deployment holds (0: the CPU reference server)."""
    replicas, gpus = held
    return {"kind": kind, "model": src.spec.model.name, "precision": src.spec.quantization.precision,
            "target": src.spec.target, "runtime": src.spec.runtime, "replicas": replicas, "tp": p.tp, "pp": p.pp,
            "world_size": p.world_size, "nodes": p.nodes,
            "ranks_per_node": p.ranks_per_node, "gpus": gpus if rt.gpus else 0, "image": image,
            "trtllm_version": src.trtllm_version,
            "release_file": src.release_file, "sha256": src.sha256, "origin": src.origin,
            "summary": src.spec.summary()}


def render_serving(o: DeployOptions, src: DeploySource, p: Placement, directory: Path) -> dict[str, str]:
    """filename -> content of a serving deployment (Kubernetes objects validated strictly)."""
    if not (o.release_url or o.release_volume):
        raise DeployError("deploy: say where the nodes get the release: --release-url URL (http/https) or "
                          "--release-volume NAME (k8s: a PersistentVolumeClaim; slurm: a shared directory)")
    if o.platform == "dynamo":
        dynamo.check_build(src.spec)
    if not runtime_of(src.spec).deploys_on(o.platform):
        raise DeployError(f"deploy serves TensorRT-LLM on GPUs, but this build is --target {src.spec.target} (the "
                          "CPU reference backend); serve it with `invoke serve`, deploy a --target trtllm build, or "
                          "(runtime engine, tests and demos) deploy it with --platform slurm")
    platform = PLATFORMS[o.platform]
    server, pipe = _images(o, platform, src.trtllm_version)
    rt = runtime_for(src.spec, o.name, placement=p, platform=o.platform, serve_mode=o.serve_mode)
    scripts = {"fetch-verify.sh": fetch_verify_script(rt), "rank.sh": rt.rank_script}
    kind, files = platform.serving_files(o, src, p, rt, scripts, server, pipe, directory)
    held = copies(o, src.spec, p)
    files |= monitoring_files(o, src, p, rt, directory, gpus=held[1])
    image = pipe if rt.pipeline_image else server
    files[MARKER] = json.dumps(_summary(src, p, rt, image, kind, held) | {"server": rt.name}, indent=2) + "\n"
    return files


def monitoring_files(o: DeployOptions, src: DeploySource, p: Placement, rt: Runtime, directory: Path, *,
                     gpus: int) -> dict[str, str]:
    """Prometheus rules, how Prometheus scrapes the server as `job="<name>"` (Triton's metrics port, or trtllm-serve's
    `/prometheus/metrics`), and the Grafana dashboard. k8s: a PrometheusRule, a PodMonitor and a dashboard ConfigMap
    (validated), labelled with `o.monitoring_labels` for the operator's selectors; Slurm: a plain rules file and a
    `scrape_configs` snippet reading the target file serve.sbatch writes. Both: the dashboard's JSON. `gpus`: what
    the serving copies hold (`copies`)."""
    if rt.scrape is None:
        return {}
    platform = PLATFORMS[o.platform]
    w = watch_plan(src.spec, deployment=o.name, gpus=gpus, source=rt.scrape.source,
                   prefix_alert=o.prefix_cache_alert, gpu_selector=platform.gpu_selector(o),
                   router=o.router if o.platform == "dynamo" else "round-robin")
    return platform.monitoring_files(o, p, rt.scrape, w, directory)


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
    gpus = max((runtime_of(c).gpus(c.parallelism.world_size) for c in cells), default=0)
    platform = PLATFORMS[o.platform]
    server, pipe = _images(o, platform, TRTLLM_VERSION)
    scripts = {"build-cell.sh": slurm.build_cell_script([_cell_args(c) for c in cells],
                                                        [release_file(c, __version__) for c in cells])}
    files = platform.matrix_files(o, cells, gpus, scripts, server, pipe, directory, output)
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
