"""Where Kubernetes may place a deployment's pods, and what each asks of its node besides GPUs and disk.

Scheduling (every GPU pod):
- GPU product: a required node affinity on `nvidia.com/gpu.product`, the label NVIDIA GPU feature discovery (GFD,
  part of the GPU Operator) puts on each GPU node: NVML's device name with every ' ' replaced by '-' (plus
  `-SHARED` on time-sliced GPUs), `productLabel` in NVIDIA/k8s-device-plugin `internal/lm/resource.go`. GPU_PRODUCTS
  maps each GPU of `pipeline.core.gpus` to the names NVML gives it (e.g. "NVIDIA H100 80GB HBM3" for H100 SXM5).
- Tolerations: the GPU taint GPU node pools carry (`nvidia.com/gpu`, any value, NoSchedule), plus the user's.
- A nodeSelector from `--node-selector`.

Host resources of a serving pod (an estimate from the plan, not a measurement): each rank reads its share of the
weights (the engines, or the Hugging Face checkpoint for runtime pytorch: `plan_resources`) through host memory while
it loads, all ranks of a node at once, next to its process (TensorRT-LLM, torch, CUDA and MPI: RANK_HOST_BYTES) and
the server's front end (tritonserver or trtllm-serve's HTTP process and tokenizer: SERVER_HOST_BYTES). Memory request =
the node's share of the weights + ranks x RANK_HOST_BYTES + SERVER_HOST_BYTES; limit = request x MEMORY_LIMIT_FACTOR
(room for the estimate's error before an OOM kill). CPU request = ranks x CPUS_PER_RANK + SERVER_CPUS, no CPU limit
(CFS throttling stalls the ranks' busy loops and adds latency).

Multi-node fabric: `--rdma-resource NAME=COUNT` requests an extended resource on every serving pod (the NVIDIA
Network Operator's RDMA shared device plugin advertises `rdma/<resourceName>`, e.g. `rdma/rdma_shared_device_a`; SR-IOV
ones `nvidia.com/<resourceName>`), with the IPC_LOCK capability RDMA needs to pin memory; `--nccl-env KEY=VALUE` sets
NCCL's environment (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...)
in every serving container.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pipeline.core.errors import DeployError
from pipeline.core.gpus import GIB
from pipeline.core.spec import BuildSpec
from pipeline.ops.deploy import names
from pipeline.planning.placement import Placement
from pipeline.stages.resources import plan_resources

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# NVML device names (nvidia-smi --query-gpu=name), as GFD writes them.
GPU_PRODUCTS: dict[str, tuple[str, ...]] = {
    "h100-sxm": ("NVIDIA-H100-80GB-HBM3",),
    "h100-pcie": ("NVIDIA-H100-PCIe",),
    "h100-nvl": ("NVIDIA-H100-NVL",),
    "h200": ("NVIDIA-H200",),
    "l40s": ("NVIDIA-L40S",),
    "a100": ("NVIDIA-A100-SXM4-80GB",),  # gpus.py's a100: 80 GB at 2.039 TB/s, the SXM4 part
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

RANK_HOST_BYTES = 3 * GIB
SERVER_HOST_BYTES = 2 * GIB
MEMORY_LIMIT_FACTOR = 1.5
CPUS_PER_RANK = 2
SERVER_CPUS = 2

_NCCL_KEY = re.compile(r"NCCL_[A-Z0-9_]+")
# Resources deploy sets itself (GPUs, ephemeral-storage, cpu, memory) or Kubernetes owns (kubernetes.io, hugepages).
_RESERVED = re.compile(r"nvidia\.com/gpu|cpu|memory|ephemeral-storage|hugepages-.*|(.*\.)?kubernetes\.io/.*")


def _split(item: str, sep: str, flag: str, form: str) -> tuple[str, str]:
    key, found, value = item.partition(sep)
    if not found or not key:
        raise DeployError(f"{flag} {item!r}: expected {form}")
    return key, value


def node_selector(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` items -> a nodeSelector (label keys and values checked)."""
    out = {}
    for item in items:
        key, value = _split(item, "=", "--node-selector", "KEY=VALUE, e.g. --node-selector pool=inference")
        out[names.label_key(key, "--node-selector")] = names.label_value(value, "--node-selector")
    return out


def toleration(item: str) -> dict[str, str]:
    """`KEY[=VALUE]:EFFECT` -> a toleration (Equal with a value, else Exists)."""
    form = "KEY[=VALUE]:EFFECT with EFFECT one of " + ", ".join(EFFECTS) + ", e.g. dedicated=inference:NoSchedule"
    head, _, effect = item.rpartition(":")
    if not head or effect not in EFFECTS:
        raise DeployError(f"--toleration {item!r}: expected {form}")
    key, eq, value = head.partition("=")
    out = {"key": names.label_key(key, "--toleration"), "operator": "Equal" if eq else "Exists"}
    if eq:
        out["value"] = names.label_value(value, "--toleration")
    return out | {"effect": effect}


def tolerations(items: list[str]) -> list[dict[str, str]]:
    """The GPU taint's toleration, then the user's (`--toleration`), without repeats."""
    out = [GPU_TOLERATION]
    for t in map(toleration, items):
        if t not in out:
            out.append(t)
    return out


def extended_resources(items: list[str]) -> dict[str, str]:
    """`NAME=COUNT` items (`--rdma-resource`) -> {resource: count}: a domain-prefixed resource name, COUNT >= 1."""
    out = {}
    for item in items:
        name, count = _split(item, "=", "--rdma-resource", "NAME=COUNT, e.g. rdma/rdma_shared_device_a=1")
        if "/" not in name or _RESERVED.fullmatch(name):
            raise DeployError(f"--rdma-resource {item!r}: give a device plugin's domain/name resource (e.g. "
                              "rdma/rdma_shared_device_a=1); GPUs, cpu, memory and storage are set by deploy")
        names.label_key(name, "--rdma-resource")  # an extended resource name is a qualified name
        if not count.isdigit() or int(count) < 1:
            raise DeployError(f"--rdma-resource {item!r}: COUNT must be a whole number >= 1")
        out[name] = str(int(count))
    return out


def nccl_env(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` items (`--nccl-env`) -> environment; KEY an NCCL variable, VALUE without control characters."""
    out = {}
    for item in items:
        key, value = _split(item, "=", "--nccl-env", "KEY=VALUE, e.g. --nccl-env NCCL_IB_HCA=mlx5")
        if not _NCCL_KEY.fullmatch(key):
            raise DeployError(f"--nccl-env {item!r}: KEY must be an NCCL variable (NCCL_ and uppercase letters, "
                              "digits, '_'), e.g. NCCL_SOCKET_IFNAME=eth0")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise DeployError(f"--nccl-env {key}: the value holds control characters")
        out[key] = value
    return out


def node_affinity(products: tuple[str, ...]) -> dict[str, Any]:
    """A required node affinity on the GPU product label (any of `products`)."""
    term = {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(products)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def host_memory_bytes(spec: BuildSpec, p: Placement) -> int:
    """Host RAM one serving pod asks for (the module docstring's rule)."""
    plan = plan_resources(spec)
    weights = plan.stage_bytes("compile", needed=False) or plan.stage_bytes("calibrate", needed=False)
    return math.ceil(weights / p.nodes) + p.ranks_per_node * RANK_HOST_BYTES + SERVER_HOST_BYTES


def host_cpus(p: Placement) -> int:
    return p.ranks_per_node * CPUS_PER_RANK + SERVER_CPUS
