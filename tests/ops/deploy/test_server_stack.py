"""Every tritonserver a deployment starts gets the stack limit `serve` gives it (SERVER_STACK_BYTES, see serve.py):
rank.sh, the one script Kubernetes (Deployment, mpirun on the pod, LeaderWorkerSet ranks) and Slurm ranks run,
raises the soft RLIMIT_STACK before any rank's server starts, capped by the hard limit."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.spec import resolve_spec
from pipeline.serving.serve import SERVER_STACK_BYTES
from tests.support.k8s import PIPELINE_IMAGE

URL = "https://releases.example.invalid/llama.tar.gz"
NODE_STACK = 8 << 20  # a typical node's soft limit
STAND_IN = f"""#!{sys.executable}
import json, resource
print(json.dumps(resource.getrlimit(resource.RLIMIT_STACK)))
"""


def _rank_scripts(tmp_path: Path, precision: str) -> dict[str, str]:
    """platform -> the rank.sh a deployment of llama-405b at `precision` writes."""
    spec = resolve_spec(model="llama-405b", precision=precision)
    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(tmp_path / "k8s"))
    objects = list(yaml.safe_load_all((tmp_path / "k8s" / "serving.yaml").read_text()))
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    deploy_command(spec, platform="slurm", release_volume="/shared/releases", output=str(tmp_path / "slurm"))
    return {"k8s": config["rank.sh"], "slurm": (tmp_path / "slurm" / "rank.sh").read_text()}


def _run_rank(script: str, tmp_path: Path, rank: int, *, hard: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_STACK the stand-in tritonserver of `rank` starts with, on a node whose soft limit is
    NODE_STACK and whose hard limit is `hard`."""
    bindir, work = tmp_path / "bin", tmp_path / "work"
    bindir.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    (work / "REPO").write_text("/srv/repo\n")
    (bindir / "tritonserver").write_text(STAND_IN)
    (bindir / "tritonserver").chmod(0o755)
    (tmp_path / "rank.sh").write_text(script)

    def node_limits() -> None:
        soft = NODE_STACK if hard == resource.RLIM_INFINITY else min(NODE_STACK, hard)
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))

    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "WORK": str(work), "SLURM_PROCID": str(rank),
           "STUB_WATCH_SECONDS": "0.1"}
    res = subprocess.run(["/bin/sh", str(tmp_path / "rank.sh")], env=env, capture_output=True, text=True,
                         timeout=60, preexec_fn=node_limits)
    assert res.returncode == 0, res.stderr
    soft, got_hard = json.loads(res.stdout.strip().splitlines()[-1])
    return soft, got_hard


@pytest.mark.parametrize("precision", ["bf16", "fp8"])  # LeaderWorkerSet + 2-node Slurm; one-node mpirun
def test_every_rank_script_raises_the_stack_limit_from_serves_constant(tmp_path, precision):
    scripts = _rank_scripts(tmp_path, precision)
    assert scripts["k8s"] == scripts["slurm"]
    script = scripts["k8s"]
    assert f"stack_kib={SERVER_STACK_BYTES // 1024}\n" in script
    assert script.index('ulimit -S -s "$stack_kib"') < script.index('case "$rank" in')  # before every rank's server


def test_rank_servers_start_with_large_stacks_capped_by_the_hard_limit(tmp_path):
    script = _rank_scripts(tmp_path, "bf16")["slurm"]
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    for rank in (0, 1):  # rank 0 under the stub watchdog, the others exec'd
        soft, got_hard = _run_rank(script, tmp_path, rank, hard=hard)
        assert got_hard == hard
        assert soft == (SERVER_STACK_BYTES if hard == resource.RLIM_INFINITY else min(SERVER_STACK_BYTES, hard))
    capped = 64 << 20  # a node whose hard limit is below SERVER_STACK_BYTES: raised to it, and the rank still runs
    assert _run_rank(script, tmp_path, 1, hard=capped) == (capped, capped)
