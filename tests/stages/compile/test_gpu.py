"""The real engine build of the tiny model pair — GPU hosts with TensorRT-LLM 1.2.1 only (skipped elsewhere)."""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path

import pytest

from pipeline.core.artifacts import read_manifest
from pipeline.core.spec import resolve_spec


def _skip_reason() -> str | None:
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "needs TensorRT-LLM 1.2.1 (tensorrt_llm is not installed on this host)"
    if shutil.which("nvidia-smi") is None:
        return "needs an NVIDIA GPU with SM 9.0 (nvidia-smi not found)"
    if importlib.util.find_spec("pipeline.stages.calibrate") is None:
        return "needs the calibrate stage (pipeline.stages.calibrate) to export the tiny checkpoints"
    return None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_real_build_tiny_llama_fp8_with_draft(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from pipeline.stages.calibrate.stage import run_calibrate
    from pipeline.stages.compile.stage import CompileIO, run_compile

    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft", gpu_count=1)
    target_ckpt = Path(run_calibrate(spec, role="target").path)
    draft_ckpt = Path(run_calibrate(spec, role="draft").path)
    out, draft_out = target_ckpt.parent / "engine", target_ckpt.parent / "draft_engine"
    res, draft_res = run_compile(spec, CompileIO(checkpoint=target_ckpt, output_dir=out, draft_checkpoint=draft_ckpt,
                                                 draft_output_dir=draft_out))
    m = res.manifest
    assert res.status == "built" and m.engine_version == "1.2.1" and m.toolchain["tensorrt_llm"] == "1.2.1"
    assert m.gpu.sm == 90
    assert (out / "rank0.engine").stat().st_size > 0 and (draft_out / "rank0.engine").stat().st_size > 0
    assert m.draft.tokenizer == m.tokenizer and m.draft.key == read_manifest(draft_out)["key"] == draft_res.manifest.key
    assert "timing.cache" in m.files
    # Same inputs on the same toolchain + arch: no rebuild, the manifest is returned as is.
    start = time.monotonic()
    again, _ = run_compile(spec, CompileIO(checkpoint=target_ckpt, output_dir=out, draft_checkpoint=draft_ckpt,
                                           draft_output_dir=draft_out))
    assert again.status == "cached" and again.manifest.key == m.key and again.manifest.created == m.created
    assert time.monotonic() - start < 120  # preflight import only, no trtllm-build
