"""MoE in the planner: memory holds every expert, throughput reads the active ones, EP/TP placement as
tensorrt_llm/mapping.py maps it; trtllm-build's MoE plugin from the checkpoint's `moe` section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.gpus import GIB, GPUS
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from pipeline.planning.perf_model import EngineCost
from pipeline.planning.planner import format_capacity_plan, plan_capacity, weight_bytes

ROOT = Path(__file__).parents[2]


def test_mixtral_weights_count_every_expert():
    a = get_model("mixtral-8x7b").architecture
    fp8 = weight_bytes(a, "fp8")
    # linear weights (all 8 experts + attention) at 1 byte, embeddings/lm_head/norms/router at 2 bytes
    assert fp8 == a.linear_params + (a.embedding_params + a.norm_params) * 2
    assert 43 < fp8 / GIB < 44.5


def test_mixtral_reads_only_routed_experts():
    a = get_model("mixtral-8x7b").architecture
    cost = EngineCost(a, "fp8", "fp8", 2, GPUS["h100-sxm"])
    one = cost.weight_bytes(1)
    assert one < cost.weight_bytes(64) <= cost.weight_bytes()
    # one token reads 2 of 8 experts: about the active parameters, not the total
    assert one == pytest.approx((a.active_linear_params + a.vocab_size * a.hidden_size * 2) / 2)


def test_mixtral_plan_reports_total_active_and_placement():
    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=2)
    plan = plan_capacity(spec)
    moe = plan.as_dict()["moe"]
    assert (moe["total_params"], moe["active_params"]) == (46_702_792_704, 12_879_925_248)
    assert (moe["moe_tp_size"], moe["moe_ep_size"], moe["experts_per_gpu"], moe["expert_ffn_per_gpu"]) == (2, 1, 8, 7168)
    assert moe["runtime_options"] == {"mapping.moe_tp_size": 2, "mapping.moe_ep_size": 1}
    text = format_capacity_plan(plan)
    assert "parameters total / active" in text and "46.70 B / 12.88 B" in text and "moe_tp=2" in text


def test_mixtral_pytorch_expert_parallel():
    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=4, moe_ep=4, runtime="pytorch")
    moe = plan_capacity(spec).as_dict()["moe"]
    assert (moe["moe_tp_size"], moe["moe_ep_size"], moe["experts_per_gpu"], moe["expert_ffn_per_gpu"]) == (1, 4, 2, 14336)
    assert moe["runtime_options"] == {"moe_expert_parallel_size": 4, "moe_tensor_parallel_size": 1}
    # EP or TP: the same expert bytes per GPU
    tp_only = plan_capacity(resolve_spec(model="mixtral-8x7b", precision="fp8", tp=4, runtime="pytorch"))
    assert tp_only.as_dict()["moe"]["expert_weights_gib_per_gpu"] == moe["expert_weights_gib_per_gpu"]


def test_dense_plan_has_no_moe_key():
    assert "moe" not in plan_capacity(resolve_spec(model="llama-8b")).as_dict()


def test_moe_decode_is_faster_than_a_dense_model_of_its_total_size():
    """The roofline and estimate read the active experts: Mixtral (46.7 B total, 12.9 B active) decodes well above
    what 46.7 B dense weights would allow."""
    a = get_model("mixtral-8x7b").architecture
    moe = EngineCost(a, "fp8", "fp8", 2, GPUS["h100-sxm"])
    dense = EngineCost(a.model_copy(update={"num_experts": 0, "experts_per_token": 0, "family": "mistral",
                                            "intermediate_size": a.intermediate_size * 8}), "fp8", "fp8", 2,
                       GPUS["h100-sxm"])
    from pipeline.planning.perf_model import CALIBRATION

    kw = dict(context_tokens=0, context_len=0, decode_seqs=1, decode_len=1024)
    assert moe.step_ms(CALIBRATION, **kw) < 0.5 * dense.step_ms(CALIBRATION, **kw)


@pytest.mark.slow
def test_invoke_plan_mixtral_tp2(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PIPELINE_ROOT": str(tmp_path), "PIPELINE_CACHE": str(tmp_path / "c"),
           "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "invoke", "plan", "--model", "mixtral-8x7b", "--precision", "fp8",
                        "--tp", "2", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["moe"]["active_params"] < data["moe"]["total_params"] and data["weights_gib_total"] > 40


def test_pytorch_llm_api_options_carry_expert_parallelism():
    from pipeline.stages.package.llmapi_options import llm_api_options

    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=4, moe_ep=2, runtime="pytorch")
    opts = llm_api_options(spec, draft_dir=None).as_dict()
    assert (opts["moe_expert_parallel_size"], opts["moe_tensor_parallel_size"]) == (2, 2)
    dense = llm_api_options(resolve_spec(model="llama-8b", runtime="pytorch"), draft_dir=None).as_dict()
    assert "moe_expert_parallel_size" not in dense


def test_check_line_names_the_moe_mapping():
    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=4, moe_ep=2, runtime="pytorch")
    assert "tp=4 pp=1 moe_tp=2 moe_ep=2" in spec.summary()
    assert "moe_" not in resolve_spec(model="llama-8b").summary()
