"""Planner arithmetic against the published numbers (FACTS §7)."""

from __future__ import annotations

import pytest

from pipeline.errors import SpecError
from pipeline.gpus import GIB, GPUS
from pipeline.planner import kv_bytes_per_token, plan, weight_bytes
from pipeline.registry import get_model
from pipeline.spec import resolve_spec

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
    p = plan(resolve_spec(model="llama-70b", precision="fp8"), input_len=1024, output_len=256)
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
    p = plan(resolve_spec(model="llama-70b", precision="bf16"))
    assert not p.fits and p.min_tp == 2
    p4 = plan(resolve_spec(model="llama-70b", precision="bf16", tp=4))
    assert p4.fits and p4.weights_gib_per_gpu == pytest.approx(131.4 / 4, abs=0.05)
    assert p4.kv_bytes_per_token_per_gpu == 80 * 1024


def test_decode_bound_and_cost_are_consistent():
    p = plan(resolve_spec(model="llama-8b", precision="fp8", max_batch_size=16, gpu_price_per_hour=3.0))
    step = p.weights_gib_per_gpu * GIB + 16 * (p.input_len + p.output_len / 2) * p.kv_bytes_per_token_per_gpu
    assert p.decode_batch == 16
    assert p.decode_tokens_per_s_bound == pytest.approx(16 * 3.35e12 / step, rel=0.01)
    assert p.cost_per_1m_output_tokens_usd == pytest.approx(3.0 / 3600 / p.decode_tokens_per_s_bound * 1e6, rel=0.01)


def test_fp8_halves_kv_and_beats_bf16_on_cost():
    fp8 = plan(resolve_spec(model="llama-8b", precision="fp8"))
    bf16 = plan(resolve_spec(model="llama-8b", precision="bf16"))
    assert fp8.kv_cache_tokens > 1.9 * bf16.kv_cache_tokens
    assert fp8.cost_per_1m_output_tokens_usd < bf16.cost_per_1m_output_tokens_usd


def test_h200_holds_more_kv_than_h100():
    h100 = plan(resolve_spec(model="llama-70b", precision="fp8"))
    h200 = plan(resolve_spec(model="llama-70b", precision="fp8", gpu="h200"))
    assert h200.kv_cache_tokens > 3 * h100.kv_cache_tokens


def test_draft_adds_weights_and_kv():
    base = plan(resolve_spec(model="llama-70b", precision="fp8", tp=4, max_batch_size=4))
    spec = plan(resolve_spec(model="llama-70b", precision="fp8", tp=4, max_batch_size=4, draft="llama-1b"))
    assert spec.draft_weights_gib_per_gpu > 0.3
    assert spec.kv_cache_tokens < base.kv_cache_tokens


def test_max_tokens_in_paged_kv_cache_caps_pool():
    p = plan(resolve_spec(model="llama-8b", precision="fp8", max_tokens_in_paged_kv_cache=10000))
    assert p.kv_cache_tokens == 10000


def test_lengths_beyond_the_engine_limits_are_rejected():
    spec = resolve_spec(model="tiny-llama", precision="bf16")  # max_input_len 256, max_seq_len 512
    with pytest.raises(SpecError, match=r"--input-len=300 must be within 1\.\.max_input_len=256"):
        plan(spec, input_len=300)
    with pytest.raises(SpecError, match=r"--output-len=400 must be within 1\.\.312 \(max_seq_len=512 - input 200\)"):
        plan(spec, input_len=200, output_len=400)
    assert plan(spec, input_len=256, output_len=256).output_len == 256
