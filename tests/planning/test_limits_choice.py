"""Engine limits the user left unset are chosen by the memory model (pipeline.planning.limits_choice), with reasons."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.core.spec import ParallelSpec, resolve_spec
from pipeline.planning.limits_choice import UPSTREAM_MAX_BATCH, choose_limits, limits_record
from pipeline.planning.compare import compare_plans
from pipeline.planning.planner import plan_capacity

ROOT = Path(__file__).resolve().parents[2]


def test_70b_fp8_tp4_gets_the_batch_its_kv_pool_holds():
    spec = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=4))
    assert 64 < spec.max_batch_size <= UPSTREAM_MAX_BATCH
    assert spec.max_batch_size % 8 == 0
    plan = plan_capacity(spec)
    assert plan.fits and plan.max_concurrent_requests >= spec.max_batch_size  # the chosen engine holds its batch
    assert "KV pool on 4 x h100-sxm at tp=4" in spec.limit_reasons["max_batch_size"]
    assert spec.limit_reasons.keys() == {"max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"}


def test_a_small_model_is_capped_at_upstreams_default():
    spec = choose_limits(resolve_spec(model="llama-1b", precision="fp8", gpu="h200"))
    assert spec.max_batch_size == UPSTREAM_MAX_BATCH
    assert spec.limit_reasons["max_batch_size"].startswith("upstream's default 2048")


def test_given_values_are_kept():
    spec = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=4, max_batch_size=64, max_seq_len=4096))
    assert spec.max_batch_size == 64 and spec.max_seq_len == 4096
    assert "max_batch_size" not in spec.limit_reasons and "max_seq_len" not in spec.limit_reasons
    assert limits_record(spec)["max_batch_size"] == {"value": 64, "reason": "given"}


def test_a_model_that_does_not_fit_keeps_the_registry_value_and_says_why():
    spec = choose_limits(resolve_spec(model="llama-70b", precision="bf16", tp=1))
    assert spec.max_batch_size == spec.model.limits.max_batch_size
    assert "no request fits on 1 x h100-sxm" in spec.limit_reasons["max_batch_size"]


def test_reference_target_keeps_the_registry_batch():
    spec = resolve_spec(model="tiny-llama", target="reference")
    chosen = choose_limits(spec)
    assert chosen.max_batch_size == spec.model.limits.max_batch_size
    assert chosen.identity() == spec.identity()  # a reference build's keys do not move
    assert "reference target" in chosen.limit_reasons["max_batch_size"]


def test_a_chosen_batch_is_chosen_again_for_another_tp():
    tp4 = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=4))
    tp2 = choose_limits(tp4.model_copy(update={"parallelism": ParallelSpec(tp=2)}))
    assert tp2.max_batch_size < tp4.max_batch_size
    assert "at tp=2" in tp2.limit_reasons["max_batch_size"]


def test_compare_chooses_the_batch_per_row():
    spec = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=4, gpu_count=4))
    rows = {(r.precision, r.tp): r for r in compare_plans(spec, precisions=("fp8",)).rows if r.draft is None}
    assert rows[("fp8", 2)].decode_batch != rows[("fp8", 4)].decode_batch


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_plan_json_and_check_show_the_chosen_values_and_why():
    r = _invoke("plan", "--model", "llama-70b", "--precision", "fp8", "--tp", "4", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    batch = data["limits"]["max_batch_size"]
    assert batch["value"] == data["max_batch_size"] > 64 and "KV pool" in batch["reason"]
    assert data["limits"]["max_num_tokens"]["value"] == 8192
    r = _invoke("check", "--model", "llama-70b", "--precision", "fp8", "--tp", "4", "--skip-host-check")
    assert r.returncode == 0, r.stderr
    assert f"batch={batch['value']}" in r.stdout
    assert f"limits: max_batch_size={batch['value']:,} (the KV pool" in r.stderr


def test_with_a_draft_a_chosen_batch_explains_speculation_instead_of_warning():
    chosen = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b"))
    assert chosen.max_batch_size > 8
    assert "speculation runs up to batch 8" in chosen.limit_reasons["max_batch_size"]
    assert not any("speculation with max_batch_size" in w for w in chosen.warnings)
    given = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", max_batch_size=64))
    assert any("speculation with max_batch_size=64" in w for w in given.warnings)
