"""--release-url is parsed: http(s) with a host, and credentials in it are refused, never written (issue 33, class
6); the same check serves k8s and Slurm."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.runtime import FETCH_VERIFY
from tests.support.k8s import PIPELINE_IMAGE


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    return resolve_spec(model="llama-8b", precision="fp8", tp=1)


@pytest.mark.parametrize("platform", ["k8s", "slurm"])
@pytest.mark.parametrize("url", ["https://user:s3cret@host/r.tar", "http://s3cret@host/r.tar",
                                 "https://user:s3cret@[::1]:8443/r.tar"])
def test_credentials_in_the_url_are_refused_and_never_shown(spec, tmp_path, platform, url):
    with pytest.raises(DeployError, match="credentials in the URL") as e:
        deploy_command(spec, platform=platform, release_url=url, output=str(tmp_path / "d"))
    assert e.value.exit_code == 2 and "s3cret" not in str(e.value) and "--release-volume" in str(e.value)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("platform", ["k8s", "slurm"])
@pytest.mark.parametrize("url, why", [
    ("ftp://host/r.tar", "http\\(s\\) URL with a host"),
    ("file:///releases/r.tar", "http\\(s\\) URL with a host"),
    ("https:///r.tar", "http\\(s\\) URL with a host"),
    ("https://", "http\\(s\\) URL with a host"),
    ("https:host/r.tar", "http\\(s\\) URL with a host"),
    ("https://host:99999/r.tar", "not a URL"),
    ("https://[::1/r.tar", "not a URL"),
    ("https://host/r.tar\nexport X=1", "whitespace or control"),
    ("https://host/my release.tar", "whitespace or control"),
])
def test_a_release_url_that_is_not_http_s_with_a_host_is_refused(spec, tmp_path, platform, url, why):
    with pytest.raises(DeployError, match=why) as e:
        deploy_command(spec, platform=platform, release_url=url, output=str(tmp_path / "d"))
    assert e.value.exit_code == 2 and not (tmp_path / "d").exists()


@pytest.mark.parametrize("platform, file", [("k8s", "serving.yaml"), ("slurm", "serve.sbatch")])
def test_a_plain_or_pre_signed_url_is_written(spec, tmp_path, platform, file):
    url = "https://bucket.s3.amazonaws.com/r.tar?X-Amz-Expires=3600&X-Amz-Signature=abc"
    deploy_command(spec, platform=platform, release_url=url, pipeline_image=PIPELINE_IMAGE, output=str(tmp_path / "d"))
    assert "X-Amz-Signature=abc" in (tmp_path / "d" / file).read_text()


def test_k8s_release_secret_feeds_the_fetch_a_header_from_a_secret(spec, tmp_path):
    url = "https://host/r.tar"
    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=url, release_secret="release-auth",
                   output=str(tmp_path / "d"))
    text = (tmp_path / "d" / "serving.yaml").read_text()
    objs = list(yaml.safe_load_all(text))
    pod = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["initContainers"][0]["env"]}
    assert env["RELEASE_AUTH_HEADER"]["valueFrom"] == {"secretKeyRef": {"name": "release-auth", "key": "header"}}
    assert env["RELEASE_URL"]["value"] == url


@pytest.mark.parametrize("platform, kw, match", [
    ("slurm", {"release_url": "https://host/r.tar"}, "on Slurm export RELEASE_AUTH_HEADER"),
    ("k8s", {"release_volume": "releases"}, "--release-secret without --release-url"),
    ("k8s", {"release_url": "https://host/r.tar", "release_secret": "Bad_Secret"}, "--release-secret"),
])
def test_release_secret_misuse_is_refused(spec, tmp_path, platform, kw, match):
    kw = {"release_secret": "release-auth", "pipeline_image": PIPELINE_IMAGE} | kw
    with pytest.raises(DeployError, match=match) as e:
        deploy_command(spec, platform=platform, output=str(tmp_path / "d"), **kw)
    assert e.value.exit_code == 2 and not (tmp_path / "d").exists()


class _Server(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        ok = self.headers.get("Authorization") == "Bearer tok"
        body = b"release bytes" if ok else b"no"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("header, fetched", [("Authorization: Bearer tok", True), (None, False)])
def test_fetch_verify_sends_the_secret_header_only_when_set(tmp_path, header, fetched):
    """The rendered fetch step, run for real against a server that wants the header (verify stubbed out)."""
    script = tmp_path / "fetch-verify.sh"
    script.write_text(FETCH_VERIFY)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    env = {"PATH": os.environ["PATH"], "WORK": str(tmp_path / "node"), "PIPELINE": "false", "FETCH_ATTEMPTS": "1",
           "RELEASE_FILE": "r.tar", "RELEASE_URL": f"http://127.0.0.1:{srv.server_address[1]}/r.tar"}
    if header:
        env["RELEASE_AUTH_HEADER"] = header
    try:
        res = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        srv.shutdown()
    tarball = tmp_path / "node" / "download" / "r.tar"
    assert tarball.is_file() == fetched and res.returncode == (1 if fetched else 5)  # 1: the stubbed verify
