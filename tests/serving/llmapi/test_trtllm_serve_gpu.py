"""trtllm-serve on builds of the tiny model (runtime pytorch: the HF checkpoint; runtime engine: the engine with
--backend tensorrt) — GPU hosts with TensorRT-LLM 1.2.1 only."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.serving.serve import free_port


def _skip_reason() -> str | None:
    if shutil.which("trtllm-serve") is None:
        return "needs TensorRT-LLM 1.2.1 (trtllm-serve is not on PATH)"
    if shutil.which("nvidia-smi") is None:
        return "needs an NVIDIA GPU with FP8 (nvidia-smi not found)"
    return None


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - 127.0.0.1 only
        return json.loads(resp.read())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_trtllm_serve_openai_routes(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    from pipeline.cli.commands import serve_command
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.build import build

    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", runtime="pytorch", gpu_count=1)
    build(spec, until="calibrate", progress=None)
    port = free_port()
    plan = serve_command(spec, mode="trtllm-serve", http_port=port, print_only=True)
    proc = subprocess.Popen(plan.argv)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)  # noqa: S310
                break
            except OSError:
                assert proc.poll() is None, "trtllm-serve exited during startup"
                time.sleep(2)
        out = _post(f"{base}/v1/completions", {"model": "tiny", "prompt": "The hive", "max_tokens": 8})
        assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] > 0
        chat = _post(f"{base}/v1/chat/completions",
                     {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
        assert chat["choices"][0]["message"]["content"] is not None
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _wait_healthy(proc: subprocess.Popen, base: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)  # noqa: S310 - 127.0.0.1 only
            return
        except OSError:
            assert proc.poll() is None, "trtllm-serve exited during startup"
            time.sleep(2)
    raise AssertionError(f"trtllm-serve not healthy within {timeout_s} s")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_trtllm_serve_on_an_engine_answers_chat_completions(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    from pipeline.cli.commands import serve_command
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.build import build

    spec = resolve_spec(model="tiny-llama", precision="fp8", gpu_count=1)
    build(spec, until="compile", progress=None)
    port = free_port()
    plan = serve_command(spec, mode="trtllm-serve", http_port=port, print_only=True)
    assert plan.backend == "tensorrt" and plan.argv[1].endswith("/engine") and "--tokenizer" in plan.argv
    assert Path(plan.options_file).is_file()  # a finished build: the printed command runs as is
    proc = subprocess.Popen(plan.argv)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, base)
        chat = _post(f"{base}/v1/chat/completions",
                     {"model": "engine", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
        assert chat["choices"][0]["message"]["content"] is not None and chat["usage"]["completion_tokens"] > 0
        out = _post(f"{base}/v1/completions", {"model": "engine", "prompt": "The hive", "max_tokens": 8})
        assert out["choices"][0]["text"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
