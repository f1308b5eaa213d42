"""The planner's estimate and memory fit against recorded NVIDIA AIConfigurator 0.12 runs (H100 SXM, TensorRT-LLM).

tests/data/aiconfigurator_0.12.json holds real `aiconfigurator cli estimate` runs (scripts/record_aiconfigurator.py:
the exact command, its TTFT/TPOT/tok/s and whether it ran out of memory or over its KV pool).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.gpus import GPUS
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from pipeline.planning.perf_model import CALIBRATION, EngineCost, Speculation, estimate, expected_tokens_per_step
from pipeline.planning.planner import plan_capacity, serving_estimate

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "aiconfigurator_0.12.json").read_text())
PRECISION = {"fp8_static": "fp8", "bfloat16": "bf16"}
TOLERANCE = 0.35
FIT_MARGIN = 0.9  # AIConfigurator fits, we do not: only when we hold at least this share of the batch
RECORDS = [r for r in DATA["records"] if r["gemm"] in PRECISION and r["system"] == "h100_sxm"]
OK = [r for r in RECORDS if r["status"] == "ok"]


def _id(r: dict) -> str:
    return f"{r['model']}-{r['gemm']}-tp{r['tp']}-{r['isl']}x{r['osl']}-b{r['batch']}" + (
        f"-prefix{r['prefix']}" if r["prefix"] else "")


def _spec(r: dict):
    return resolve_spec(model=r["model"], precision=PRECISION[r["gemm"]], tp=r["tp"], gpu="h100-sxm",
                        max_batch_size=r["batch"])


def _plan(r: dict):
    return plan_capacity(_spec(r), input_len=r["isl"], output_len=r["osl"], prefix_hit_ratio=r["prefix"] / r["isl"])


def test_the_table_is_a_real_recording_of_the_required_grid():
    assert DATA["aiconfigurator_version"].startswith("0.12.")
    assert all(r["command"].startswith("aiconfigurator cli estimate --model-path ") for r in DATA["records"])
    grid = {(r["model"], r["tp"], r["isl"], r["osl"]) for r in OK if r["gemm"] == "fp8_static"}
    for case in [("llama-70b", tp, i, o) for tp in (1, 4, 8) for i, o in ((1024, 256), (2048, 512))] + [
            ("llama-8b", tp, i, o) for tp in (1, 2) for i, o in ((1024, 256), (2048, 512))]:
        assert case in grid
    assert len(OK) >= 12 and {r["status"] for r in RECORDS} >= {"ok", "oom"}


@pytest.mark.parametrize("r", OK, ids=_id)
def test_estimate_within_35_percent_of_aiconfigurator(r):
    spec = _spec(r)
    p = _plan(r)
    if p.decode_batch == r["batch"]:
        got = (p.ttft_ms_estimate, p.tpot_ms_estimate, p.output_tokens_per_s_estimate)
    else:  # a batch we do not plan (memory): the same estimator at that batch
        est, _ = serving_estimate(spec, GPUS["h100-sxm"], tp=r["tp"], batch=r["batch"], input_len=r["isl"],
                                  output_len=r["osl"], acceptance=0.7, prefix_hit_ratio=r["prefix"] / r["isl"])
        got = (est.ttft_ms, est.tpot_ms, est.output_tokens_per_s)
    for name, ours, theirs in zip(("TTFT", "TPOT", "tok/s"), got, (r["ttft_ms"], r["tpot_ms"], r["tokens_per_s"]),
                                  strict=True):
        assert abs(ours / theirs - 1) <= TOLERANCE, f"{name}: ours {ours:.2f} vs AIConfigurator {theirs:.2f}"
    # the cost follows the estimate, and the roofline stays above it
    assert p.decode_tokens_per_s_bound >= p.output_tokens_per_s_estimate


@pytest.mark.parametrize("r", RECORDS, ids=_id)
def test_memory_fit_verdict_agrees_with_aiconfigurator(r):
    p = _plan(r)
    ours = p.fits and p.max_concurrent_requests >= r["batch"]
    theirs = r["status"] == "ok" and not r["kv_capacity_exceeded"]
    if not theirs:
        assert not ours, f"AIConfigurator: {r['status']} (KV over pool: {r['kv_capacity_exceeded']}); we fit " \
                         f"{p.max_concurrent_requests} requests"
    elif not ours:
        assert p.max_concurrent_requests >= FIT_MARGIN * r["batch"], \
            f"AIConfigurator fits batch {r['batch']}; we hold only {p.max_concurrent_requests}"


def test_headline_cases_estimate_within_ten_percent_and_the_bound_far_above():
    """70B TP4 batch 64, 70B TP1 batch 32, 8B TP1 batch 64 (FP8): the roofline is 1.9-4x AIConfigurator's tok/s."""
    for model, tp, batch, theirs in (("llama-70b", 4, 64, 2559.55), ("llama-70b", 1, 32, 709.61),
                                     ("llama-8b", 1, 64, 6719.95)):
        p = plan_capacity(resolve_spec(model=model, precision="fp8", tp=tp, max_batch_size=batch))
        assert p.decode_batch == batch
        assert abs(p.output_tokens_per_s_estimate / theirs - 1) < 0.1
        assert p.decode_tokens_per_s_bound > 1.5 * theirs  # the roofline: an upper bound, far above


def test_cost_comes_from_the_estimate_and_the_bound_gives_the_lower_cost():
    p = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, gpu_price_per_hour=3.0))
    assert p.cost_per_1m_output_tokens_usd == pytest.approx(4 * 3.0 / 3600 / p.output_tokens_per_s_estimate * 1e6,
                                                            rel=1e-3)
    assert p.cost_per_1m_output_tokens_usd_at_bound < p.cost_per_1m_output_tokens_usd


ENG70 = EngineCost(get_model("llama-70b").architecture, "fp8", "fp8", 4, GPUS["h100-sxm"])
ENG1 = EngineCost(get_model("llama-1b").architecture, "fp8", "fp8", 1, GPUS["h100-sxm"])


def test_speculation_divides_decode_steps_by_the_expected_tokens_at_the_drafts_cost():
    plain = estimate(ENG70, input_len=1024, output_len=256, batch=4)
    spec = estimate(ENG70, input_len=1024, output_len=256, batch=4, speculation=Speculation(ENG1, 5, 0.7))
    assert spec.tokens_per_target_step == pytest.approx(expected_tokens_per_step(0.7, 5))
    assert spec.decode_step_ms > plain.decode_step_ms  # verifying K + 1 tokens and the draft's K steps cost time
    assert 1.5 < spec.output_tokens_per_s / plain.output_tokens_per_s < spec.tokens_per_target_step
    useless = estimate(ENG70, input_len=1024, output_len=256, batch=4, speculation=Speculation(ENG1, 5, 0.0))
    assert useless.output_tokens_per_s < plain.output_tokens_per_s  # nothing accepted: pure overhead


def test_prefix_reuse_cuts_prefill_and_ttft():
    cold = estimate(ENG70, input_len=2048, output_len=256, batch=16)
    warm = estimate(ENG70, input_len=2048, output_len=256, batch=16, prefix_reused=1536)
    assert warm.prefill_ms < 0.5 * cold.prefill_ms and warm.ttft_ms < cold.ttft_ms
    assert warm.output_tokens_per_s > cold.output_tokens_per_s


def test_allreduce_and_tp_scaling():
    tp1 = estimate(EngineCost(ENG70.arch, "fp8", "fp8", 1, ENG70.gpu), input_len=1024, output_len=256, batch=8)
    tp8 = estimate(EngineCost(ENG70.arch, "fp8", "fp8", 8, ENG70.gpu), input_len=1024, output_len=256, batch=8)
    # eight GPUs are faster, but less than 8x: the all-reduces and per-layer costs do not shrink with TP
    assert 2 < tp1.tpot_ms / tp8.tpot_ms < 8
    assert CALIBRATION.hbm_efficiency <= 1 and CALIBRATION.gemm_efficiency_fp8 <= 1
