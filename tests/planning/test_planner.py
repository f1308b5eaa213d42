"""Planner arithmetic against the published numbers."""

from __future__ import annotations

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GIB, GPUS
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from pipeline.planning.planner import kv_bytes_per_token, plan_capacity, weight_bytes

ARCH70 = get_model("llama-70b").architecture


@pytest.mark.parametrize("precision, gib", [("bf16", 131.4), ("fp8", 67.7), ("int4_awq", 36.8)])
def test_70b_weight_memory(precision, gib):
    assert weight_bytes(ARCH70, precision) / GIB == pytest.approx(gib, abs=0.1)


def test_awq_block_size_changes_scale_bytes():
    assert weight_bytes(ARCH70, "int4_awq", awq_block=64) > weight_bytes(ARCH70, "int4_awq", awq_block=128)


def test_70b_kv_bytes_per_token():
    assert kv_bytes_per_token(ARCH70, "bf16") == 320 * 1024
    assert kv_bytes_per_token(ARCH70, "fp8") == 160 * 1024
    assert kv_bytes_per_token(ARCH70, "fp8", tp=4) == 40 * 1024
    # more ranks than KV heads: each rank keeps at least one head
    assert kv_bytes_per_token(get_model("tiny-llama").architecture, "bf16", tp=8) == 2 * 4 * 1 * 32 * 2


def test_plan_70b_fp8_single_h100():
    p = plan_capacity(resolve_spec(model="llama-70b", precision="fp8"), input_len=1024, output_len=256)
    assert p.weights_gib_total == pytest.approx(67.7, abs=0.1)
    assert p.weights_gib_per_gpu == p.weights_gib_total
    assert p.kv_bytes_per_token_total == 163840
    assert p.fits and p.min_tp == 1
    # the KV pool is the memory fraction of what is left after weights and the runtime reserve
    free = GPUS["h100-sxm"].memory_gib - p.weights_gib_per_gpu - p.reserve_gib_per_gpu
    assert p.kv_pool_gib_per_gpu == pytest.approx(0.9 * free, abs=0.02)
    assert p.kv_cache_tokens == pytest.approx(p.kv_pool_gib_per_gpu * GIB / 163840, rel=0.01)
    assert p.max_concurrent_requests == p.kv_cache_tokens // 1280


def test_plan_70b_bf16_needs_two_gpus():
    p = plan_capacity(resolve_spec(model="llama-70b", precision="bf16"))
    assert not p.fits and p.min_tp == 2
    p4 = plan_capacity(resolve_spec(model="llama-70b", precision="bf16", tp=4))
    assert p4.fits and p4.weights_gib_per_gpu == pytest.approx(131.4 / 4, abs=0.05)
    assert p4.kv_bytes_per_token_per_gpu == 80 * 1024


def test_decode_bound_and_cost_are_consistent():
    p = plan_capacity(resolve_spec(model="llama-8b", precision="fp8", max_batch_size=16, gpu_price_per_hour=3.0))
    step = p.weights_gib_per_gpu * GIB + 16 * (p.input_len + p.output_len / 2) * p.kv_bytes_per_token_per_gpu
    assert p.decode_batch == 16
    assert p.decode_tokens_per_s_bound == pytest.approx(16 * 3.35e12 / step, rel=0.01)
    assert p.cost_per_1m_output_tokens_usd_at_bound == pytest.approx(3.0 / 3600 / p.decode_tokens_per_s_bound * 1e6,
                                                                     rel=0.01)
    assert p.cost_per_1m_output_tokens_usd == pytest.approx(3.0 / 3600 / p.output_tokens_per_s_estimate * 1e6,
                                                            rel=0.01)


def test_fp8_halves_kv_and_beats_bf16_on_cost():
    fp8 = plan_capacity(resolve_spec(model="llama-8b", precision="fp8"))
    bf16 = plan_capacity(resolve_spec(model="llama-8b", precision="bf16"))
    assert fp8.kv_cache_tokens > 1.9 * bf16.kv_cache_tokens
    assert fp8.cost_per_1m_output_tokens_usd < bf16.cost_per_1m_output_tokens_usd


def test_h200_holds_more_kv_than_h100():
    h100 = plan_capacity(resolve_spec(model="llama-70b", precision="fp8"))
    h200 = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", gpu="h200"))
    assert h200.kv_cache_tokens > 3 * h100.kv_cache_tokens


def test_draft_adds_weights_and_kv():
    base = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, max_batch_size=4))
    spec = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, max_batch_size=4, draft="llama-1b"))
    assert spec.draft_weights_gib_per_gpu > 0.3
    assert spec.kv_cache_tokens < base.kv_cache_tokens
    assert base.draft_tp is None and base.draft_kv_cache_tokens is None


ARCH1B = get_model("llama-1b").architecture


def test_draft_weights_and_kv_use_the_drafts_own_tp():
    one = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", max_batch_size=8))
    two = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", draft_tp=2,
                            max_batch_size=8))
    # TP 1 by default: the whole 1B on one GPU, not a quarter of it on each of the target's four
    assert one.draft_tp == 1 and one.draft_gpu_device_ids == [0]
    assert one.draft_weights_gib_per_gpu == pytest.approx(weight_bytes(ARCH1B, "fp8") / GIB, abs=0.01)
    assert two.draft_weights_gib_per_gpu == pytest.approx(one.draft_weights_gib_per_gpu / 2, abs=0.01)
    assert one.draft_kv_bytes_per_token_per_gpu == kv_bytes_per_token(ARCH1B, "fp8") == 16 * 1024
    assert two.draft_kv_bytes_per_token_per_gpu == kv_bytes_per_token(ARCH1B, "fp8", tp=2)


def test_draft_kv_pool_is_sized_for_the_drafts_batch():
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b")  # target batch 64
    p = plan_capacity(spec)
    assert p.draft_max_batch_size == 8
    # its own batch x one (S + K) sequence: 8 x 8224 tokens, far below its 0.2 memory fraction
    assert p.draft_kv_cache_tokens == spec.draft_max_tokens_in_paged_kv_cache == 8 * 8224
    assert p.draft_kv_pool_gib_per_gpu == pytest.approx(8 * 8224 * 16 * 1024 / GIB, abs=0.01)
    assert p.draft_max_concurrent_requests == 8
    doubled = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b",
                                draft_max_batch_size=16))
    assert doubled.draft_kv_cache_tokens == 2 * p.draft_kv_cache_tokens


def test_colocated_draft_costs_the_target_its_gpu_share_a_separate_gpu_does_not():
    shared = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", max_batch_size=8))
    apart = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", max_batch_size=8,
                              draft_gpu_device_ids=[4]))
    alone = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", tp=4, max_batch_size=8))
    # TP ranks allocate the smallest rank's pool: GPU 0 also holds the draft's weights and runtime
    assert shared.free_gib_per_gpu < apart.free_gib_per_gpu == alone.free_gib_per_gpu
    assert shared.kv_cache_tokens < apart.kv_cache_tokens
    # with a draft the target's fraction is 0.7 (0.9 without), wherever the draft sits
    assert apart.kv_pool_gib_per_gpu == pytest.approx(0.7 / 0.9 * alone.kv_pool_gib_per_gpu, abs=0.02)


def test_default_input_len_leaves_an_output_token_when_input_equals_seq():
    p = plan_capacity(resolve_spec(model="tiny-llama", precision="bf16", max_input_len=512, max_seq_len=512))
    assert p.input_len == 511 and p.output_len == 1


def test_max_tokens_in_paged_kv_cache_caps_pool():
    p = plan_capacity(resolve_spec(model="llama-8b", precision="fp8", max_tokens_in_paged_kv_cache=10000))
    assert p.kv_cache_tokens == 10000


def test_lengths_beyond_the_engine_limits_are_rejected():
    spec = resolve_spec(model="tiny-llama", precision="bf16")  # max_input_len 256, max_seq_len 512
    with pytest.raises(SpecError, match=r"--input-len=300 must be within 1\.\.max_input_len=256"):
        plan_capacity(spec, input_len=300)
    with pytest.raises(SpecError, match=r"--output-len=400 must be within 1\.\.312 \(max_seq_len=512 - input 200\)"):
        plan_capacity(spec, input_len=200, output_len=400)
    assert plan_capacity(spec, input_len=256, output_len=256).output_len == 256


def test_compare_70b_on_h100_reproduces_the_published_arithmetic():
    from pipeline.planning.perf_model import expected_tokens_per_step
    from pipeline.planning.compare import compare_plans

    spec = resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", max_batch_size=4, gpu_price_per_hour=3.2)
    c = compare_plans(spec, acceptance=0.7, prefix_hit_ratio=0.5)
    assert {r.precision for r in c.rows} == {"bf16", "fp8", "int4_awq", "w4a8_awq"}
    assert {r.tp for r in c.rows} == {1, 2, 4, 8} and {r.draft for r in c.rows} == {None, "llama-1b"}
    assert "calibrated against AIConfigurator 0.12" in c.assumption
    fp8 = [r for r in c.rows if r.precision == "fp8"]
    for r in fp8:
        assert r.weights_gib_total == pytest.approx(67.7, rel=0.01)  # FP8 weights ~ 67.7 GiB
        assert r.kv_bytes_per_token_total == 160 * 1024 and r.kv_kib_per_token_total == 160.0  # FP8 KV 160 KiB/token
    for r in c.rows:
        if r.output_tokens_per_s_estimate > 0:  # $ per 1M = gpus x $/h / 3600 / tok/s x 1e6
            assert r.cost_per_1m_output_tokens_usd == pytest.approx(
                r.gpus * 3.2 / 3600 / r.output_tokens_per_s_estimate * 1e6, rel=0.01)
            assert r.output_tokens_per_s_estimate < r.decode_tokens_per_s_bound
    bf16_tp1 = next(r for r in c.rows if (r.precision, r.tp, r.draft) == ("bf16", 1, None))
    assert not bf16_tp1.fits and bf16_tp1.cost_per_1m_output_tokens_usd is None
    off, on = (next(r for r in fp8 if r.tp == 4 and r.draft == d) for d in (None, "llama-1b"))
    plain = plan_capacity(resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", tp=4, max_batch_size=4),
                          prefix_hit_ratio=0.5)
    assert off.decode_tokens_per_s_bound == plain.decode_tokens_per_s_bound  # the same planner, not a copy
    assert off.output_tokens_per_s_estimate == plain.output_tokens_per_s_estimate
    e = expected_tokens_per_step(0.7, 5)
    assert e == pytest.approx((1 - 0.7**6) / 0.3) and on.tokens_per_target_step == pytest.approx(e, rel=1e-3)
    assert 1.0 < on.speculative_speedup < e  # a gain, less the draft's own steps
    assert on.cost_per_1m_output_tokens_usd < off.cost_per_1m_output_tokens_usd
    assert off.prefill_saving == 0.5 and off.prefill_ms_with_reuse < 0.75 * off.prefill_ms_cold


def test_compare_gates_speculation_above_the_cap_and_checks_its_inputs():
    from pipeline.planning.perf_model import expected_tokens_per_step
    from pipeline.planning.compare import compare_plans

    spec = resolve_spec(model="llama-8b", precision="fp8", gpu="h100-sxm", max_batch_size=64)
    rows = [r for r in compare_plans(spec).rows if r.draft and r.decode_batch > 8]
    assert rows and all(r.speculative_speedup == 1.0 and "gated off" in r.note for r in rows)
    assert expected_tokens_per_step(1.0, 5) == 6.0 and expected_tokens_per_step(0.0, 5) == 1.0
    with pytest.raises(SpecError):
        compare_plans(spec, acceptance=1.5)


def test_plan_compare_json_command(capsys):
    import json

    from pipeline.cli.commands import plan_command

    spec = resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", gpu_price_per_hour=3.2)
    plan_command(spec, compare=True, json_=True, acceptance="0.6", prefix_hit="0.5")
    data = json.loads(capsys.readouterr().out)
    assert data["acceptance_rate"] == 0.6 and data["prefix_hit_ratio"] == 0.5 and "calibrated" in data["assumption"]
    fp8 = [r for r in data["rows"] if r["precision"] == "fp8"]
    assert fp8 and all(abs(r["weights_gib_total"] / 67.7 - 1) < 0.01 and r["kv_kib_per_token_total"] == 160
                       for r in fp8)
    for r in data["rows"]:
        if r["cost_per_1m_output_tokens_usd"] is not None:
            expected = r["gpus"] * 3.2 / 3600 / r["output_tokens_per_s_estimate"] * 1e6
            assert abs(r["cost_per_1m_output_tokens_usd"] / expected - 1) < 0.01
