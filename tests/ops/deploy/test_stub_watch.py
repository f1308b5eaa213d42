"""The engine runtime's stub watchdog (rank.sh's `serve_watched`) against the real CPU tritonserver: a Python stub
killed with SIGKILL leaves every Triton health endpoint at 200, and the watched rank stops the server and exits 5;
a plain SIGTERM still stops it cleanly (no false alarm while the stubs shut down). The Kubernetes readiness probe
(`ready.sh`) passes once the watchdog has recorded the loaded server's stubs and fails as soon as one is gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pipeline.ops.deploy.stub_watch import STUB_WATCH, ready_script
from tests.serving.test_serve_hygiene import FAKE_MPIRUN, _echo_repo

WATCH_S = 1


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _stubs(server: int) -> dict[int, str]:
    found = {}
    for d in Path("/proc").iterdir():
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(args) > 8 and args[0].endswith(b"triton_python_backend_stub") and args[5] == str(server).encode():
            found[int(d.name)] = args[8].decode()
    return found


def _wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := pred()):
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def watched(tmp_path, monkeypatch, request):
    """`serve_watched PORT tritonserver ...` (the CPU server on an echo model) as rank.sh runs it, its stub record
    in tmp_path/work; yields (rank process, server pid, http port). Parametrized "mpirun": the server runs below an
    mpirun stand-in (`mpirun -n 1 tritonserver ...`, orchestrator mode), so its stubs' parent is not the watched pid."""
    from pipeline.serving.serve import build_command, free_ports, launch_repo, process_tree
    from pipeline.stages.package.launch_plan import Endpoints

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    launch = launch_repo(_echo_repo(tmp_path / "repo"), validate=False)
    http, grpc, metrics = free_ports(3)
    cmd = build_command(launch, Endpoints(http_port=http, grpc_port=grpc, metrics_port=metrics),
                        shm_prefix=f"tripipe-{os.getpid()}-watch-")
    script = STUB_WATCH + 'serve_watched "$PORT" "$@"\n'
    argv = cmd.argv
    if getattr(request, "param", "direct") == "mpirun":
        (tmp_path / "mpirun").write_text(FAKE_MPIRUN)
        argv = [sys.executable, str(tmp_path / "mpirun"), "--allow-run-as-root", "-n", "1", *argv]
    (tmp_path / "work").mkdir()
    env = {**cmd.env, "PORT": str(http), "STUB_WATCH_SECONDS": str(WATCH_S), "STUB_STOP_GRACE_SECONDS": "30",
           "WORK": str(tmp_path / "work")}
    rank = subprocess.Popen(["/bin/sh", "-c", f"set -eu\n{script}", "rank.sh", *argv], env=env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        server = _wait(lambda: next((p for p in process_tree(rank.pid)
                                     if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver"), None),
                       30, "tritonserver to start")
        _wait(lambda: _get(f"http://127.0.0.1:{http}/v2/health/ready") == 200, 180, "tritonserver ready")
        yield rank, server, http
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
        shutil.rmtree(launch, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("watched", ["direct", "mpirun"], indirect=True)
def test_a_killed_stub_stops_the_watched_server_with_exit_5(watched):
    rank, server, http = watched
    stubs = _wait(lambda: _stubs(server), 30, "the echo stub")
    assert sorted(stubs.values()) == ["echo_0_0"]
    time.sleep(3 * WATCH_S)  # the watchdog has recorded the stubs of the loaded server
    os.kill(next(iter(stubs)), signal.SIGKILL)
    t0 = time.monotonic()
    # what the watchdog is for: Triton itself still answers ready everywhere once the stub is gone
    assert _get(f"http://127.0.0.1:{http}/v2/health/ready") == 200
    assert _get(f"http://127.0.0.1:{http}/v2/models/echo/ready") == 200
    code = rank.wait(timeout=60)
    err = rank.stderr.read()
    assert code == 5, (code, err)
    assert time.monotonic() - t0 < 30
    assert "the Python stub of model instance echo_0_0 died" in err
    assert not Path(f"/proc/{server}").exists()
    assert _get(f"http://127.0.0.1:{http}/v2/health/ready") == 0  # nothing answers: probes fail, pod restarts


@pytest.mark.slow
def test_sigterm_stops_the_watched_server_without_a_false_alarm(watched):
    rank, server, _ = watched
    _wait(lambda: _stubs(server), 30, "the echo stub")
    time.sleep(3 * WATCH_S)
    rank.send_signal(signal.SIGTERM)
    code = rank.wait(timeout=90)
    err = rank.stderr.read()
    assert code == 0, (code, err)
    assert "died" not in err
    assert not Path(f"/proc/{server}").exists()


def _probe(http: int, work: Path) -> subprocess.CompletedProcess:
    """The rendered readiness probe (ready.sh) run once, as the kubelet's exec does."""
    return subprocess.run(["/bin/sh", "-c", ready_script(http), "ready.sh"], env={**os.environ, "WORK": str(work)},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.slow
def test_the_readiness_probe_fails_once_a_stub_is_gone_while_triton_still_says_ready(watched, tmp_path):
    rank, server, http = watched
    work = tmp_path / "work"
    stubs = _wait(lambda: _stubs(server), 30, "the echo stub")
    _wait(lambda: (work / "stub-watch").is_file(), 30, "the watchdog's stub record")
    assert (work / "stub-watch").read_text().split() == [str(server), "echo_0_0"]
    ok = _probe(http, work)
    assert ok.returncode == 0, ok.stderr
    # hold the watchdog so the probe alone has to see the dead stub (the server keeps running and says ready)
    watchdog = next(p for p in Path(f"/proc/{rank.pid}/task/{rank.pid}/children").read_text().split()
                    if Path(f"/proc/{p}/comm").read_text().strip() == "sh")
    os.kill(int(watchdog), signal.SIGSTOP)
    try:
        os.kill(next(iter(stubs)), signal.SIGKILL)
        _wait(lambda: not _stubs(server), 10, "the stub to be gone")
        assert _get(f"http://127.0.0.1:{http}/v2/health/ready") == 200
        failed = _probe(http, work)
        assert failed.returncode == 1
        assert "not ready: the Python stub of model instance echo_0_0 died" in failed.stderr
    finally:
        os.kill(int(watchdog), signal.SIGCONT)
    assert rank.wait(timeout=60) == 5
    gone = _probe(http, work)
    assert gone.returncode == 1 and "not ready" in gone.stderr  # the record is removed with the server
    assert not (work / "stub-watch").exists()


def test_the_readiness_probe_fails_before_the_watchdog_recorded_the_stubs(tmp_path):
    failed = _probe(1, tmp_path)
    assert failed.returncode == 1
    assert "not ready: the stub watchdog has not recorded the loaded server's stubs yet" in failed.stderr
    (tmp_path / "stub-watch").write_text("999999999\necho_0_0\n")  # a record of a server that is gone
    failed = _probe(1, tmp_path)
    assert failed.returncode == 1 and "tritonserver (pid 999999999) is gone" in failed.stderr
