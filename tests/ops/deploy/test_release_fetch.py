"""User story: `invoke release` a build, `invoke deploy` the same spec (Slurm and Kubernetes, a release volume or an
HTTP URL), and the rendered fetch-verify.sh finds, downloads (resuming a dropped transfer), verifies and installs
exactly the file `release` wrote. Everything runs for real: the invoke CLI, the scripts, curl, tar."""

from __future__ import annotations

import http.server
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.support.k8s import PIPELINE_IMAGE

REPO = Path(__file__).resolve().parents[3]
INVOKE = [sys.executable, "-m", "invoke", "-r", str(REPO)]
SPEC = ["--model", "tiny-llama", "--precision", "fp8", "--runtime", "pytorch", "--calib-size", "4",
        "--calib-seq-len", "32"]

pytestmark = pytest.mark.slow


def _invoke(*args: str, env: dict) -> subprocess.CompletedProcess:
    res = subprocess.run([*INVOKE, *args], env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res


def _fetch_verify(script: Path, env: dict, node: Path) -> subprocess.CompletedProcess:
    """Run a rendered fetch-verify.sh as a node would, with this venv's pipeline and a private $WORK."""
    run_env = {**env, "WORK": str(node), "PIPELINE": shlex.join(INVOKE), "PIPELINE_PYTHON": sys.executable}
    return subprocess.run(["/bin/sh", str(script)], env=run_env, capture_output=True, text=True, timeout=600)


def _installed(node: Path) -> Path:
    repo = Path((node / "REPO").read_text().strip())
    assert repo.parent.name == "triton_repo" and (repo / "tensorrt_llm" / "1" / "model.yaml").is_file()
    assert (node / "serve" / "tiny-llama-fp8-tp1" / "hf_quant_config.json").is_file()  # node setup of runtime pytorch
    return repo


class _FlakyRanges(http.server.SimpleHTTPRequestHandler):
    """Serves files with `Range: bytes=N-`; the first GET of a file stops halfway (a dropped connection)."""

    dropped: set[str] = set()
    ranges: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        data = path.read_bytes()
        start = int(self.headers.get("Range", "bytes=0-")[len("bytes="):].split("-")[0] or 0)
        self.ranges.append(self.headers.get("Range", ""))
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if self.path not in self.dropped:
            self.dropped.add(self.path)
            self.wfile.write(data[start:len(data) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(data[start:])


def test_release_then_deploy_the_spec_fetches_verifies_and_installs_that_release(pipeline_env, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    releases = tmp_path / "releases"
    _invoke("build", *SPEC, env=env)
    _invoke("release", *SPEC, "--output", str(releases), env=env)
    (tarball,) = releases.glob("*.tar")
    digest = (releases / f"{tarball.name}.sha256").read_text().split()[0]

    # Slurm, from the spec: the sbatch exports the release file `release` wrote and the shared directory.
    _invoke("deploy", "--platform", "slurm", *SPEC, "--release-volume", str(releases), "--no-container",
            "--output", str(tmp_path / "slurm"), env=env)
    sbatch = (tmp_path / "slurm" / "serve.sbatch").read_text()
    exports = dict(shlex.split(ln[len("export "):])[0].split("=", 1) for ln in sbatch.splitlines()
                   if ln.startswith("export RELEASE_"))
    assert exports == {"RELEASE_FILE": tarball.name, "RELEASE_DIR": str(releases)}
    res = _fetch_verify(tmp_path / "slurm" / "fetch-verify.sh", {**env, **exports}, tmp_path / "node-slurm")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "tarball" in res.stdout and "files verified" in res.stdout
    _installed(tmp_path / "node-slurm")

    # Kubernetes, from the spec, over HTTP: the first transfer drops halfway and curl resumes from where it stopped.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             lambda *a: _FlakyRanges(*a, directory=str(releases)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{tarball.name}"
        _invoke("deploy", "--platform", "k8s", *SPEC, "--release-url", url, "--output", str(tmp_path / "k8s"),
                "--pipeline-image", PIPELINE_IMAGE, env=env)
        objects = list(yaml.safe_load_all((tmp_path / "k8s" / "serving.yaml").read_text()))
        config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
        pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
        init = {e["name"]: e["value"] for e in pod["initContainers"][0]["env"] if "value" in e}
        assert (init["RELEASE_FILE"], init["RELEASE_URL"]) == (tarball.name, url)
        script = tmp_path / "k8s-fetch-verify.sh"
        script.write_text(config["fetch-verify.sh"])
        node = tmp_path / "node-k8s"
        res = _fetch_verify(script, {**env, **init, "RELEASE_SHA256": digest, "FETCH_RETRY_DELAY": "0"}, node)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert _FlakyRanges.ranges[0] == "" and _FlakyRanges.ranges[1] == f"bytes={tarball.stat().st_size // 2}-"
        assert (node / "download" / tarball.name).read_bytes() == tarball.read_bytes()
        _installed(node)
        # A pinned sha256 that differs: refused (exit 3), the bad download removed, nothing installed.
        bad = _fetch_verify(script, {**env, **init, "RELEASE_SHA256": "0" * 64}, tmp_path / "node-bad")
        assert bad.returncode == 3 and "--sha256 000000000000" in bad.stderr
        assert not (tmp_path / "node-bad" / "REPO").exists()
        assert not (tmp_path / "node-bad" / "download" / tarball.name).exists()
    finally:
        server.shutdown()
