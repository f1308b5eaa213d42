"""The trtllm-serve plan: exact argv for one node and for Slurm across nodes, and the CLI mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import HostError, SpecError
from pipeline.llmapi import serve_plan
from pipeline.spec import resolve_spec


def test_single_node_argv():
    spec = resolve_spec(model="llama-8b", precision="fp8", tp=2, pp=2, runtime="pytorch")
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/m/hf"), options_file=Path("/m/o.yaml"), port=8123)
    assert plan.argv == ["trtllm-serve", "/m/hf", "--backend", "pytorch", "--tp_size", "2", "--pp_size", "2",
                         "--host", "127.0.0.1", "--port", "8123", "--extra_llm_api_options", "/m/o.yaml"]
    assert (plan.world_size, plan.nodes, plan.multi_node) == (4, 1, False)


def test_multi_node_uses_slurm_and_the_llmapi_launcher():
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=8, pp=2, nodes=2, gpus_per_node=8, runtime="pytorch")
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/m"), options_file=Path("/o.yaml"), host="0.0.0.0")
    assert plan.argv[:6] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
                             "trtllm-llmapi-launch"]
    assert plan.argv[6:8] == ["trtllm-serve", "/m"] and plan.multi_node and plan.world_size == 16


def test_missing_trtllm_serve_is_a_host_error(monkeypatch):
    monkeypatch.setattr(serve_plan.shutil, "which", lambda name: None)
    with pytest.raises(HostError, match="trtllm-serve is not on PATH") as err:
        serve_plan.require_trtllm_serve()
    assert err.value.exit_code == 4


def test_serve_mode_needs_a_pytorch_spec():
    from pipeline.commands import serve_command

    with pytest.raises(SpecError, match="--mode trtllm-serve serves a runtime-pytorch build"):
        serve_command(resolve_spec(model="tiny-llama"), mode="trtllm-serve")
    with pytest.raises(SpecError, match="--mode 'vllm'"):
        serve_command(None, mode="vllm")
