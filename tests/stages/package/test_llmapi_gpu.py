"""The `--target trtllm` llmapi repository (our model.py on tensorrt_llm.LLM, PyTorch backend) under the GPU
tritonserver — GPU hosts with TensorRT-LLM 1.2.1 and the NGC Triton image only (skipped elsewhere, never faked)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import urllib.request

import pytest

from pipeline.core.spec import resolve_spec
from pipeline.serving.serve import TritonServer, find_gpu_tritonserver
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import llm_api_options
from pipeline.stages.package.llmapi_package import package_llmapi_repo
from tests.support.llmapi_fixtures import fabricated_fp8_export


def _skip_reason() -> str | None:
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "needs TensorRT-LLM 1.2.1 (tensorrt_llm is not installed on this host)"
    if shutil.which("nvidia-smi") is None:
        return "needs an NVIDIA GPU with SM >= 89 for FP8 (nvidia-smi not found)"
    if find_gpu_tritonserver() is None:
        return "needs the NGC tritonserver (…-trtllm-python-py3) with the Python backend"
    return None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_llmapi_repo_serves_on_gpu(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    target = fabricated_fp8_export(tiny_models["tiny-llama"], tmp_path / "t" / "hf_checkpoint")
    draft = fabricated_fp8_export(tiny_models["tiny-llama-draft"], tmp_path / "d" / "hf_checkpoint")
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="trtllm", runtime="pytorch",
                        gpu_count=1)
    inputs = PackageInputs(checkpoint=target, draft_checkpoint=draft, output=tmp_path / "repos")
    repo = package_llmapi_repo(spec, inputs, options=llm_api_options(spec, draft_dir=draft)).path
    with TritonServer(repo, binary=find_gpu_tritonserver(), ready_timeout_s=900) as srv:
        body = json.dumps({"text_input": "Once upon a time", "sampling_param_max_tokens": 8,
                           "sampling_param_return_perf_metrics": True}).encode()
        req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body)
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read())
    assert out["text_output"].strip()
    assert out["total_draft_tokens"] > 0 and "kv_cache_hit_rate" in out
