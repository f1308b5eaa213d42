"""The pipeline image: its name agrees across README, Dockerfile and `deploy`; it installs kubectl checked by sha256;
it installs this repository against TensorRT-LLM 1.2.1's stack without freezing the image."""

import hashlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from pipeline.core.errors import DeployError, HostError
from pipeline.ops.deploy import images

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
TRTLLM_REQUIREMENTS = ROOT / "tests" / "data" / "trtllm-1.2.1-requirements.txt"


def _instructions(text: str) -> list[str]:
    """Dockerfile instructions, continuation lines joined (comments dropped)."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1]
        else:
            out.append(cur + line)
            cur = ""
    return out


def _args() -> dict[str, str]:
    args = [i.split(None, 1)[1] for i in _instructions(DOCKERFILE.read_text()) if i.startswith("ARG ")]
    return dict(a.split("=", 1) for a in args)


def _pyproject_dependencies() -> list[Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(r) for r in doc["project"]["dependencies"]]


def _trtllm_requirements() -> dict[str, Requirement]:
    lines = [ln.split(" #")[0].strip() for ln in TRTLLM_REQUIREMENTS.read_text().splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln and not ln.startswith("#")]
    return {canonicalize_name(r.name): r for r in reqs}


def _near(v: Version) -> list[str]:
    """`v` and versions just above and below it (a specifier's boundary neighbours)."""
    parts = list(v.release)
    up = parts[:-1] + [parts[-1] + 1]
    down = parts[:-1] + [parts[-1] - 1] if parts[-1] > 0 else parts[:-1] + [999] if len(parts) == 1 else \
        parts[:-2] + [max(parts[-2] - 1, 0), 999]
    return [str(v), ".".join(map(str, up)), ".".join(map(str, down)), f"{v.base_version}.post1"]


def intersects(a: SpecifierSet, b: SpecifierSet) -> bool:
    """Whether some version satisfies both: tried at every bound of either set and just around it (a witness proves
    the intersection non-empty)."""
    candidates = {"0", "1", "999"}
    for spec in (*a, *b):
        candidates.update(_near(Version(spec.version.rstrip(".*"))))
    return any(a.contains(c, prereleases=True) and b.contains(c, prereleases=True) for c in candidates)


def test_intersection_check_can_fail():
    assert intersects(SpecifierSet(">=12,<14"), SpecifierSet(">=13"))
    assert intersects(SpecifierSet("<2"), SpecifierSet("<2"))
    assert intersects(SpecifierSet(">=2.9.1"), SpecifierSet(">=2.9.1,<=2.10.0a0"))
    assert not intersects(SpecifierSet("==4.57.3"), SpecifierSet("==4.57.1"))  # the old exact pin vs 1.2.0rc's
    assert not intersects(SpecifierSet(">=4.58"), SpecifierSet("==4.57.3"))
    assert not intersects(SpecifierSet("<2"), SpecifierSet(">=2.0"))


def test_our_requirements_fit_the_trtllm_1_2_1_stack():
    theirs = _trtllm_requirements()
    assert theirs["transformers"].specifier == SpecifierSet("==4.57.3")  # the data file is the 1.2.1 one
    ours = {canonicalize_name(r.name): r for r in _pyproject_dependencies()}
    shared = sorted(set(ours) & set(theirs))
    # the packages where a pin of ours could fight the image
    assert {"transformers", "torch", "numpy", "nvidia-modelopt", "pydantic", "nvidia-ml-py", "jsonschema"} <= set(
        shared)
    clashes = [f"{n}: ours {ours[n].specifier}, TensorRT-LLM 1.2.1 {theirs[n].specifier}" for n in shared
               if not intersects(ours[n].specifier, theirs[n].specifier)]
    assert clashes == []
    # TensorRT-LLM 1.2.x's own transformers pins (1.2.0 release candidate: 4.57.1; 1.2.1: 4.57.3) both satisfy ours
    assert all(ours["transformers"].specifier.contains(v) for v in ("4.57.1", "4.57.3"))


def test_dockerfile_constrains_only_the_engine_stack():
    text = DOCKERFILE.read_text()
    runs = [i for i in _instructions(text) if i.startswith("RUN ")]
    assert "pip freeze" not in text
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1
    install = installs[0]
    assert "python3 -m pipeline.ops.deploy.images > /tmp/engine-stack.txt" in install
    assert re.findall(r"(?:-c|--constraint)\s+(\S+)", install) == ["/tmp/engine-stack.txt"]
    assert "-r " not in install and "[gpu]" not in install
    assert images.ENGINE_STACK == ("tensorrt_llm", "torch")
    shipped = {"tensorrt_llm": "1.2.1", "torch": "2.10.0a0+b4e4ee81d3.nv26.04"}
    lines = images.engine_stack_constraints(shipped.__getitem__).splitlines()
    pins = [Requirement(ln) for ln in lines]
    assert {canonicalize_name(p.name) for p in pins} == {"tensorrt-llm", "torch"}
    assert [str(p.specifier) for p in pins] == ["==1.2.1", "==2.10.0a0+b4e4ee81d3.nv26.04"]
    # the image's torch (an NGC pre-release build) satisfies our torch requirement, as pip checks installed ones
    ours = {canonicalize_name(r.name): r for r in _pyproject_dependencies()}
    assert ours["torch"].specifier.contains(shipped["torch"], prereleases=True)


def test_constraints_module_refuses_a_host_without_tensorrt_llm():
    def lookup(name):
        if name == "tensorrt_llm":
            raise images.metadata.PackageNotFoundError(name)
        return "2.9.1"

    with pytest.raises(HostError, match="tensorrt_llm is not installed: build the pipeline image FROM nvcr.io"):
        images.engine_stack_constraints(lookup)
    # the Dockerfile's command, run before the repository is installed: only the standard library
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-S", "-m", "pipeline.ops.deploy.images"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == HostError.exit_code and run.stdout == ""
    assert run.stderr.startswith("error: tensorrt_llm is not installed")


def test_default_pipeline_image_is_what_readme_and_dockerfile_build():
    default = images.DEFAULT_PIPELINE_IMAGE
    assert default == "trtllm-pipeline:0.1.0-26.04-trtllm-python-py3"
    readme = (ROOT / "README.md").read_text()
    built = re.findall(r"docker build -t (\S+) \.", readme)
    assert built and set(built) == {default}
    assert re.findall(r"docker build -t (\S+) \.", DOCKERFILE.read_text()) == [default]
    args = _args()
    assert args["TRITON_VERSION"] == images.NGC_TRITON_RELEASE[images.TRTLLM_VERSION]
    assert args["TRTLLM_VERSION"] == images.TRTLLM_VERSION
    # every `docker run` example in README runs that image
    for line in re.findall(r"docker run(?:[^\n]*\\\n)*[^\n]*", readme):
        assert default in line, line


def test_pipeline_image_name_needs_a_server_tag():
    assert images.pipeline_image("registry.local:5000/triton:25.12-x", "0.2.0") == "trtllm-pipeline:0.2.0-25.12-x"
    for server in ("registry.local:5000/triton", "nvcr.io/nvidia/tritonserver@sha256:" + "a" * 64):
        with pytest.raises(DeployError, match="has no tag to name the pipeline image after; pass --pipeline-image"):
            images.pipeline_image(server, "0.1.0")


def _kubectl_run() -> str:
    (run,) = [i for i in _instructions(DOCKERFILE.read_text()) if i.startswith("RUN ") and "kubectl" in i]
    return run[len("RUN "):]


FAKE_KUBECTL = "#!/bin/sh\necho 'Client Version: fake'\n"
FAKE_SHA256 = hashlib.sha256(FAKE_KUBECTL.encode()).hexdigest()


def _fake_kubectl_build(tmp_path, sums: dict[str, str]):
    """Run the Dockerfile's kubectl RUN line (paths moved under tmp_path) with a fake curl that serves FAKE_KUBECTL.

    Returns (the finished process, where kubectl is installed, the URLs curl was asked for)."""
    fake = tmp_path / "fakebin"
    fake.mkdir(parents=True)
    (fake / "kubectl.bin").write_text(FAKE_KUBECTL)
    (fake / "curl").write_text('#!/bin/sh\necho "$@" >> "$CURL_LOG"\nwhile [ "$1" != -o ]; do shift; done\n'
                               f'cp {fake / "kubectl.bin"} "$2"\n')
    (fake / "curl").chmod(0o755)
    dest = tmp_path / "bin" / "kubectl"
    dest.parent.mkdir()
    script = _kubectl_run().replace("/usr/local/bin/kubectl", str(dest)).replace("/tmp/kubectl", str(tmp_path / "dl"))
    log = tmp_path / "curl.log"
    env = {**_args(), **sums, "CURL_LOG": str(log), "PATH": f"{dest.parent}:{fake}:{os.environ['PATH']}"}
    result = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    return result, dest, log.read_text().split() if log.exists() else []


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="kubectl is pinned for amd64/arm64")
def test_kubectl_is_installed_only_with_its_pinned_sha256(tmp_path):
    args = _args()
    assert re.fullmatch(r"v\d+\.\d+\.\d+", args["KUBECTL_VERSION"])
    for key in ("KUBECTL_SHA256_AMD64", "KUBECTL_SHA256_ARM64"):
        assert re.fullmatch(r"[0-9a-f]{64}", args[key])
    assert "ENV KUBECTL=/usr/local/bin/kubectl" in _instructions(DOCKERFILE.read_text())
    arch = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]

    # the pinned sums are not the fake binary's: the build fails and installs nothing
    result, dest, urls = _fake_kubectl_build(tmp_path / "pinned", {})
    assert result.returncode != 0 and not dest.exists()
    assert "FAILED" in result.stdout + result.stderr
    assert urls[-1] == f"https://dl.k8s.io/release/{args['KUBECTL_VERSION']}/bin/linux/{arch}/kubectl"

    # sums that match: installed, executable, and it runs
    result, dest, _ = _fake_kubectl_build(tmp_path / "ok", {"KUBECTL_SHA256_AMD64": FAKE_SHA256,
                                                            "KUBECTL_SHA256_ARM64": FAKE_SHA256})
    assert result.returncode == 0, result.stderr
    assert dest.stat().st_mode & 0o777 == 0o755 and "Client Version: fake" in result.stdout


def test_readme_dockerfile_and_images_name_one_tag_for_1_2_1_and_its_status():
    """The tag the deploy defaults pick for TensorRT-LLM 1.2.1 is the one README and the Dockerfile state, each
    saying that no NVIDIA page read confirms it."""
    release = images.NGC_TRITON_RELEASE["1.2.1"]
    assert images.ngc_image("1.2.1") == f"nvcr.io/nvidia/tritonserver:{release}-trtllm-python-py3"
    assert f"Which tag carries TensorRT-LLM 1.2.1: {release}-trtllm-python-py3, UNVERIFIED" in DOCKERFILE.read_text()
    assert _args()["TRITON_VERSION"] == release
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"(NGC `tritonserver:{release}-trtllm-python-py3`" in readme
    assert f"that {release} ships 1.2.1 is UNVERIFIED" in readme
    assert f"1.2.1 -> {release}: UNVERIFIED" in " ".join(images.__doc__.split())
