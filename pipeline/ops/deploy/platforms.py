"""Where a deployment runs: Kubernetes, Slurm or NVIDIA Dynamo on Kubernetes, one object each; `render` asks the deployment's platform for its
files (serving objects or an sbatch script, monitoring, a build matrix) and its image checks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

import yaml

from pipeline.core.errors import DeployError
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import dynamo, k8s, names, scheduling, slurm
from pipeline.ops.deploy.options import DeployOptions
from pipeline.ops.deploy.runtime import Runtime, Scrape, kubexec_script, leader_script
from pipeline.ops.deploy.source import DeploySource
from pipeline.ops.deploy.validate import validate_objects
from pipeline.ops.monitoring.dashboard import dashboard_config_map, dashboard_json
from pipeline.ops.monitoring.rules import WatchPlan, prometheus_rule, rules_file
from pipeline.ops.monitoring.scrape import pod_monitor, scrape_config_file
from pipeline.planning.placement import Placement
from pipeline.stages.resources import calibration_memory, serving_host_bytes

SERVE_CPUS_PER_RANK = 4  # Slurm --cpus-per-task of a GPU serving rank (`serving_cpus`)
MATRIX_CPUS_PER_GPU = 4  # Slurm --cpus-per-task of a GPU build cell, per GPU (`matrix_cpus`)
SCRAPE_TARGETS = "prometheus-targets.json"  # Slurm: the file_sd file serve.sbatch writes into the deployment directory


class DeployPlatform(Protocol):
    """One platform `deploy` renders for (`DeployOptions.platform` names it)."""

    name: str

    def check_image(self, o: DeployOptions) -> None:
        """Refuse a `--image` the platform cannot pull (before the pipeline image is named after it)."""
        ...

    def check_pipeline_image(self, o: DeployOptions, pipe: str) -> None:
        """Refuse a pipeline image the nodes cannot pull."""
        ...

    def gpu_selector(self, o: DeployOptions) -> str:
        """The GPU metrics' label selector of the deployment's pods ("" where none applies)."""
        ...

    def serving_files(self, o: DeployOptions, src: DeploySource, p: Placement, rt: Runtime, scripts: dict[str, str],
                      server: str, pipe: str, directory: Path) -> tuple[str, dict[str, str]]:
        """(the deployment's kind, filename -> content) of a serving deployment."""
        ...

    def monitoring_files(self, o: DeployOptions, p: Placement, scrape: Scrape, w: WatchPlan,
                         directory: Path) -> dict[str, str]:
        """The rules, the configuration scraping the server as `scrape` says, and the dashboard of a serving
        deployment."""
        ...

    def matrix_files(self, o: DeployOptions, cells: list[BuildSpec], gpus: int, scripts: dict[str, str], server: str,
                     pipe: str, directory: Path, output: str) -> dict[str, str]:
        """filename -> content of a build matrix over `cells`."""
        ...


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
    gpus = max((runtime_of(c).gpus(c.parallelism.world_size) for c in cells), default=0)
    if gpus:
        return MATRIX_CPUS_PER_GPU * gpus
    seconds = slurm.time_seconds(time_limit)
    work = max(calibration_memory(c, "target").cpu_seconds_per_core for c in cells)
    return max(1, math.ceil(work / seconds)) if seconds else 1


def matrix_mem_bytes(cells: list[BuildSpec]) -> int:
    """Host RAM of the hungriest cell: calibration beside its GPUs, or on the CPU for a CPU cell."""
    return max(calibration_memory(c, "target").host_bytes_with_gpu if runtime_of(c).gpu else
               calibration_memory(c, "target").cpu_ram_bytes for c in cells)


class Kubernetes:
    """LeaderWorkerSet or Deployment objects (validated strictly), a PrometheusRule, PodMonitor and dashboard
    ConfigMap labelled for the operator's selectors, an Indexed Job for a build matrix."""

    name = "k8s"

    def check_image(self, o: DeployOptions) -> None:
        if o.image:
            names.image_reference(o.image, "--image")

    def check_pipeline_image(self, o: DeployOptions, pipe: str) -> None:
        if names.registry_host(pipe) is None and not o.pipeline_image:
            raise DeployError(f"the nodes pull the pipeline image {pipe!r} (the fetch/verify init container, the "
                              "build matrix), which names no registry; build and push it (README \"GPU host quick "
                              "start\"), then pass --pipeline-image REGISTRY/trtllm-pipeline:TAG")

    def gpu_selector(self, o: DeployOptions) -> str:
        return f'namespace="{o.namespace}",pod=~"{o.name}-.+"'  # dcgm-exporter's pod mapping

    def serving_files(self, o: DeployOptions, src: DeploySource, p: Placement, rt: Runtime, scripts: dict[str, str],
                      server: str, pipe: str, directory: Path) -> tuple[str, dict[str, str]]:
        scripts = dict(scripts)
        if p.multi_node:
            scripts |= {"launch-leader.sh": leader_script(), "kubexec.sh": kubexec_script()}
        if rt.ready_script:
            scripts[k8s.READY_SCRIPT] = rt.ready_script
        objects = k8s.serving_objects(_k8s_options(o, src, server, pipe, src.spec.hardware.gpu, p), rt, p, scripts)
        validate_objects(objects)
        kind = "LeaderWorkerSet" if p.multi_node else "Deployment"
        return kind, {"serving.yaml": yaml.safe_dump_all(objects, sort_keys=False)}

    def monitoring_files(self, o: DeployOptions, p: Placement, scrape: Scrape, w: WatchPlan,
                         directory: Path) -> dict[str, str]:
        return _k8s_monitoring(o, scrape, w, k8s.server_pod_selector(o.name, multi_node=p.multi_node))

    def matrix_files(self, o: DeployOptions, cells: list[BuildSpec], gpus: int, scripts: dict[str, str], server: str,
                     pipe: str, directory: Path, output: str) -> dict[str, str]:
        opts = _k8s_options(o, None, server, pipe, cells[0].hardware.gpu).model_copy(
            update={"cpus": matrix_cpus(cells, o.time_limit or slurm.MATRIX_TIME),
                    "memory_bytes": matrix_mem_bytes(cells)})
        objects = k8s.matrix_job(opts, len(cells), gpus, scripts)
        validate_objects(objects)
        return {"build-matrix.yaml": yaml.safe_dump_all(objects, sort_keys=False)}


def _k8s_monitoring(o: DeployOptions, scrape: Scrape, w: WatchPlan, selector: dict[str, str]) -> dict[str, str]:
    """A PrometheusRule, a PodMonitor scraping the pods `selector` matches and a dashboard ConfigMap (validated)."""
    labels = {**o.monitoring_labels, "app.kubernetes.io/name": "trtllm-pipeline", "app.kubernetes.io/instance": o.name}
    objects = [prometheus_rule(w, namespace=o.namespace, labels=labels),
               pod_monitor(o.name, namespace=o.namespace, labels=labels, port=scrape.port, path=scrape.path,
                           pod_selector=selector),
               dashboard_config_map(w, namespace=o.namespace, labels=labels)]
    validate_objects(objects)
    return {"monitoring.yaml": yaml.safe_dump_all(objects, sort_keys=False), "dashboard.json": dashboard_json(w)}


class Dynamo(Kubernetes):
    """A DynamoGraphDeployment and its ConfigMap (`pipeline.ops.deploy.dynamo`, validated against the Dynamo CRD),
    monitoring as on Kubernetes scraping the workers' system port (TensorRT-LLM's trtllm_* series)."""

    name = "dynamo"

    def check_pipeline_image(self, o: DeployOptions, pipe: str) -> None:
        if not o.pipeline_image:  # the default would be named after the Dynamo image, not the NGC TensorRT-LLM one
            raise DeployError("--platform dynamo: the workers' init container verifies and unpacks the release with "
                              "the pipeline image (built FROM the NGC TensorRT-LLM image of the release); build and "
                              "push it (README \"GPU host quick start\"), then pass --pipeline-image "
                              "REGISTRY/trtllm-pipeline:TAG")

    def serving_files(self, o: DeployOptions, src: DeploySource, p: Placement, rt: Runtime, scripts: dict[str, str],
                      server: str, pipe: str, directory: Path) -> tuple[str, dict[str, str]]:
        release = dynamo.release_for(o.dynamo_version)
        graph = dynamo.Graph(_k8s_options(o, src, server, pipe, src.spec.hardware.gpu, p),
                             dynamo.worker_roles(src.spec, p, o.mode, o.replicas), o.router, release, server)
        objects, summary = dynamo.render_graph(graph, scripts["fetch-verify.sh"])
        return dynamo.DGD_KIND, {"dynamo.yaml": yaml.safe_dump_all(objects, sort_keys=False),
                                 "dynamo.json": json.dumps(summary, indent=2) + "\n"}

    def monitoring_files(self, o: DeployOptions, p: Placement, scrape: Scrape, w: WatchPlan,
                         directory: Path) -> dict[str, str]:
        system = Scrape(dynamo.SYSTEM_PORT_NAME, "/metrics", scrape.source)
        return _k8s_monitoring(o, system, w, {"app.kubernetes.io/instance": o.name, **dynamo.WORKER_LABEL})

    def matrix_files(self, o: DeployOptions, cells: list[BuildSpec], gpus: int, scripts: dict[str, str], server: str,
                     pipe: str, directory: Path, output: str) -> dict[str, str]:
        raise DeployError("--matrix builds on --platform k8s or slurm; Dynamo serves releases, drop --matrix or "
                          "use --platform k8s")


class Slurm:
    """An sbatch script beside the rank scripts, a plain rules file and a `scrape_configs` snippet reading the target
    file serve.sbatch writes, a job array for a build matrix."""

    name = "slurm"

    def check_image(self, o: DeployOptions) -> None:
        return None

    def check_pipeline_image(self, o: DeployOptions, pipe: str) -> None:
        return None

    def gpu_selector(self, o: DeployOptions) -> str:
        return ""

    def serving_files(self, o: DeployOptions, src: DeploySource, p: Placement, rt: Runtime, scripts: dict[str, str],
                      server: str, pipe: str, directory: Path) -> tuple[str, dict[str, str]]:
        targets = str(directory / SCRAPE_TARGETS) if rt.scrape else None
        opts = _slurm_options(o, directory, src, server, pipe, cpus=serving_cpus(rt, p), mem_bytes=serving_host_bytes(
            src.spec, ranks_per_node=p.ranks_per_node, world_size=p.world_size))
        files = {**scripts, "serve.sbatch": slurm.serve_script(opts, rt, p, scrape_targets=targets)}
        if not o.keep_work:
            files[slurm.REMOVE_WORK] = slurm.remove_work_script()
        return "sbatch", files

    def monitoring_files(self, o: DeployOptions, p: Placement, scrape: Scrape, w: WatchPlan,
                         directory: Path) -> dict[str, str]:
        targets = slurm.replica_targets(str(directory / SCRAPE_TARGETS), o.replicas)
        return {"prometheus-rules.yml": rules_file(w),
                "prometheus-scrape.yml": scrape_config_file(o.name, targets, path=scrape.path),
                "dashboard.json": dashboard_json(w)}

    def matrix_files(self, o: DeployOptions, cells: list[BuildSpec], gpus: int, scripts: dict[str, str], server: str,
                     pipe: str, directory: Path, output: str) -> dict[str, str]:
        opts = _slurm_options(o, directory, None, server, pipe, mem_bytes=matrix_mem_bytes(cells),
                              cpus=matrix_cpus(cells, o.time_limit or slurm.MATRIX_TIME))
        return {**scripts, "build-matrix.sbatch": slurm.matrix_script(opts, len(cells), gpus, output)}


PLATFORMS: dict[str, DeployPlatform] = {p.name: p for p in (Kubernetes(), Slurm(), Dynamo())}
