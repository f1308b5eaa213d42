"""What `invoke deploy` was asked: the platform, the names, where the release comes from, scheduling."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from pipeline.ops.deploy import scheduling
from pipeline.ops.deploy.images import PIPELINE_HOME

Platform = Literal["k8s", "slurm", "dynamo"]


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
    mode: str = "agg"  # dynamo only, like router and dynamo_version (pipeline.ops.deploy.dynamo)
    router: str = "kv"
    dynamo_version: str | None = None
