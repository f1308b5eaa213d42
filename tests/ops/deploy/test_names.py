"""Names Kubernetes and container runtimes accept: DNS-1123 labels/subdomains and image references."""

import pytest

from pipeline.core.errors import DeployError
from pipeline.ops.deploy import names

DIGEST = "sha256:" + "ab" * 32

GOOD_IMAGES = [
    "ubuntu", "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3", "localhost:5000/a/b:v1",
    "Registry.Example.COM:443/team/img_name__x.y-z:Tag_1.0", f"nvcr.io/nvidia/tritonserver@{DIGEST}",
    f"nvcr.io/nvidia/tritonserver:26.04@{DIGEST}", "[::1]:5000/img:latest", "a/b---c:" + "t" * 128,
]
BAD_IMAGES = [
    "", "Ubuntu", "nvcr.io/NVIDIA/tritonserver:1", "img:", "img:-tag", "img:" + "t" * 129, "img:a:b",
    "nvcr.io#nvidia/tritonserver:26.04", "img;rm -rf /", "img:1 ", " img", "a//b", "a/-b", "img@sha256:abc",
    "img@" + DIGEST.replace("sha256", "1sha"), "x" * 256, "img:\n", "img\n", "img:1\n",
]


@pytest.mark.parametrize("ref", GOOD_IMAGES)
def test_image_references_runtimes_pull_are_accepted(ref):
    assert names.image_reference(ref, "--image") == ref


@pytest.mark.parametrize("ref", BAD_IMAGES)
def test_malformed_image_references_are_refused(ref):
    with pytest.raises(DeployError, match="^--image .*: not an image reference"):
        names.image_reference(ref, "--image")


def test_dns1123_label_and_subdomain():
    assert names.dns1123_label("a" * 63, "--namespace") == "a" * 63
    for bad in ("a" * 64, "A", "a.b", "a_", "-a", "a-", "", "ns\n"):
        with pytest.raises(DeployError, match="--namespace .*not a DNS-1123 label"):
            names.dns1123_label(bad, "--namespace")
    ok = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    assert names.dns1123_subdomain(ok, "--release-volume") == ok
    for bad in (ok + "b", "a..b", ".a", "a.", "A", "a/b", "a b", "", "pvc\n"):
        with pytest.raises(DeployError, match="--release-volume .*not a DNS-1123 subdomain"):
            names.dns1123_subdomain(bad, "--release-volume")
