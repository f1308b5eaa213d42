"""Host probe: CUDA_VISIBLE_DEVICES semantics over NVML's GPUs, free disk per filesystem, RAM."""

from __future__ import annotations

import os

from pipeline.core.host import _visible, probe_gpus, probe_host, ram_available, volume_space

GPUS = [(0, "GPU-aaaa-1111"), (1, "GPU-bbbb-2222"), (2, "GPU-abcd-3333")]


def test_cuda_visible_devices_selects_and_orders_like_cuda():
    assert _visible(GPUS, None) == [0, 1, 2]
    assert _visible(GPUS, "2,0") == [2, 0]
    assert _visible(GPUS, "") == [] and _visible(GPUS, "-1") == []
    assert _visible(GPUS, "1,7,0") == [1]  # CUDA ignores everything after the first invalid entry
    assert _visible(GPUS, "GPU-bbbb") == [1]
    assert _visible(GPUS, "GPU-a") == []  # ambiguous prefix
    assert _visible(GPUS, "0,0") == [0]


def test_volume_space_of_a_directory_not_created_yet(tmp_path):
    v = volume_space(tmp_path / "not" / "yet")
    assert v.device == tmp_path.stat().st_dev and v.free_bytes > 0 and v.path.endswith("yet")


def test_probe_host_reports_volumes_ram_and_consistent_gpus(tmp_path):
    gpus, on_host = probe_gpus()
    assert len(gpus) <= on_host
    h = probe_host({"cache": tmp_path / "c", "root": tmp_path / "r"})
    assert set(h.volumes) == {"cache", "root"} and h.volumes["cache"].device == h.volumes["root"].device
    assert h.ram_available_bytes == ram_available() > 0 and h.cpu_count == (os.cpu_count() or 1)


class _FakeNvml:
    """pynvml's calls the probe makes, over three H100s."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"580.95.05"

    def nvmlDeviceGetCount(self):
        return len(GPUS)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"total": 80 << 30, "free": (70 - h) << 30})()

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return 9, 0

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return GPUS[h][1]


def test_one_probe_serves_serve_and_compile_preflight_under_cuda_visible_devices(monkeypatch):
    from pipeline.core.host import visible_gpu_count
    from pipeline.stages.compile.preflight import probe_host as compile_probe

    monkeypatch.setitem(__import__("sys").modules, "pynvml", _FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    gpus, on_host = probe_gpus()
    assert on_host == 3 and [g.index for g in gpus] == [2, 1]
    assert gpus[0].sm == 90 and gpus[0].driver == "580.95.05" and gpus[0].free_bytes == 68 << 30
    assert visible_gpu_count() == 2
    probe = compile_probe()
    assert [(g.index, g.sm, g.memory_mib) for g in probe.gpus] == [(2, 90, 80 << 10), (1, 90, 80 << 10)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpu_count() is None
    assert compile_probe().gpu_query_error == "CUDA_VISIBLE_DEVICES hides every GPU"
