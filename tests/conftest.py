"""Shared pytest fixtures. Each section is owned by one module's author; append new sections at the end."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# --- Section: network isolation -------------------------------------------------------
# Set before anything imports huggingface_hub or transformers (they read these at import time): a closed loopback
# endpoint, offline mode, and a private HF_HOME so no real token or cache is ever used. Tests that talk to the
# local Hub server (tests/support/hubserver.py) switch offline mode off explicitly for themselves.
_HF_HOME = tempfile.mkdtemp(prefix="pipeline-test-hf-home-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens on the discard port: fails fast
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.pop("HF_TOKEN", None)
os.environ.pop("HUGGING_FACE_HUB_TOKEN", None)

from pathlib import Path

import pytest


def _loopback_only_backend():
    """requests session for huggingface_hub that refuses every host but 127.0.0.1/localhost."""
    import requests
    from huggingface_hub import constants
    from huggingface_hub.utils._http import OfflineAdapter, UniqueRequestIdAdapter

    class LoopbackOnly(UniqueRequestIdAdapter):
        def send(self, request, *args, **kwargs):
            host = requests.utils.urlparse(request.url).hostname
            if host not in ("127.0.0.1", "localhost"):
                raise requests.ConnectionError(f"test suite refused a non-loopback request to {request.url}")
            return super().send(request, *args, **kwargs)

    session = requests.Session()
    adapter = OfflineAdapter() if constants.HF_HUB_OFFLINE else LoopbackOnly()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


@pytest.fixture(scope="session", autouse=True)
def _no_real_hub():
    """Every huggingface_hub request goes through a loopback-only session (and is offline unless a test says not)."""
    from huggingface_hub import configure_http_backend

    configure_http_backend(backend_factory=_loopback_only_backend)
    yield


@pytest.fixture
def hub_online(monkeypatch):
    """Allow huggingface_hub requests (to 127.0.0.1 only) for one test."""
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    reset_sessions()
    yield
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    reset_sessions()


# --- Section: generated tiny models ----------------------------------------------------
@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Both generated tiny models, trained once per test session (~45 s on 2 cores): name -> HF-format dir.

    Set PIPELINE_TEST_MODEL_CACHE to a directory to reuse them across sessions (it is keyed by generator version).
    """
    from pipeline.stages.download.tinymodel import GENERATED_MODELS, ensure_tiny_model

    root = os.environ.get("PIPELINE_TEST_MODEL_CACHE") or str(tmp_path_factory.mktemp("model-cache"))
    old = os.environ.get("PIPELINE_CACHE")
    os.environ["PIPELINE_CACHE"] = root
    try:
        return {name: ensure_tiny_model(name) for name in GENERATED_MODELS}
    finally:
        if old is None:
            os.environ.pop("PIPELINE_CACHE", None)
        else:
            os.environ["PIPELINE_CACHE"] = old


@pytest.fixture
def pipeline_env(monkeypatch, tmp_path, tiny_models) -> Path:
    """PIPELINE_ROOT/PIPELINE_CACHE in tmp_path, with the session's generated models already in the cache."""
    root, cache = tmp_path / "out", tmp_path / "cache"
    monkeypatch.setenv("PIPELINE_ROOT", str(root))
    monkeypatch.setenv("PIPELINE_CACHE", str(cache))
    (cache / "generated").mkdir(parents=True)
    for path in tiny_models.values():
        (cache / "generated" / path.name).symlink_to(path, target_is_directory=True)
    return tmp_path


# --- Section: packaged tiny reference repositories (owner: Triton serving tests) ------------------------------------
@pytest.fixture(scope="session")
def tiny_reference_repo(tiny_models, tmp_path_factory):
    """Factory: `package --target reference` of tiny-llama fp8 + tiny-llama-draft under a fresh output root.

    `make(build_id, **spec_overrides)` returns the repository path (serving the generated HF-format models).
    """
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    def make(build_id: str, **spec_overrides) -> Path:
        base = tmp_path_factory.mktemp(build_id)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PIPELINE_ROOT", str(base / "out"))
            mp.setenv("PIPELINE_CACHE", str(base / "cache"))
            spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference",
                                **spec_overrides)
            inputs = PackageInputs(checkpoint=tiny_models["tiny-llama"],
                                   draft_checkpoint=tiny_models["tiny-llama-draft"], build_id=build_id)
            return package_repo(spec, inputs).path

    return make
