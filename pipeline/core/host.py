"""Probe this host's resources: visible GPUs and their free memory (NVML), free disk per volume, RAM, cores.

GPUs come from NVML (`nvidia-ml-py`) restricted to what CUDA_VISIBLE_DEVICES lets CUDA see (indices or `GPU-<uuid>`
prefixes; CUDA stops at the first entry it cannot match, and so does this); no NVML or no driver means no GPUs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class GpuMemory(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int  # NVML index
    name: str
    total_bytes: int
    free_bytes: int
    sm: int = 0  # compute capability x10 (90: H100/H200)
    driver: str = ""  # NVIDIA driver version


class VolumeSpace(BaseModel):
    """One directory the build writes to and the free space of the filesystem holding it."""

    model_config = ConfigDict(frozen=True)

    path: str
    device: int  # st_dev of the nearest existing ancestor: directories on one filesystem share it
    free_bytes: int


class HostResources(BaseModel):
    """What a build can use on this host."""

    model_config = ConfigDict(frozen=True)

    gpus: list[GpuMemory] = []  # visible to CUDA
    gpus_on_host: int = 0  # every GPU NVML sees, visible or not
    volumes: dict[str, VolumeSpace] = {}  # "cache" / "root" -> its filesystem
    ram_available_bytes: int = 0
    cpu_count: int = 1

    @property
    def gpu_free_bytes(self) -> int:
        return sum(g.free_bytes for g in self.gpus)


def _visible(entries: list[tuple[int, str]], env: str | None) -> list[int]:
    """NVML indices CUDA can see under CUDA_VISIBLE_DEVICES=`env` (None: all)."""
    if env is None:
        return [i for i, _ in entries]
    out: list[int] = []
    for item in (x.strip() for x in env.split(",")):
        match = None
        if item.isdigit():
            match = next((i for i, _ in entries if i == int(item)), None)
        elif item.startswith("GPU-"):
            found = [i for i, uuid in entries if uuid.startswith(item)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in out:
            break
        out.append(match)
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpus() -> tuple[list[GpuMemory], int]:
    """(GPUs visible to CUDA with their free memory, GPUs on the host); ([], 0) without NVML or a driver."""
    try:
        import pynvml
    except ImportError:
        return [], 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return [], 0
    try:
        found = []
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            found.append((GpuMemory(index=i, name=_text(pynvml.nvmlDeviceGetName(h)), total_bytes=int(mem.total),
                                    free_bytes=int(mem.free), sm=major * 10 + minor, driver=driver),
                          _text(pynvml.nvmlDeviceGetUUID(h))))
    except pynvml.NVMLError:
        return [], 0
    finally:
        pynvml.nvmlShutdown()
    visible = _visible([(g.index, uuid) for g, uuid in found], os.environ.get("CUDA_VISIBLE_DEVICES"))
    by_index = {g.index: g for g, _ in found}
    return [by_index[i] for i in visible], len(found)


def visible_gpu_count() -> int | None:
    """GPUs CUDA can see on this host (NVML under CUDA_VISIBLE_DEVICES), None when there are none or no driver."""
    return len(probe_gpus()[0]) or None


def volume_space(path: Path) -> VolumeSpace:
    """Free space of the filesystem that `path` (or its nearest existing ancestor) is on."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return VolumeSpace(path=str(path), device=p.stat().st_dev, free_bytes=shutil.disk_usage(p).free)


def ram_available() -> int:
    """MemAvailable from /proc/meminfo; elsewhere free physical pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f.read(65536).splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def probe_host(volumes: dict[str, Path]) -> HostResources:
    """This host's GPUs, free disk on each of `volumes` (name -> directory), available RAM and cores."""
    gpus, total = probe_gpus()
    return HostResources(gpus=gpus, gpus_on_host=total,
                         volumes={name: volume_space(p) for name, p in volumes.items()},
                         ram_available_bytes=ram_available(), cpu_count=os.cpu_count() or 1)
