"""The operating point `plan` estimates at, and the TP chosen by cost when the user leaves it unset."""

from __future__ import annotations

import json

import pytest

from pipeline.cli.commands import check_command, plan_command
from pipeline.core.spec import resolve_spec
from pipeline.planning.placement_choice import placement_given
from pipeline.planning.compare import compare_plans
from pipeline.planning.planner import DEFAULT_TPOT_TARGET_MS, plan_capacity
from pipeline.stages.check import resolve_checked_spec


def test_the_estimate_is_at_the_cheapest_batch_within_the_tpot_target_not_at_the_ceiling():
    spec = resolve_checked_spec(model="llama-70b", precision="fp8", tp=4)
    p = plan_capacity(spec)
    assert p.batch_ceiling == min(spec.max_batch_size, p.max_concurrent_requests) > 512
    assert p.decode_batch < p.batch_ceiling and p.tpot_ms_estimate <= DEFAULT_TPOT_TARGET_MS
    assert f"batch {p.decode_batch}" in p.operating_point and "TPOT <= 50 ms" in p.operating_point
    at_ceiling = plan_capacity(spec, tpot_target_ms=None)
    assert at_ceiling.decode_batch == p.batch_ceiling and "ceiling" in at_ceiling.operating_point
    # the ceiling is never cheaper per token than the operating point's batch, and misses the target
    assert at_ceiling.output_tokens_per_s_estimate >= p.output_tokens_per_s_estimate
    assert at_ceiling.tpot_ms_estimate > DEFAULT_TPOT_TARGET_MS
    tighter = plan_capacity(spec, tpot_target_ms=25.0)
    assert tighter.decode_batch < p.decode_batch and tighter.tpot_ms_estimate <= 25.0


def test_an_unreachable_target_falls_back_to_the_ceiling_and_says_so():
    spec = resolve_checked_spec(model="llama-70b", precision="fp8", tp=4)
    p = plan_capacity(spec, tpot_target_ms=1.0)
    assert p.decode_batch == p.batch_ceiling and "no batch keeps TPOT <= 1 ms" in p.operating_point


def test_without_tp_a_70b_lands_on_the_cheapest_placement_not_one_gpu(capsys):
    spec = resolve_checked_spec(model="llama-70b", precision="fp8")
    assert spec.parallelism.tp >= 2
    assert spec.placement_reason.startswith(f"tp={spec.parallelism.tp}: the cheapest placement on h100-sxm")
    assert "runner-up tp=" in spec.placement_reason
    chosen = plan_capacity(spec)
    for tp in (1, 2, 4, 8):  # the pick costs no more than any other TP that meets the target
        other = plan_capacity(resolve_checked_spec(model="llama-70b", precision="fp8", tp=tp))
        if other.fits and other.tpot_ms_estimate <= DEFAULT_TPOT_TARGET_MS:
            assert chosen.cost_per_1m_output_tokens_usd <= other.cost_per_1m_output_tokens_usd
    check_command(spec, skip_host_check=True)
    assert f"placement: tp={spec.parallelism.tp}: the cheapest" in capsys.readouterr().err
    plan_command(spec, json_=True)
    data = json.loads(capsys.readouterr().out)
    assert data["tp"] == spec.parallelism.tp and data["placement"] == spec.placement_reason
    assert data["decode_batch"] <= data["batch_ceiling"] and data["operating_point"]


def test_a_given_tp_wins_and_reference_targets_are_not_placed():
    spec = resolve_checked_spec(model="llama-70b", precision="fp8", tp=1)
    assert spec.parallelism.tp == 1 and spec.placement_reason is None
    assert placement_given(resolve_spec(model="llama-70b", precision="fp8", pp=2))
    assert placement_given(resolve_spec(model="tiny-llama", precision="fp8", target="reference"))
    assert not placement_given(resolve_spec(model="llama-70b", precision="fp8"))


def test_a_spec_file_tp_wins(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: llama-70b\nquantization: {precision: fp8}\nparallelism: {tp: 8}\n")
    spec = resolve_checked_spec(spec_file=str(path))
    assert spec.parallelism.tp == 8 and spec.placement_reason is None


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_compare_never_shows_more_gpus_with_less_throughput(precision):
    c = compare_plans(resolve_checked_spec(model="llama-70b", precision=precision, tp=2))
    rows = [r for r in c.rows if r.precision == precision and r.draft is None and r.fits]
    assert len(rows) >= 2
    for small, large in zip(rows, rows[1:]):
        assert large.gpus > small.gpus
        assert large.output_tokens_per_s_estimate >= small.output_tokens_per_s_estimate


def test_plan_slo_searches_every_tp_when_the_tp_was_only_chosen_by_cost():
    from pipeline.planning.slo_search import search_space

    placed = resolve_checked_spec(model="llama-70b", precision="fp8")
    assert placed.placement_reason and search_space(placed).tps == (1, 2, 4, 8)
    assert search_space(resolve_checked_spec(model="llama-70b", precision="fp8", tp=4)).tps == (4,)
