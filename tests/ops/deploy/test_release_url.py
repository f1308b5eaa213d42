"""--release-url is parsed: http(s) with a host, and credentials in it are refused, never written (issue 33, class
6); the same check serves k8s and Slurm."""

from __future__ import annotations

import pytest

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import resolve_spec


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
    deploy_command(spec, platform=platform, release_url=url, output=str(tmp_path / "d"))
    assert "X-Amz-Signature=abc" in (tmp_path / "d" / file).read_text()
