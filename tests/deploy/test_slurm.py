"""Slurm for real: the generated job array builds the tiny matrix on a local cluster, the same as direct builds;
the multi-node serve script passes `sbatch --test-only` against a real controller."""

import json
import os
import subprocess
import tarfile
import sys
from pathlib import Path

import pytest

from pipeline.commands import deploy_command
from pipeline.deploy.runtime import FETCH_VERIFY
from pipeline.spec import resolve_spec
from tests.support.slurm_cluster import SlurmCluster, ensure_packages

REPO = Path(__file__).resolve().parents[2]
CELLS = ("fp8", "int4_awq")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    ensure_packages()  # fails (not skips) with apt's reason when the packages cannot be installed
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _invoke() -> str:
    return f"{sys.executable} -m invoke -r {REPO}"


def _run(cmd, env, timeout=1800):
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd}: {res.stdout[-1500:]} {res.stderr[-1500:]}"
    return res


def test_job_array_builds_the_tiny_matrix_like_a_direct_build(slurm, pipeline_env, tmp_path):
    out, deploy = tmp_path / "matrix-out", tmp_path / "deploy"
    deploy_command(None, platform="slurm", matrix=",".join(f"tiny-llama:{p}" for p in CELLS),
                   matrix_target="reference", matrix_output=str(out), no_container=True, partition="cpu",
                   pipeline_cmd=_invoke(), output=str(deploy))
    env = {**slurm.env, "PYTHONPATH": str(REPO)}
    _run(["sbatch", "--wait", str(deploy / "build-matrix.sbatch")], env)
    array = _releases(out / "releases")
    assert len(array) == len(CELLS), sorted(p.name for p in (deploy / "logs").iterdir())
    direct = tmp_path / "direct"
    for precision in CELLS:
        args = ["--model", "tiny-llama", "--precision", precision, "--target", "reference"]
        denv = {**env, "PIPELINE_ROOT": str(direct)}
        _run([*_invoke().split(), "build", *args], denv)
        _run([*_invoke().split(), "release", *args, "--output", str(direct / "releases")], denv)
    assert array == _releases(direct / "releases")
    _fetch_verify_installs_a_release(out / "releases", tmp_path / "node", env)


def _fetch_verify_installs_a_release(releases: Path, work: Path, env: dict) -> None:
    """The nodes' init step, run for real on one array-built release: sha256, verify, unpack, install-repo."""
    tarball = sorted(releases.glob("*.tar"))[0]
    digest = (releases / f"{tarball.name}.sha256").read_text().split()[0]
    script = work.parent / "fetch-verify.sh"
    script.write_text(FETCH_VERIFY)
    node = {**env, "WORK": str(work), "PIPELINE": _invoke(), "RELEASE_DIR": str(releases),
            "RELEASE_FILE": tarball.name, "RELEASE_SHA256": digest}
    _run(["/bin/sh", str(script)], node)
    repo = Path((work / "REPO").read_text().strip())
    assert repo.parent.name == "triton_repo" and (repo / "ensemble" / "config.pbtxt").is_file()
    bad = subprocess.run(["/bin/sh", str(script)], env={**node, "RELEASE_SHA256": "0" * 64, "WORK": str(work) + "-2"},
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and not (Path(str(work) + "-2") / "REPO").exists()


def _releases(directory: Path) -> dict[str, dict]:
    """name -> what must match: every stage key and the sha256 of every released file except the manifests (they
    also record timings, mtimes and the command line of their run)."""
    out = {}
    for tarball in directory.glob("*.tar"):
        with tarfile.open(tarball) as tar:
            doc = json.load(tar.extractfile(f"{tarball.name.removesuffix('.tar')}/release.json"))
        files = {k: v["sha256"] for k, v in doc["files"].items() if not k.endswith("manifest.json")}
        assert any(k.endswith(".safetensors") for k in files)
        out[tarball.name] = {"stage_keys": doc["stage_keys"], "files": files}
    return out


def test_multi_node_serve_script_passes_test_only(slurm, tmp_path):
    spec = resolve_spec(model="llama-405b", precision="bf16")
    deploy_command(spec, platform="slurm", release_volume="/shared/releases", partition="gpu",
                   output=str(tmp_path / "serve"))
    script = (tmp_path / "serve" / "serve.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=8" in script
    assert "srun --mpi=pmix --nodes=2 --ntasks-per-node=8 --container-image=" in script
    res = subprocess.run(["sbatch", "--test-only", str(tmp_path / "serve" / "serve.sbatch")], env=slurm.env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "gpu[1-2]" in res.stderr, res.stderr
    # three pipeline stages need three nodes: the controller refuses what this cluster cannot hold
    spec3 = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=3, nodes=3)
    deploy_command(spec3, platform="slurm", release_volume="/shared/releases", partition="gpu",
                   output=str(tmp_path / "serve3"))
    res = subprocess.run(["sbatch", "--test-only", str(tmp_path / "serve3" / "serve.sbatch")], env=slurm.env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "not available" in res.stderr, res.stderr
    assert os.environ.get("SLURM_CONF") is None  # the test cluster's config never leaks into this process
