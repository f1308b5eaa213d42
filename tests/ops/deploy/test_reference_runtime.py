"""The reference runtime's rank script (what `deploy` writes for a --target reference build) run for real on a CPU
tritonserver: it goes through `invoke serve`, so the server gets large thread stacks even on a node whose soft
stack limit is 8 MiB, and a model instance whose Python stub dies stops it with one line and exit 5 (the job or
container ends and the orchestrator restarts it; tritonserver's own /v2/health/ready would stay ready)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pipeline.ops.deploy.runtime import reference_runtime
from pipeline.serving.serve import SERVER_STACK_BYTES, free_ports, process_tree
from tests.serving.test_serve_hygiene import _echo_repo, gone, wait_until

ROOT = Path(__file__).resolve().parents[2]
NODE_STACK = 8 << 20  # a typical node's soft RLIMIT_STACK


def _soft_stack(pid: int) -> float:
    """Soft RLIMIT_STACK of `pid` in bytes (inf when unlimited), from /proc/<pid>/limits."""
    line = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines() if ln.startswith("Max stack size"))
    soft = line.split()[3]
    return float("inf") if soft == "unlimited" else int(soft)


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _node_stack() -> int:
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    return NODE_STACK if hard == resource.RLIM_INFINITY else min(NODE_STACK, hard)


def _node_limits() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (_node_stack(), resource.getrlimit(resource.RLIMIT_STACK)[1]))


@pytest.mark.slow
def test_reference_rank_script_serves_with_large_stacks_and_exits_5_when_a_stub_dies(tmp_path):
    repo = _echo_repo(tmp_path / "repo")
    work = tmp_path / "work"
    work.mkdir()
    (work / "REPO").write_text(f"{repo}\n")
    rank = tmp_path / "rank.sh"
    rank.write_text(reference_runtime().rank_script)
    http, grpc, metrics = free_ports(3)
    env = {**os.environ, "WORK": str(work), "PIPELINE": f"{sys.executable} -m invoke -r {ROOT}",
           "PIPELINE_CACHE": str(tmp_path / "cache"), "HTTP_PORT": str(http), "GRPC_PORT": str(grpc),
           "METRICS_PORT": str(metrics)}
    err = tmp_path / "rank.err"
    out = tmp_path / "rank.out"
    proc = subprocess.Popen(["/bin/sh", str(rank)], env=env, stdout=out.open("w"), stderr=err.open("w"),
                            start_new_session=True, preexec_fn=_node_limits)
    try:
        wait_until(lambda: "(Ctrl-C to stop)" in out.read_text() or proc.poll() is not None, 240, "ok: serving")
        assert proc.poll() is None and _ready(f"127.0.0.1:{http}"), err.read_text()[-2000:]
        tree = process_tree(proc.pid)
        server = next(p for p in tree if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver")
        assert _soft_stack(proc.pid) == _node_stack()  # the rank (invoke serve) runs with the node's limit ...
        hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
        want = SERVER_STACK_BYTES if hard == resource.RLIM_INFINITY else min(SERVER_STACK_BYTES, hard)
        assert _soft_stack(server) >= want  # ... and starts the server with large stacks
        stub = next(p for p in tree if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]
                    .endswith(b"triton_python_backend_stub"))
        os.kill(stub, signal.SIGKILL)
        assert proc.wait(timeout=60) == 5
        lines = err.read_text().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: model instance(s) echo_0_0 lost their Python stub"), \
            lines
        wait_until(lambda: gone(server), 60, "tritonserver exit")
        assert not _ready(f"127.0.0.1:{http}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
