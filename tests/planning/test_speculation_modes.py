"""The planner's speculation modes: each mode's acceptance, drafting cost, memory and load gate, and how `plan`,
`plan --compare` and `plan --slo` weigh none / draft-target / ngram."""

from __future__ import annotations

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPUS
from pipeline.core.spec import resolve_spec
from pipeline.planning import slo_search as ss
from pipeline.planning.break_even import speculation_break_even
from pipeline.planning.compare import compare_plans
from pipeline.planning.perf_model import CALIBRATION, EngineCost, expected_tokens_per_step
from pipeline.planning.planner import engine_shapes, format_capacity_plan, plan_capacity, serving_estimate
from pipeline.planning.speculation_modes import (
    MODES, NGRAM_PUBLISHED_DRAFT_LEN, NGRAM_PUBLISHED_LENGTH, acceptance_for_length, acceptances,
    without_speculation,
)
from pipeline.stages.check import resolve_checked_spec

H100 = GPUS["h100-sxm"]
LENGTHS = dict(input_len=1024, output_len=256, prefix_hit_ratio=0.0)


def _spec(**kw):
    return resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", tp=4, runtime="pytorch", **kw)


NGRAM = _spec(speculative_decoding="ngram")
DRAFT = _spec(draft="llama-1b")
PLAIN = _spec()


def _est(spec, batch, acceptance=None):
    return serving_estimate(spec, H100, tp=4, batch=batch, acceptance=acceptance, **LENGTHS)


@pytest.mark.parametrize(("length", "k"), [(1.0, 1), (1.37, 1), (1.37, 5), (1.66, 5), (2.5, 3), (4.73, 23),
                                           (9.0, 8)])
def test_accepted_length_and_rate_per_token_convert_both_ways(length, k):
    rate = acceptance_for_length(length, k)
    assert 0.0 <= rate <= 1.0 and expected_tokens_per_step(rate, k) == pytest.approx(length, abs=1e-6)


def test_ngram_default_is_the_published_accepted_length_and_is_overridable():
    ngram = MODES["ngram"]
    assert not ngram.draft_model and MODES["draft-target"].draft_model
    assert expected_tokens_per_step(ngram.acceptance, NGRAM_PUBLISHED_DRAFT_LEN) == pytest.approx(
        NGRAM_PUBLISHED_LENGTH, abs=1e-3)
    assert ngram.acceptance < MODES["draft-target"].acceptance
    assert plan_capacity(NGRAM).acceptance_rate == ngram.acceptance
    assert plan_capacity(NGRAM, acceptance=0.5).acceptance_rate == 0.5  # --acceptance is the spec's mode's
    # a given rate belongs to the spec's mode; without one, to draft-target (the others keep their defaults)
    eagle3 = MODES["eagle3"].acceptance
    assert acceptances(NGRAM, 0.5) == {"draft-target": MODES["draft-target"].acceptance, "ngram": 0.5,
                                       "eagle3": eagle3}
    assert acceptances(PLAIN, 0.5) == {"draft-target": 0.5, "ngram": ngram.acceptance, "eagle3": eagle3}
    assert _est(NGRAM, 1, 0.5)[0].output_tokens_per_s > _est(NGRAM, 1)[0].output_tokens_per_s
    with pytest.raises(SpecError):
        acceptance_for_length(7.0, 5)


def test_ngram_gains_at_low_load_and_equals_no_speculation_above_the_gate():
    gate = NGRAM.speculation.max_batch_for_speculation
    low, active = _est(NGRAM, 1)
    plain_low, _ = _est(PLAIN, 1)
    assert active and low.output_tokens_per_s > plain_low.output_tokens_per_s and low.tpot_ms < plain_low.tpot_ms
    high, active_high = _est(NGRAM, gate + 1)
    assert not active_high and high == _est(PLAIN, gate + 1)[0]
    at_gate, active_at_gate = _est(NGRAM, gate)
    assert active_at_gate and at_gate != _est(PLAIN, gate)[0]


def test_ngram_drafting_costs_no_model_only_the_targets_k_plus_one_verification():
    k = NGRAM.draft_len
    est, _ = _est(NGRAM, 1)
    target = EngineCost(NGRAM.model.architecture, "fp8", NGRAM.quantization.kv, 4, H100)
    verify = target.step_ms(CALIBRATION, context_tokens=0, context_len=0, decode_seqs=1,
                            decode_len=1024 + 256 / 2, tokens_per_seq=k + 1)
    assert est.decode_step_ms == pytest.approx(verify)
    assert est.decode_step_ms < _est(DRAFT, 1)[0].decode_step_ms  # draft-target adds the draft's K steps
    assert est.tokens_per_target_step == pytest.approx(expected_tokens_per_step(MODES["ngram"].acceptance, k))


def test_ngram_holds_no_draft_memory():
    target, draft = engine_shapes(NGRAM)
    assert draft is None and target.max_seq_len == NGRAM.max_seq_len + NGRAM.draft_len  # K drafts in the target KV
    p, d = plan_capacity(NGRAM), plan_capacity(DRAFT)
    assert p.draft_weights_gib_per_gpu == 0.0 and p.draft_tp is None and p.draft_kv_cache_tokens is None
    assert d.draft_weights_gib_per_gpu > 0 and p.kv_cache_tokens > d.kv_cache_tokens
    assert p.speculation_mode == "ngram" and d.speculation_mode == "draft-target" and PLAIN.speculation_mode is None


def test_plan_prints_the_modes_low_and_high_load_estimate():
    p = plan_capacity(NGRAM)
    low, high = p.speculation_loads or []
    assert (low["load"], low["batch"], high["load"], high["batch"]) == ("low", 1, "high", p.batch_ceiling)
    assert low["speculation_active"] and low["output_tokens_per_s"] > low["output_tokens_per_s_without"]
    assert low["cost_per_1m_output_tokens_usd"] < low["cost_per_1m_output_tokens_usd_without"]
    assert not high["speculation_active"] and high["output_tokens_per_s"] == high["output_tokens_per_s_without"]
    text = format_capacity_plan(p)
    assert f"ngram K={NGRAM.draft_len} @ batch 1 (low load, on)" in text
    assert f"@ batch {p.batch_ceiling} (high load, gated off" in text and "without speculation" in text
    assert plan_capacity(PLAIN).speculation_loads is None


def test_break_even_per_mode():
    ngram, draft = speculation_break_even(NGRAM), speculation_break_even(DRAFT)
    assert ngram is not None and draft is not None and ngram.pays_off
    assert ngram.acceptance < draft.acceptance  # no draft model's steps to pay back
    assert speculation_break_even(PLAIN) is None
    plain = without_speculation(NGRAM)
    assert plain.speculation_mode is None and plain.draft_len == 0


def test_compare_lists_the_modes_the_runtime_allows():
    c = compare_plans(NGRAM, precisions=("fp8",))
    modes = {(r.tp, r.mode) for r in c.rows}
    assert {(4, None), (4, "draft-target"), (4, "ngram")} <= modes
    row = {r.mode: r for r in c.rows if r.tp == 4}
    assert row["draft-target"].draft == "llama-1b" and row["ngram"].draft is None
    assert row["ngram"].tokens_per_target_step == pytest.approx(
        expected_tokens_per_step(MODES["ngram"].acceptance, NGRAM.draft_len), rel=1e-3)
    assert row["ngram"].low_load_tokens_per_s > row[None].low_load_tokens_per_s
    assert c.acceptances == {"draft-target": MODES["draft-target"].acceptance, "ngram": MODES["ngram"].acceptance,
                             "eagle3": MODES["eagle3"].acceptance}
    engine = compare_plans(resolve_spec(model="llama-70b", precision="fp8", tp=4), precisions=("fp8",))
    assert {r.mode for r in engine.rows} == {None, "draft-target"}
    assert any(s.startswith("ngram: ") and "PyTorch backend only" in s for s in engine.skipped)


def test_an_ngram_spec_on_the_engine_runtime_is_refused():
    with pytest.raises(SpecError, match="PyTorch backend only"):
        resolve_spec(model="llama-70b", precision="fp8", tp=4, speculative_decoding="ngram")


def test_slo_search_picks_ngram_and_says_why():
    """A TPOT no plain step meets at batch 1 (9.7 ms), a useless draft (acceptance 0) cannot, n-gram can."""
    spec = resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", tp=4, pp=1, runtime="pytorch")
    r = ss.search(spec, ss.Slo(ttft_ms=1000, tpot_ms=9), ss.Traffic(1024, 256, acceptance=0.0),
                  check=resolve_checked_spec)
    assert r.pick is not None and r.pick.mode == "ngram" and r.pick.draft is None and r.pick.speculation_active
    assert r.pick.max_batch <= spec.speculation.max_batch_for_speculation
    assert r.speculation_note.startswith("speculation: ngram")
    assert "no speculation: none of" in r.speculation_note and "draft-target: none of" in r.speculation_note
    assert r.speculation_note in ss.format_search(r)
    target = ss.serving_target(r)
    assert target.traffic.acceptance == MODES["ngram"].acceptance  # the pick's mode's rate is recorded
    checked = resolve_checked_spec(**ss.layout_overrides(spec, r.pick.structure(), batch=r.pick.max_batch))
    assert checked.speculation_mode == "ngram" and checked.draft_len == r.pick.draft_len


def test_slo_search_leaves_ngram_out_on_the_engine_runtime_and_says_so():
    spec = resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", tp=4, pp=1, runtime="engine")
    space = ss.search_space(spec)
    assert {m for m, _, _ in space.modes} == {None, "draft-target"}
    assert "PyTorch backend only" in space.unsearched["ngram"]
    r = ss.search(spec, ss.Slo(ttft_ms=1000, tpot_ms=40), ss.Traffic(1024, 256), check=resolve_checked_spec)
    assert r.pick is not None and r.pick.mode != "ngram" and "ngram not searched" in r.speculation_note


def test_a_bench_report_of_an_ngram_build_feeds_ngram_at_the_perf_models_rate(tmp_path, capsys):
    """bench's acceptance_rate is accepted over drafted tokens (mean accepted length 1 + K x rate); the planner
    chains a rate per drafted token: the report's length at its K is what the search assumes."""
    import json

    from pipeline.cli.commands import plan_command

    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"model": "llama-70b", "precision": "fp8", "acceptance_rate": 0.1,
                                  "speculation_mode": "ngram", "draft_len": 5}))
    terms = ss.read_bench_terms(report, model="llama-70b", precision="fp8")
    assert terms["mode"] == "ngram"
    assert expected_tokens_per_step(terms["acceptance"], 5) == pytest.approx(1 + 5 * 0.1, abs=1e-3)
    spec = resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", tp=4, pp=1, runtime="pytorch")
    plan_command(spec, slo=True, ttft_ms="1000", tpot_ms="40", bench_report=str(report), json_=True)
    traffic = json.loads(capsys.readouterr().out)["traffic"]
    assert (traffic["measured_mode"], traffic["acceptance"]) == ("ngram", terms["acceptance"])
    report.write_text(json.dumps({"model": "llama-70b", "precision": "fp8", "speculation_mode": "medusa"}))
    with pytest.raises(SpecError, match="speculation_mode='medusa' is none of draft-target, ngram"):
        ss.read_bench_terms(report, model="llama-70b", precision="fp8")
