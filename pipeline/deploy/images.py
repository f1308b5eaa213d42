"""Container images of a deployment: the NGC Triton image that ships the release's TensorRT-LLM, and ours.

NGC publishes `nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3` monthly, each with one TensorRT-LLM release.
Sources of the table (TensorRT-LLM version -> Triton release):
- 1.0.0 -> 25.10, 1.1.0 -> 25.12: Triton's release compatibility matrix, container trtllm-python-py3
  (docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html).
- 1.2.0 -> 26.03, 1.2.1 -> 26.04: users' deployment notes in the code index (TensorRT-LLM 1.2.0 run from
  "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3"; "Triton 26.04 = v2.68.0 ... TRT-LLM 1.2.1"); 25.12 and 26.02
  still ship 1.1.0. The matrix page in the index stops at 25.12: check the NGC page before relying on these two,
  or pin the image yourself with `--image`.
"""

from __future__ import annotations

from ..errors import DeployError

NGC_TRITON_RELEASE = {"1.0.0": "25.10", "1.1.0": "25.12", "1.2.0": "26.03", "1.2.1": "26.04"}
TRTLLM_VERSION = "1.2.1"  # the toolchain this pipeline builds for (a spec-only deployment assumes it)
PIPELINE_HOME = "/opt/trtllm-pipeline"  # where the pipeline image holds this repository (tasks.py)


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
    """Default name of this pipeline's image (built FROM `server_image`, repository at PIPELINE_HOME)."""
    tag = server_image.rsplit(":", 1)[-1]
    return f"trtllm-pipeline:{version}-{tag}"
