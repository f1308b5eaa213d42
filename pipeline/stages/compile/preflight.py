"""Preflight of the compile stage: is this host able to build TensorRT-LLM 1.2.1 engines for the target GPU?

Cheap checks first (no heavy import): the `tensorrt_llm` distribution is installed with the pinned version
(importlib metadata, not an import) and GPUs are visible to CUDA (NVML, `pipeline.core.host`)
with the compute capability of the spec's GPU and at least `--workers` of them. Only then is `tensorrt_llm`
imported — in a subprocess, because it needs libcuda — to read the TensorRT and CUDA versions for the manifest.
On a CPU-only host this fails in well under a second with what to run instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from pipeline.core.errors import ToolchainError
from pipeline.core.gpus import GPUS
from pipeline.core.host import probe_gpus
from pipeline.core.trtllm_rules import TRTLLM_VERSION

CPU_STAGES_HINT = (
    "on this host run only the CPU-capable stages: `invoke calibrate --model M --precision P ...` (quantize and "
    "export the checkpoint), `invoke package --target reference ...` or `invoke build --target reference ...` "
    "(Triton repository served by the PyTorch reference backend)"
)


@dataclass
class GPUInfo:
    index: int
    name: str
    sm: int  # compute capability x10
    memory_mib: int
    driver: str


@dataclass
class HostProbe:
    """What a host offers for compiling; filled by `probe_host()`, judged by `host_problems()`."""

    trtllm_installed: bool
    trtllm_version: str | None
    gpus: list[GPUInfo] = field(default_factory=list)
    gpu_query_error: str | None = None


@dataclass
class Toolchain:
    """Versions and devices recorded in the engine manifest and the stage key."""

    tensorrt_llm: str
    tensorrt: str
    cuda: str
    driver: str
    gpu_name: str
    sm: int
    gpu_count: int

    def as_dict(self) -> dict:
        return asdict(self)


def _trtllm_version() -> tuple[bool, str | None]:
    if importlib.util.find_spec("tensorrt_llm") is None:
        return False, None
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return True, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return True, None


def _query_gpus() -> tuple[list[GPUInfo], str | None]:
    """The GPUs CUDA can see (the one host probe, `pipeline.core.host`), or why there are none."""
    visible, on_host = probe_gpus()
    if not visible:
        why = ("CUDA_VISIBLE_DEVICES hides every GPU" if on_host else
               "no GPU visible through NVML (no NVIDIA driver on this host)")
        return [], why
    return [GPUInfo(g.index, g.name, g.sm, g.total_bytes // (1 << 20), g.driver) for g in visible], None


def probe_host() -> HostProbe:
    """Look at this host without importing TensorRT-LLM (fast on any machine)."""
    installed, version = _trtllm_version()
    probe = HostProbe(trtllm_installed=installed, trtllm_version=version)
    probe.gpus, probe.gpu_query_error = _query_gpus()  # instant without a driver
    return probe


def host_problems(probe: HostProbe, *, gpu: str, workers: int) -> list[str]:
    """Everything that stops this host from compiling for `gpu` with `workers` parallel builds (pure)."""
    problems = []
    if not probe.trtllm_installed:
        problems.append("tensorrt_llm is not installed")
    elif probe.trtllm_version != TRTLLM_VERSION:
        problems.append(f"tensorrt_llm {probe.trtllm_version or '(unknown version)'} is installed, "
                        f"the pipeline pins {TRTLLM_VERSION}")
    if probe.gpu_query_error:
        problems.append(probe.gpu_query_error)
    elif probe.trtllm_installed and not probe.gpus:
        problems.append("no GPU is visible")
    want_sm = GPUS[gpu].sm
    if probe.gpus:
        wrong = [g for g in probe.gpus if g.sm != want_sm]
        if wrong:
            g = wrong[0]
            problems.append(f"GPU {g.index} is {g.name} (SM {g.sm / 10:.1f}), but engines for {gpu} need "
                            f"SM {want_sm / 10:.1f} (engines run only on the architecture they were built on)")
        if len(probe.gpus) < workers:
            problems.append(f"{len(probe.gpus)} GPU(s) visible, --workers {workers} needs {workers} "
                            "(lower --gpu-count or expose more GPUs via CUDA_VISIBLE_DEVICES)")
    return problems


def check_host(probe: HostProbe, *, gpu: str, workers: int) -> None:
    """Raise the one-line preflight error when `probe` shows problems."""
    problems = host_problems(probe, gpu=gpu, workers=workers)
    if problems:
        sm = GPUS[gpu].sm
        kind = "an H100-class GPU" if sm == 90 else f"a {gpu} GPU"
        raise ToolchainError(
            f"compiling needs {kind} (SM {sm / 10:.1f}) with TensorRT-LLM {TRTLLM_VERSION}, "
            f"but {'; '.join(problems)}; {CPU_STAGES_HINT}"
        )


_VERSION_PROBE = (
    "import json, tensorrt_llm, tensorrt, torch; "
    "print(json.dumps({'tensorrt_llm': tensorrt_llm.__version__, 'tensorrt': tensorrt.__version__, "
    "'cuda': torch.version.cuda}))"
)


def import_toolchain(timeout: float = 600) -> dict[str, str]:
    """Import tensorrt_llm in a subprocess and return its, TensorRT's and CUDA's versions."""
    try:
        r = subprocess.run([sys.executable, "-c", _VERSION_PROBE], check=False, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"importing tensorrt_llm took over {timeout:.0f} s; check the installation") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise ToolchainError(f"tensorrt_llm is installed but does not import: {last}; fix the TensorRT-LLM install")
    return json.loads(r.stdout.strip().splitlines()[-1])


def preflight(*, gpu: str, workers: int) -> Toolchain:
    """Fail fast unless this host can compile; return the toolchain for the manifest and the stage key.

    Raises:
        ToolchainError: (exit code 4) naming each problem and the CPU-capable stages to run instead.
    """
    probe = probe_host()
    check_host(probe, gpu=gpu, workers=workers)
    versions = import_toolchain()
    if versions["tensorrt_llm"] != TRTLLM_VERSION:
        raise ToolchainError(
            f"tensorrt_llm imports as {versions['tensorrt_llm']}, the pipeline pins {TRTLLM_VERSION}; "
            f"install tensorrt-llm=={TRTLLM_VERSION}"
        )
    g = probe.gpus[0]
    return Toolchain(
        tensorrt_llm=versions["tensorrt_llm"], tensorrt=versions["tensorrt"], cuda=str(versions["cuda"]),
        driver=g.driver, gpu_name=g.name, sm=g.sm, gpu_count=len(probe.gpus),
    )
