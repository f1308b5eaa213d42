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
