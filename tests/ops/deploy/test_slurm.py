"""Slurm for real: the generated job array builds the tiny matrix on a local cluster, the same as direct builds;
the multi-node serve script passes `sbatch --test-only` against a real controller; a tiny reference release is
served by the rendered serve.sbatch for real and stopped with scancel."""

import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline import __version__
from pipeline.cli.commands import deploy_command
from pipeline.core.layout import release_file
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.runtime import FETCH_VERIFY
from pipeline.serving.smoke import http_generate, smoke_server
from tests.support.slurm_cluster import SlurmCluster, ensure_packages

REPO = Path(__file__).resolve().parents[3]
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


def _test_only(script: Path, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """`sbatch --test-only script`, retried while the gpu nodes are still unknown to a fresh controller."""
    deadline = time.monotonic() + 120
    while True:
        res = subprocess.run(["sbatch", "--test-only", str(script)], env=env, cwd=cwd, capture_output=True, text=True,
                             timeout=60)
        if res.returncode == 0 or "not available" not in res.stderr or time.monotonic() > deadline:
            return res
        time.sleep(2)


def test_multi_node_serve_script_passes_test_only(slurm, tmp_path):
    spec = resolve_spec(model="llama-405b", precision="bf16")
    deploy_command(spec, platform="slurm", release_volume="/shared/releases", partition="gpu",
                   output=str(tmp_path / "serve"))
    script = (tmp_path / "serve" / "serve.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=8" in script
    assert "srun --mpi=pmix --nodes=2 --ntasks-per-node=8 --kill-on-bad-exit=1 --task-epilog=" in script
    assert "#SBATCH --exclusive" not in script and "#SBATCH --cpus-per-task=4" in script  # 32 of 112 cores
    res = _test_only(tmp_path / "serve" / "serve.sbatch", slurm.env, tmp_path)
    assert res.returncode == 0 and "gpu[1-2]" in res.stderr, res.stderr
    # three pipeline stages need three nodes: the controller refuses what this cluster cannot hold
    spec3 = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=3, nodes=3)
    deploy_command(spec3, platform="slurm", release_volume="/shared/releases", partition="gpu",
                   output=str(tmp_path / "serve3"))
    res = subprocess.run(["sbatch", "--test-only", str(tmp_path / "serve3" / "serve.sbatch")], env=slurm.env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "not available" in res.stderr, res.stderr
    assert os.environ.get("SLURM_CONF") is None  # the test cluster's config never leaks into this process


def test_hostile_paths_and_slurm_flags_pass_test_only(slurm, tmp_path):
    """Directive values sbatch must read back intact: a deployment directory with a space and a `;`, time, account,
    qos (this cluster has no accounting, so it accepts any account/qos)."""
    spec = resolve_spec(model="llama-405b", precision="bf16")
    out = tmp_path / "serve x;touch pwned"
    deploy_command(spec, platform="slurm", release_volume=str(tmp_path / "rel eases"), partition="gpu",
                   output=str(out), time_="1-00:00:00", account="proj-1", qos="normal")
    res = _test_only(out / "serve.sbatch", slurm.env, tmp_path)
    assert res.returncode == 0 and "gpu[1-2]" in res.stderr, res.stderr
    assert not list(tmp_path.rglob("pwned*"))


def test_sbatch_reads_a_quoted_output_path_back_exactly(slurm, tmp_path):
    """serve.sbatch rendered into a directory whose name holds a space, ';', both quotes, '$', a backquote and ' #'
    (sbatch's comment start): the real sbatch writes the job log under it, and the shell exports it intact."""
    weird = tmp_path / "a b;c'd\"e$f`g #h"
    deploy_command(resolve_spec(model="tiny-llama", precision="fp8", target="reference"), platform="slurm",
                   release_volume=str(weird), output=str(weird), no_container=True, partition="cpu")
    lines = (weird / "serve.sbatch").read_text().splitlines()
    job = tmp_path / "job.sbatch"  # its directives and exports, then one line instead of the steps
    job.write_text("\n".join([*(ln for ln in lines if ln.startswith(("#", "set ", "export "))),
                              'echo "release dir: $RELEASE_DIR"', ""]))
    _run(["sbatch", "--wait", str(job)], slurm.env, timeout=120)
    logs = list((weird / "logs").glob("tiny-llama-fp8-*.out"))
    assert len(logs) == 1 and logs[0].read_text() == f"release dir: {weird}\n", sorted(tmp_path.rglob("*"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_state(job_id: str, env: dict) -> str:
    res = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True)
    found = re.search(r"\bJobState=(\S+)", res.stdout)
    return found.group(1) if found else "GONE"


def _log_of(deploy: Path) -> str:
    return " | ".join(p.read_text(errors="replace")[-2000:] for p in sorted((deploy / "logs").glob("*.out")))


def _wait_ready(http: str, job_id: str, env: dict, deploy: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _job_state(job_id, env)
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), f"job {job_id} {state}: {_log_of(deploy)}"
        try:
            with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"job {job_id} not ready after {timeout}s: {_log_of(deploy)}")


def _listening(port: str) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", int(port))) == 0


def _servers_on(port: str) -> list[str]:
    """Command lines of live processes given `--http-port` `port` (invoke serve, tritonserver)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"--http-port={port}" in argv or f"--http-port {port} " in argv:
            found.append(argv)
    return found


def test_reference_release_serves_through_sbatch_until_scancel(slurm, pipeline_env, tmp_path):
    """The user story on a real cluster: build and release a tiny reference model, `invoke deploy --platform slurm
    --no-container`, sbatch the rendered serve.sbatch, greedy requests through the ensemble (HTTP twice, then the
    smoke routes: the same text over HTTP, gRPC streaming), scancel: the job ends and nothing keeps listening. While it serves, its Prometheus file_sd file names the node's
    metrics port; scancel removes it. The release and deployment directories hold a space and a `;` (data)."""
    env = {**slurm.env, "PYTHONPATH": str(REPO), "PIPELINE_ROOT": os.environ["PIPELINE_ROOT"],
           "PIPELINE_CACHE": os.environ["PIPELINE_CACHE"]}
    invoke = _invoke().split()
    spec = ["--model", "tiny-llama", "--precision", "fp8", "--target", "reference", "--calib-size", "4",
            "--calib-seq-len", "32"]
    _run([*invoke, "build", *spec], env)
    releases = tmp_path / "rel eases"
    released = json.loads(_run([*invoke, "release", *spec, "--output", str(releases), "--json"], env).stdout)
    deploy = tmp_path / "deploy x;touch pwned"
    _run([*invoke, "deploy", "--platform", "slurm", "--release", released["tarball"], "--release-volume",
          str(releases), "--no-container", "--partition", "cpu", "--time", "15", "--pipeline-cmd", _invoke(),
          "--output", str(deploy)], env)
    ports = {name: str(_free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")}
    res = _run(["sbatch", "--parsable", str(deploy / "serve.sbatch")], {**env, **ports, "TRTLLM_DEPLOY_TMP": str(tmp_path / "node")},
               timeout=60)
    job_id = res.stdout.strip().split(";")[0]
    http = f"127.0.0.1:{ports['HTTP_PORT']}"
    try:
        _wait_ready(http, job_id, env, deploy)
        greedy = {"text_input": "The quick brown fox", "max_tokens": 8, "stream": False, "top_k": 1,
                  "exclude_input_in_output": True}
        first = http_generate(http, "ensemble", greedy)
        assert first["model_name"] == "ensemble" and first["text_output"].strip(), first
        assert http_generate(http, "ensemble", greedy)["text_output"] == first["text_output"]  # greedy: stable
        routes = smoke_server(http, f"127.0.0.1:{ports['GRPC_PORT']}", prompt=greedy["text_input"], max_tokens=8,
                              out=lambda _: None)  # HTTP greedy + gRPC streaming through the same job's server
        assert routes[0].text == first["text_output"] and routes[-1].text, routes
        targets = json.loads((deploy / "prometheus-targets.json").read_text())  # Prometheus' file_sd file
        assert targets == [{"targets": [f"{socket.gethostname()}:{ports['METRICS_PORT']}"],
                            "labels": {"job": "tiny-llama-fp8-tp1"}}], targets
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics", timeout=10) as r:
            assert b"nv_inference_request_success{" in r.read()  # what that target serves
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=60)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (_job_state(job_id, env) not in ("CANCELLED", "GONE")
                                           or any(_listening(p) for p in ports.values())
                                           or _servers_on(ports["HTTP_PORT"])):
        time.sleep(1)
    assert _job_state(job_id, env) in ("CANCELLED", "GONE"), _log_of(deploy)
    assert not [p for p in ports.values() if _listening(p)]
    assert not _servers_on(ports["HTTP_PORT"])
    assert "ok:" in _log_of(deploy)  # the job's log under the deployment directory (sbatch read its quoted path)
    assert not list(deploy.glob("prometheus-targets.json*"))  # the job's trap removed its scrape target
    assert not (tmp_path / "node" / f"trtllm-deploy-{job_id}").exists()  # nor the unpacked release
    assert not list(tmp_path.rglob("pwned*"))


FAKE_PIPELINE = """#!/bin/sh
# The pipeline's node-side commands, faked: verify and install-repo pass; serve records $WORK and sleeps SERVE_SECONDS.
case "$1" in
  serve) ls "$WORK" > "$MARKS/serving"; sleep "$SERVE_SECONDS" ;;
esac
"""


def _fake_release_job(tmp_path: Path, slurm, serve_seconds: int) -> tuple[str, Path, dict]:
    """serve.sbatch of a tiny reference spec over a fake release (a tarball holding <name>/triton_repo/m/) and a fake
    pipeline, submitted on the local cluster: (job id, the job's $WORK, env)."""
    releases, marks, tmp = tmp_path / "rel eases", tmp_path / "marks", tmp_path / "node tmp"
    for d in (releases, marks, tmp):
        d.mkdir(parents=True)
    fake = tmp_path / "fake-pipeline.sh"
    fake.write_text(FAKE_PIPELINE)
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    name = release_file(spec, __version__).removesuffix(".tar")
    with tarfile.open(releases / f"{name}.tar", "w") as tar:
        info = tarfile.TarInfo(f"{name}/triton_repo/m")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    deploy = tmp_path / "deploy"
    deploy_command(spec, platform="slurm", release_volume=str(releases), no_container=True, partition="cpu",
                   pipeline_cmd=f"/bin/sh {fake}", output=str(deploy))
    env = {**slurm.env, "TRTLLM_DEPLOY_TMP": str(tmp), "MARKS": str(marks), "SERVE_SECONDS": str(serve_seconds)}
    res = _run(["sbatch", "--parsable", str(deploy / "serve.sbatch")], env, timeout=60)
    job_id = res.stdout.strip().split(";")[0]
    return job_id, tmp / f"trtllm-deploy-{job_id}", env


def _wait_gone(job_id: str, env: dict, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _job_state(job_id, env) not in ("COMPLETED", "FAILED", "CANCELLED", "GONE"):
        time.sleep(1)
    assert _job_state(job_id, env) in ("COMPLETED", "FAILED", "CANCELLED", "GONE")


def test_a_serving_job_removes_its_work_directory_when_it_ends(slurm, tmp_path):
    """The unpacked release under $WORK is gone after the job: a normal exit (the server ends) and scancel."""
    job_id, work, env = _fake_release_job(tmp_path / "normal", slurm, serve_seconds=0)
    _wait_gone(job_id, env)
    assert (tmp_path / "normal" / "marks" / "serving").read_text().split() == ["REPO", "download", "release"]
    assert _job_state(job_id, env) in ("COMPLETED", "GONE") and not work.exists()
    job_id, work, env = _fake_release_job(tmp_path / "cancel", slurm, serve_seconds=300)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (tmp_path / "cancel" / "marks" / "serving").exists():
        time.sleep(1)
    assert (work / "REPO").is_file()  # serving: the release unpacked and installed there
    subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=60)
    _wait_gone(job_id, env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and work.exists():
        time.sleep(1)
    assert not work.exists() and not list((tmp_path / "cancel" / "node tmp").iterdir())
