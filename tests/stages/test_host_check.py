"""Host fit before any download: GPU memory to calibrate, RAM on CPU, disk per volume, on a fake host."""

from __future__ import annotations

import pytest

from pipeline.core.errors import HostResourceError
from pipeline.core.gpus import GIB
from pipeline.core.host import GpuMemory, HostResources, VolumeSpace
from pipeline.core.spec import resolve_spec
from pipeline.stages.build import build
from pipeline.stages.host_check import check_host_fits

BUILD = ("download", "calibrate", "compile", "package")
PLENTY = 10**15


def fake_host(gpus=(), *, on_host=None, cache_free=PLENTY, root_free=PLENTY, same_volume=False, ram=PLENTY,
              cores=64):
    """A probe returning a fixed host: GPUs with these free bytes, two volumes, RAM and cores."""
    host = HostResources(
        gpus=[GpuMemory(index=i, name="NVIDIA H100 80GB HBM3", total_bytes=80 * GIB, free_bytes=free)
              for i, free in enumerate(gpus)],
        gpus_on_host=len(gpus) if on_host is None else on_host,
        volumes={"cache": VolumeSpace(path="/cache", device=1, free_bytes=cache_free),
                 "root": VolumeSpace(path="/out", device=1 if same_volume else 2, free_bytes=root_free)},
        ram_available_bytes=ram, cpu_count=cores)
    return lambda volumes: host


@pytest.fixture
def empty_tree(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _70b_fp8():
    return resolve_spec(model="llama-70b", precision="fp8", tp=4)


def test_70b_fp8_calibration_refused_on_one_80gb_gpu(empty_tree):
    with pytest.raises(HostResourceError) as e:
        check_host_fits(_70b_fp8(), stages=BUILD, probe=fake_host([79 * GIB]))
    msg = str(e.value)
    assert e.value.exit_code == 4 and "\n" not in msg
    assert "calibrating llama-70b needs" in msg and "1 visible GPU(s) have 79.0 GiB free" in msg
    assert "weights 131.4 GiB" in msg and "use 2 GPUs like these" in msg
    assert "calibrate on CPU (CUDA_VISIBLE_DEVICES= ) with 295.4 GiB RAM" in msg and "h on 64 cores" in msg
    assert "--skip-host-check" in msg and "disk" not in msg


def test_70b_fp8_accepted_on_two_80gb_gpus(empty_tree):
    """weights 131 GiB + activations + ModelOpt + CUDA context fit in 2 x 79 GiB (the export works in place)."""
    fit = check_host_fits(_70b_fp8(), stages=BUILD, probe=fake_host([79 * GIB] * 2))
    assert fit.problems == () and "calibrate target 141.2 GiB GPU of 158.0 GiB free" in fit.summary()


def test_70b_fp8_pytorch_runtime_needs_room_for_the_hf_exporters_copy(empty_tree):
    """The HF exporter packs (destroys) the weights it exports, so it gets a bf16 copy: 2 x 131 GiB + the rest."""
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, runtime="pytorch")
    with pytest.raises(HostResourceError, match=r"export copy 131\.4 GiB.* 2 visible GPU\(s\) have 158\.0 GiB"):
        check_host_fits(spec, stages=BUILD, probe=fake_host([79 * GIB] * 2))
    fit = check_host_fits(spec, stages=BUILD, probe=fake_host([79 * GIB] * 4))
    assert fit.problems == ()


def test_hidden_gpus_are_named_as_a_way_out(empty_tree):
    with pytest.raises(HostResourceError, match="expose the host's other 7 GPU"):
        check_host_fits(_70b_fp8(), stages=BUILD, probe=fake_host([79 * GIB], on_host=8))
    with pytest.raises(HostResourceError, match=r"295\.4 GiB RAM \(256\.0 GiB available here - not enough here\)"):
        check_host_fits(_70b_fp8(), stages=BUILD, probe=fake_host([79 * GIB], ram=256 * GIB))


def test_cpu_calibration_needs_its_ram(empty_tree):
    spec = resolve_spec(model="llama-8b", precision="fp8")
    with pytest.raises(HostResourceError, match=r"calibrating llama-8b on CPU \(no visible GPU\) needs 42\.2 GiB RAM"):
        check_host_fits(spec, stages=BUILD, probe=fake_host(ram=40 * GIB))
    fit = check_host_fits(spec, stages=BUILD, probe=fake_host(ram=48 * GIB, cores=32))
    assert "calibrate target on CPU 42.2 GiB RAM of 48.0 GiB available" in fit.summary()


def _disk_need(spec, stages=BUILD, volume=None) -> int:
    fit = check_host_fits(spec, stages=stages, probe=fake_host([79 * GIB] * 8))
    return sum(d.needed for d in fit.plan.disk if d.stage in stages and volume in (None, d.volume))


def test_disk_short_by_1_gb_is_refused(empty_tree):
    spec = resolve_spec(model="llama-8b", precision="fp8")
    need = _disk_need(spec)
    gpus = [79 * GIB] * 8
    with pytest.raises(HostResourceError, match=r"disk: cache \(/cache\) \+ root \(/out\) needs .* short by 0\.9 GiB"):
        check_host_fits(spec, stages=BUILD, probe=fake_host(gpus, cache_free=need - 10**9, same_volume=True))
    check_host_fits(spec, stages=BUILD, probe=fake_host(gpus, cache_free=need + 10**9, same_volume=True))
    cache_need = _disk_need(spec, volume="cache")
    with pytest.raises(HostResourceError, match=r"disk: cache \(/cache\) needs 15\.0 GiB \(download 15\.0 GiB\)"):
        check_host_fits(spec, stages=BUILD, probe=fake_host(gpus, cache_free=cache_need - 10**9))
    check_host_fits(spec, stages=BUILD, probe=fake_host(gpus, cache_free=cache_need + 10**9))


def test_stages_not_run_need_no_disk(empty_tree):
    spec = resolve_spec(model="llama-8b", precision="fp8")
    later = ("calibrate", "compile", "package")  # --from calibrate: the download is located, not fetched
    check_host_fits(spec, stages=later, probe=fake_host([79 * GIB] * 8, cache_free=0))
    fit = check_host_fits(spec, stages=("download",), probe=fake_host(root_free=0, ram=0))  # --until download
    assert fit.problems == ()


def test_outputs_already_in_the_caches_are_subtracted_unless_forced(pipeline_env):
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference")
    stages = ("download", "calibrate", "package")
    fit = check_host_fits(spec, stages=stages, probe=fake_host(cache_free=0))  # the generated models are there
    assert {d.role for d in fit.plan.disk if d.stage == "download" and d.present} == {"target", "draft"}
    with pytest.raises(HostResourceError, match=r"disk: cache \(/cache\) needs 7\.9 MiB"):
        check_host_fits(spec, stages=stages, force="download", probe=fake_host(cache_free=0))


def test_build_refuses_before_the_first_byte_is_written(empty_tree):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    probe = fake_host(cache_free=10**6)

    def host_check(stages):
        return check_host_fits(spec, stages=stages, probe=probe).summary()

    with pytest.raises(HostResourceError, match=r"disk: cache \(/cache\) needs 5\.6 MiB"):
        build(spec, host_check=host_check, progress=None)
    assert not (empty_tree / "cache").exists() and not (empty_tree / "out" / "engines").exists()
    report = build(spec, until="check", host_check=lambda stages: "host: fits", progress=None)
    assert report.stages[0].detail.endswith("; host: fits")


@pytest.mark.slow
def test_a_built_checkpoint_needs_no_disk_again_unless_forced(pipeline_env):
    """After a real `build --until calibrate`, only the package stage still needs room."""
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference", calib_size=2, calib_seq_len=32)
    build(spec, until="calibrate", progress=None)
    stages = ("download", "calibrate", "package")
    with pytest.raises(HostResourceError) as e:
        check_host_fits(spec, stages=stages, probe=fake_host(cache_free=0, root_free=0))
    assert "disk: root (/out) needs" in str(e.value) and "(package " in str(e.value)
    assert "calibrate" not in str(e.value) and "cache (/cache)" not in str(e.value)
    with pytest.raises(HostResourceError, match=r"\(calibrate 3\.\d MiB, package "):
        check_host_fits(spec, stages=stages, force="calibrate", probe=fake_host(cache_free=0, root_free=0))
