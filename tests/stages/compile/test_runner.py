"""The compile stage on a host: preflight (fast, exit 4 on CPU), `invoke compile --dry-run`, the runner seam.

The runner tests use a plain Python child process, not TensorRT-LLM: they check streaming, the saved log and the
failure message of the seam itself. Nothing here pretends a GPU build succeeded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.errors import CompileError
from pipeline.stages.compile.preflight import (
    GPUInfo,
    HostProbe,
    check_host,
    host_problems,
    preflight,
    probe_host,
)
from pipeline.stages.compile.runner import run_trtllm_build
from tests.support.compile_fixtures import write_fabricated_checkpoint

ROOT = Path(__file__).resolve().parents[3]
CPU_HOST = importlib.util.find_spec("tensorrt_llm") is None or shutil.which("nvidia-smi") is None
H100 = GPUInfo(0, "NVIDIA H100 80GB HBM3", 90, 81559, "580.95.05")


def invoke(*args: str, root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIPELINE_ROOT=str(root / "out"), PIPELINE_CACHE=str(root / "cache"), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "invoke", *args], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


# --- preflight -------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not CPU_HOST, reason="this host has TensorRT-LLM and a GPU driver")
def test_preflight_fails_on_this_cpu_host_without_importing_tensorrt_llm():
    with pytest.raises(CompileError) as info:
        preflight(gpu="h100-sxm", workers=1)
    assert "tensorrt_llm" not in sys.modules
    msg = str(info.value)
    assert msg.startswith("compiling needs an H100-class GPU (SM 9.0) with TensorRT-LLM 1.2.1")
    assert "`invoke calibrate" in msg and "`invoke package --target reference" in msg
    assert "`invoke build --target reference" in msg and "\n" not in msg
    assert info.value.exit_code == 4  # this host lacks the toolchain


@pytest.mark.skipif(not CPU_HOST, reason="this host has TensorRT-LLM and a GPU driver")
def test_invoke_compile_exits_4_on_this_cpu_host(tmp_path):
    r = invoke("compile", "--model", "tiny-llama", "--precision", "fp8", "--draft", "tiny-llama-draft", root=tmp_path)
    assert r.returncode == 4, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: compiling needs an H100-class GPU")
    assert "tensorrt_llm is not installed" in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()  # nothing heavy ran, nothing was written


def test_host_problems_for_gpu_hosts():
    ok = HostProbe(True, "1.2.1", [H100, GPUInfo(1, H100.name, 90, 81559, H100.driver)])
    assert host_problems(ok, gpu="h100-sxm", workers=2) == []
    assert "1 GPU(s) visible, --workers 2" in host_problems(HostProbe(True, "1.2.1", [H100]), gpu="h100-sxm",
                                                            workers=2)[0]
    a100 = HostProbe(True, "1.2.1", [GPUInfo(0, "NVIDIA A100-SXM4-80GB", 80, 81920, "580")])
    assert "is NVIDIA A100-SXM4-80GB (SM 8.0), but engines for h100-sxm need SM 9.0" in \
        host_problems(a100, gpu="h100-sxm", workers=1)[0]
    wrong = HostProbe(True, "1.3.0rc1", [H100])
    assert host_problems(wrong, gpu="h100-sxm", workers=1) == [
        "tensorrt_llm 1.3.0rc1 is installed, the pipeline pins 1.2.1"]
    none = HostProbe(True, "1.2.1", [], gpu_query_error=None)
    assert host_problems(none, gpu="h200", workers=1) == ["no GPU is visible"]
    with pytest.raises(CompileError, match=r"SM 9.0\) with TensorRT-LLM 1.2.1, but no GPU is visible"):
        check_host(none, gpu="h200", workers=1)


def test_probe_host_is_import_free():
    probe = probe_host()
    assert "tensorrt_llm" not in sys.modules
    assert probe.trtllm_installed == (importlib.util.find_spec("tensorrt_llm") is not None)


# --- dry run through invoke -------------------------------------------------------------------------------------

def test_invoke_compile_dry_run_prints_plan(tmp_path):
    r = invoke("compile", "--model", "tiny-llama", "--precision", "fp8", "--draft", "tiny-llama-draft", "--dry-run",
               root=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("trtllm-build --checkpoint_dir") == 2
    assert "--speculative_decoding_mode draft_tokens_external --max_draft_len 4" in r.stdout
    assert "rank0.engine" in r.stdout and "estimated GPU memory per GPU" in r.stdout
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_invoke_compile_dry_run_json_with_fabricated_checkpoint(tmp_path):
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated" / "checkpoint", precision="fp8", kv_cache="fp8", tp=4)
    r = invoke("compile", "--model", "llama-70b", "--precision", "fp8", "--tp", "4", "--dry-run", "--json",
               "--checkpoint-dir", str(ckpt), root=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    t = plan["target"]
    assert t["checkpoint_derived"] is False and t["world_size"] == 4
    assert t["output_dir"] == str(tmp_path / "fabricated" / "engine")
    assert t["argv"][t["argv"].index("--workers") + 1] == "4"
    assert plan["draft"] is None and plan["memory"]["fits"] is True


def test_invoke_compile_dry_run_bad_combo_exits_2(tmp_path):
    r = invoke("compile", "--model", "llama-70b", "--precision", "int4_awq", "--kv-cache", "fp8", "--dry-run",
               root=tmp_path)
    assert r.returncode == 2 and "disables FP8 and so paged context FMHA" in r.stderr


# --- the runner seam (plain Python child, not TensorRT-LLM) -----------------------------------------------------

def test_runner_streams_and_saves_log(tmp_path, capsys):
    argv = [sys.executable, "-c", "print('line one'); print('line two')"]
    seconds = run_trtllm_build(argv, log_path=tmp_path / "logs" / "build.log")
    log = (tmp_path / "logs" / "build.log").read_text()
    assert log.startswith("$ ") and "line one\nline two\n" in log
    assert "line two" in capsys.readouterr().out and seconds >= 0


def test_runner_failure_reports_argv_log_and_tail(tmp_path):
    script = "import sys; [print(f'progress {i}') for i in range(100)]; print('RuntimeError: out of memory'); sys.exit(3)"
    argv = [sys.executable, "-c", script]
    with pytest.raises(CompileError) as info:
        run_trtllm_build(argv, log_path=tmp_path / "build.log", echo=None)
    msg = str(info.value)
    assert "exited with 3" in msg and str(tmp_path / "build.log") in msg
    assert "RuntimeError: out of memory" in msg and "progress 99" in msg and "progress 10 " not in msg
    assert "\n" not in msg


def test_runner_missing_executable(tmp_path):
    with pytest.raises(CompileError, match="trtllm-build was not found on PATH; install TensorRT-LLM 1.2.1"):
        run_trtllm_build([str(tmp_path / "no-bin" / "trtllm-build")], log_path=tmp_path / "l.log")


_KILLED_BUILD = """
import sys
from pathlib import Path
from pipeline.core.artifacts import atomic_dir
from pipeline.stages.compile.runner import run_trtllm_build
final = Path(sys.argv[1])
with atomic_dir(final) as tmp:
    (tmp / "rank0.engine").write_bytes(b"partial")
    run_trtllm_build([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"],
                     log_path=final.parent / "engine.build.log", echo=None)
"""


def test_killed_build_publishes_nothing(tmp_path):
    """SIGTERM during the (plain Python) child: the child is stopped and no engine dir or temp dir remains."""
    import signal

    final = tmp_path / "engines" / "b" / "engine"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, str(final)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = final.parent / "engine.build.log"
    deadline = time.monotonic() + 60
    # wait for the child's own output line (the log's first line, the argv, also contains the word)
    while not (log.exists() and "started" in log.read_text().splitlines()[1:]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "trtllm-build was interrupted by signal" in err
    assert not final.exists()
    assert sorted(p.name for p in final.parent.iterdir()) == ["engine.build.log"]


@pytest.mark.skipif(not CPU_HOST, reason="this host has TensorRT-LLM and a GPU driver")
def test_run_compile_on_cpu_host_stops_at_preflight(tmp_path, monkeypatch):
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.compile.stage import CompileIO, run_compile

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft")
    t = write_fabricated_checkpoint(tmp_path / "fabricated-t", precision="fp8", kv_cache="fp8", vocab_size=1024)
    d = write_fabricated_checkpoint(tmp_path / "fabricated-d", precision="fp8", kv_cache="fp8", vocab_size=1024)
    with pytest.raises(CompileError, match="compiling needs an H100-class GPU"):
        run_compile(spec, CompileIO(checkpoint=t, output_dir=tmp_path / "b" / "engine", draft_checkpoint=d))
    assert not (tmp_path / "b").exists()
