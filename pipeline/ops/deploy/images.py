"""Container images of a deployment: the NGC Triton image that ships the release's TensorRT-LLM, and ours.

NGC publishes `nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3` monthly, each with one TensorRT-LLM release.
Sources of the table (TensorRT-LLM version -> Triton release):
- 1.0.0 -> 25.10, 1.1.0 -> 25.12: Triton's release compatibility matrix, container trtllm-python-py3
  (docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html).
- 1.2.0 -> 26.03, 1.2.1 -> 26.04: UNVERIFIED from NVIDIA's own pages (the Dockerfile comment lists what was
  searched: the matrix stops at 25.12, the rel-26-04 release notes as read list no versions); users' deployment notes
  in the code index say so (TensorRT-LLM 1.2.0 run from "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3";
  "Triton 26.04 = v2.68.0 ... TRT-LLM 1.2.1"). The Dockerfile's build fails on another TensorRT-LLM; check the NGC
  page before relying on these two, or pin the image yourself with `--image`.

Ours, `trtllm-pipeline:<pipeline version>-<server tag>` (DEFAULT_PIPELINE_IMAGE for the default server image, the name
README's `docker build -t` gives it), is the Dockerfile's build FROM the server image: kubectl, and this repository
installed with the engine stack (ENGINE_STACK) pinned to the versions the server image ships.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import metadata

from pipeline import __version__
from pipeline.core.errors import DeployError, HostError
from pipeline.ops.deploy.names import TAG

NGC_TRITON_RELEASE = {"1.0.0": "25.10", "1.1.0": "25.12", "1.2.0": "26.03", "1.2.1": "26.04"}
TRTLLM_VERSION = "1.2.1"  # the toolchain this pipeline builds for (a spec-only deployment assumes it)
PIPELINE_HOME = "/opt/trtllm-pipeline"  # where the pipeline image holds this repository (tasks.py)
PIPELINE_REPOSITORY = "trtllm-pipeline"
# What the pipeline image keeps exactly as the NGC image ships it when it installs this repository (Dockerfile):
# the engine contract. Everything else resolves against our requirements (pyproject.toml).
ENGINE_STACK = ("tensorrt_llm", "torch")


def ngc_image(trtllm_version: str) -> str:
    """The NGC Triton image that ships `trtllm_version`.

    Raises:
        DeployError: no image is known for that version (the message says to pass --image).
    """
    release = NGC_TRITON_RELEASE.get(trtllm_version)
    if release is None:
        known = ", ".join(sorted(NGC_TRITON_RELEASE))
        raise DeployError(f"no NGC tritonserver image is known for TensorRT-LLM {trtllm_version} (known: {known}); "
                          "pass --image nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 with that version")
    return f"nvcr.io/nvidia/tritonserver:{release}-trtllm-python-py3"


def pipeline_image(server_image: str, version: str) -> str:
    """Default name of this pipeline's image, `trtllm-pipeline:<version>-<server tag>` (built FROM `server_image`,
    repository at PIPELINE_HOME).

    Raises:
        DeployError: `server_image` has no tag to name ours after (the message says to pass --pipeline-image).
    """
    name, _, tag = server_image.split("@", 1)[0].rpartition(":")
    if not name or "/" in tag or not TAG.fullmatch(f"{version}-{tag}"):
        raise DeployError(f"--image {server_image!r} has no tag to name the pipeline image after; pass "
                          "--pipeline-image with the image you built FROM it (see the Dockerfile)")
    return f"{PIPELINE_REPOSITORY}:{version}-{tag}"


# `docker build -t` of the README and the Dockerfile: the image `deploy` runs by default.
DEFAULT_PIPELINE_IMAGE = pipeline_image(ngc_image(TRTLLM_VERSION), __version__)


def engine_stack_constraints(version: Callable[[str], str] = metadata.version) -> str:
    """pip constraints pinning ENGINE_STACK to the versions installed here (`version`: distribution -> version).

    Raises:
        HostError: a distribution of the stack is not installed (not an NGC TensorRT-LLM image).
    """
    lines = []
    for dist in ENGINE_STACK:
        try:
            lines.append(f"{dist}=={version(dist)}")
        except metadata.PackageNotFoundError:
            raise HostError(f"{dist} is not installed: build the pipeline image FROM "
                            f"{ngc_image(TRTLLM_VERSION)} (or another image that ships TensorRT-LLM)") from None
    return "\n".join(lines) + "\n"


def main() -> int:
    """`python3 -m pipeline.ops.deploy.images`: print the engine-stack constraints (the Dockerfile runs it before
    installing this repository, which needs nothing but the standard library)."""
    try:
        sys.stdout.write(engine_stack_constraints())
    except HostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
