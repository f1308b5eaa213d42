"""The planner's EAGLE-3 mode: chain acceptance from published figures, the head's drafting cost and memory inside
the target, its estimate for a target without a registered head, and how `plan`, `plan --compare` and `plan --slo`
weigh it beside none / draft-target / ngram."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPUS
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from pipeline.planning import slo_search as ss
from pipeline.planning.break_even import break_even_batch, speculation_break_even
from pipeline.planning.compare import compare_plans, format_comparison
from pipeline.planning.limits_choice import choose_limits
from pipeline.planning.perf_model import CALIBRATION, EngineCost, expected_tokens_per_step, kv_bytes_per_token
from pipeline.planning.planner import engine_shapes, format_capacity_plan, plan_capacity, serving_estimate
from pipeline.planning.speculation_modes import (
    EAGLE3_PUBLISHED_DRAFT_LEN, EAGLE3_PUBLISHED_LENGTH, MAVERICK_CHAIN_LENGTHS, MODES, acceptance_for_length,
    eagle3_head, estimated_head, registered_head,
)
from pipeline.stages.check import resolve_checked_spec

H100 = GPUS["h100-sxm"]
LENGTHS = dict(input_len=1024, output_len=256, prefix_hit_ratio=0.0)


def _spec(model="llama3.3-70b", **kw):
    return resolve_spec(model=model, precision="fp8", gpu="h100-sxm", tp=4, runtime="pytorch", **kw)


EAGLE = _spec(draft="auto", speculative_decoding="eagle3")
NGRAM = _spec(speculative_decoding="ngram")
PLAIN = _spec()


def _est(spec, batch, acceptance=None):
    return serving_estimate(spec, H100, tp=4, batch=batch, acceptance=acceptance, **LENGTHS)


def test_eagle3_default_is_the_published_chain_length():
    eagle3 = MODES["eagle3"]
    assert eagle3.head and not eagle3.draft_model
    assert expected_tokens_per_step(eagle3.acceptance, EAGLE3_PUBLISHED_DRAFT_LEN) == pytest.approx(
        EAGLE3_PUBLISHED_LENGTH, abs=1e-3)
    assert MODES["ngram"].acceptance < eagle3.acceptance < MODES["draft-target"].acceptance


@pytest.mark.parametrize("task", sorted(MAVERICK_CHAIN_LENGTHS))
def test_a_rate_fitted_at_k7_follows_a_published_chain_curve_at_every_k(task):
    """The geometric chain the planner assumes, fitted at K=7, stays within 8 % of the Maverick head's measured
    accepted length at each K = 1..7 and never above it by more than 1 %: fitting at K=7 does not flatter K=3."""
    lengths = MAVERICK_CHAIN_LENGTHS[task]
    rate = acceptance_for_length(lengths[-1], len(lengths))
    for k, published in enumerate(lengths, start=1):
        ratio = expected_tokens_per_step(rate, k) / published
        assert 0.92 < ratio < 1.01, (k, ratio)


def test_a_registered_heads_weights_match_its_published_checkpoint():
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B ships an 850 MB fp16 pytorch_model.bin: fc 3H x H, one layer with 2H
    attention input, a 32000-token lm_head (its embeddings are the target's)."""
    head = registered_head(get_model("llama-8b-eagle3"))
    assert (head.name, head.target, head.draft_vocab_size, head.captured) == ("llama-8b-eagle3", "llama-8b", 32000, 3)
    assert head.weight_bytes_per_gpu(tp=1, gpu=H100) == pytest.approx(850e6, rel=0.01)
    # TP splits the layer and lm_head, never the fc (built without a mapping)
    fc = 3 * 4096 ** 2 * 2
    assert head.weight_bytes_per_gpu(tp=4, gpu=H100) == pytest.approx((850e6 - fc) / 4 + fc, rel=0.01)
    with pytest.raises(SpecError, match="no EAGLE-3 head"):
        registered_head(get_model("llama-8b"))


def test_a_target_without_a_registered_head_gets_the_recipe_at_its_width():
    head = estimated_head(get_model("llama-70b"))
    assert head.name is None and "estimate" in head.label and "llama-70b" in head.label
    assert (head.arch.num_layers, head.arch.hidden_size, head.draft_vocab_size) == (1, 8192, 32000)
    registered = registered_head(get_model("llama3.3-70b-eagle3"))  # the same recipe, registered
    assert head.weight_bytes_per_gpu(tp=4, gpu=H100) == pytest.approx(
        registered.weight_bytes_per_gpu(tp=4, gpu=H100), rel=1e-6)
    assert eagle3_head(EAGLE) == registered and eagle3_head(NGRAM) is None


def test_the_head_lives_in_the_targets_memory_one_kv_layer_at_the_targets_kv_dtype():
    target, draft = engine_shapes(EAGLE)
    assert draft is None  # no draft engine, no pool of its own
    plain, _ = engine_shapes(PLAIN)
    arch = EAGLE.model.architecture
    assert target.head_kv_bytes_per_token == kv_bytes_per_token(arch, EAGLE.quantization.kv, tp=4) / arch.num_layers
    assert target.kv_per_token_per_gpu() == pytest.approx(plain.kv_per_token_per_gpu() * (1 + 1 / arch.num_layers))
    assert target.weights_per_gpu() == pytest.approx(plain.weights_per_gpu() + target.head_weight_bytes)
    p, n = plan_capacity(EAGLE), plan_capacity(NGRAM)
    assert p.kv_cache_tokens < n.kv_cache_tokens and p.draft_weights_gib_per_gpu == 0.0 and p.draft_tp is None
    assert p.eagle3_head is not None and p.eagle3_head["name"] == "llama3.3-70b-eagle3"
    assert not p.eagle3_head["estimate"] and "eagle3_head" not in n.as_dict()
    text = format_capacity_plan(p)
    assert "EAGLE-3 head (llama3.3-70b-eagle3)" in text and "one layer in its pool" in text


def test_eagle3_drafting_costs_the_heads_chain_beside_the_targets_verification():
    k = EAGLE.draft_len
    assert k == get_model("llama3.3-70b-eagle3").default_draft_len
    est, active = _est(EAGLE, 1)
    target = EngineCost(EAGLE.model.architecture, "fp8", EAGLE.quantization.kv, 4, H100)
    step = dict(context_tokens=0, context_len=0, decode_seqs=1, decode_len=1024 + 256 / 2)
    verify = target.step_ms(CALIBRATION, tokens_per_seq=k + 1, **step)
    head = eagle3_head(EAGLE).cost(kv=EAGLE.quantization.kv, tp=4, gpu=H100)
    drafting = head.drafting_ms(CALIBRATION, draft_len=k, decode_seqs=1, decode_len=1024 + 256 / 2)
    assert active and est.decode_step_ms == pytest.approx(verify + drafting)
    later = drafting - head.step_ms(CALIBRATION, tokens_per_seq=k + 1, **step)
    assert 0 < later / (k - 1) < drafting - later  # the first step (fc over K + 1 positions) costs the most
    one_b = EngineCost(get_model("llama-1b").architecture, "fp8", "fp8", 1, H100)
    assert drafting < k * one_b.step_ms(CALIBRATION, **step)  # one layer, not a 16-layer draft model
    assert est.tokens_per_target_step == pytest.approx(expected_tokens_per_step(MODES["eagle3"].acceptance, k))
    assert est.output_tokens_per_s > _est(PLAIN, 1)[0].output_tokens_per_s


def test_eagle3_gains_at_low_load_and_is_gated_off_above_its_gate():
    gate = EAGLE.speculation.max_batch_for_speculation
    p = plan_capacity(EAGLE)
    low, high = p.speculation_loads or []
    assert low["speculation_active"] and low["cost_per_1m_output_tokens_usd"] < low["cost_per_1m_output_tokens_usd_without"]
    assert not high["speculation_active"] and high["output_tokens_per_s"] == high["output_tokens_per_s_without"]
    assert _est(EAGLE, gate + 1)[1] is False
    assert f"eagle3 K={EAGLE.draft_len} @ batch 1 (low load, on)" in format_capacity_plan(p)
    chosen = choose_limits(EAGLE).limit_reasons["max_batch_size"]
    assert f"eagle3 speculation runs up to batch {gate}, plain decoding above it" in chosen
    engine = resolve_spec(model="llama-70b", precision="fp8", gpu="h100-sxm", tp=4, draft="auto")
    assert "draft-target speculation runs up to batch 8, heavier traffic through the plain ensemble" in \
        choose_limits(engine).limit_reasons["max_batch_size"]


def test_break_even_acceptance_and_batch_per_mode():
    eagle, ngram = speculation_break_even(EAGLE, batch=1), speculation_break_even(NGRAM, batch=1)
    draft = speculation_break_even(_spec(draft="llama-1b"), batch=1)
    assert eagle is not None and ngram is not None and draft is not None
    assert ngram.acceptance < eagle.acceptance < draft.acceptance  # nothing < one layer < a 16-layer model

    def pays_up_to(acceptance):
        return break_even_batch(EAGLE, acceptance=acceptance, ceiling=512, input_len=1024, output_len=256)

    assert pays_up_to(0.0) == 0 and pays_up_to(0.4) <= pays_up_to(0.65) <= pays_up_to(0.9)
    assert pays_up_to(0.9) > EAGLE.speculation.max_batch_for_speculation  # the gate, not the model, turns it off


def test_compare_lists_four_modes_with_the_estimate_labelled():
    """`plan --model llama-70b --compare` (runtime engine): the grid keeps the engine's modes, the side-by-side
    lists all four, ngram and eagle3 on pytorch, eagle3 with the estimated head (no Llama-3.1-70B head)."""
    c = compare_plans(resolve_spec(model="llama-70b", precision="fp8", tp=4), precisions=("fp8",))
    assert {r.mode for r in c.rows} == {None, "draft-target"}
    assert any(s.startswith("eagle3: ") and "PyTorch backend only" in s for s in c.skipped)
    by = {m.mode: m for m in c.modes or []}
    assert list(by) == [None, "draft-target", "ngram", "eagle3"]
    assert (by["eagle3"].runtime, by["ngram"].runtime, by["draft-target"].runtime) == ("pytorch", "pytorch", "engine")
    assert by["eagle3"].estimate and by["eagle3"].drafter == "estimated head" and by["eagle3"].draft_len == 3
    for m in by.values():
        assert m.low_batch == 1 and m.low_cost_per_1m_usd and m.high_cost_per_1m_usd and m.high_batch > 1
    assert by["eagle3"].low_cost_per_1m_usd < by[None].low_cost_per_1m_usd
    text = format_comparison(c)
    assert "speculation modes side by side at fp8 tp=4" in text
    assert "eagle3's estimated head: no registered EAGLE-3 head for llama-70b" in text
    pt = compare_plans(_spec(model="llama-70b"), precisions=("fp8",))
    row = {r.mode: r for r in pt.rows if r.tp == 4}
    assert row["eagle3"].draft is None and row["eagle3"].low_load_tokens_per_s > row[None].low_load_tokens_per_s


def test_compare_uses_the_registered_head_of_a_target_that_has_one():
    c = compare_plans(_spec(), precisions=("fp8",))
    row = {r.mode: r for r in c.rows if r.tp == 4}
    assert row["eagle3"].draft == "llama3.3-70b-eagle3"
    by = {m.mode: m for m in c.modes or []}
    assert not by["eagle3"].estimate and by["eagle3"].drafter == "llama3.3-70b-eagle3"
    assert "eagle3 llama3.3-70b-eagle3" in format_comparison(c)


def test_slo_search_picks_a_registered_eagle3_head_and_writes_a_spec_check_accepts(tmp_path):
    from pipeline.ops.plan import write_pick

    spec = resolve_spec(model="llama3.3-70b", gpu="h100-sxm", runtime="pytorch")
    r = ss.search(spec, ss.Slo(ttft_ms=1000, tpot_ms=9), ss.Traffic(1024, 256), check=resolve_checked_spec)
    assert r.pick is not None and r.pick.mode == "eagle3" and r.pick.draft == "llama3.3-70b-eagle3"
    assert r.speculation_note.startswith("speculation: eagle3") and "ngram at best" in r.speculation_note
    assert f"eagle3 llama3.3-70b-eagle3 K={r.pick.draft_len}" in ss.format_search(r)
    path = write_pick(spec, r, str(tmp_path / "pick.yaml"))
    written = resolve_checked_spec(spec_file=path)
    assert written.speculation_mode == "eagle3" and written.draft_model.name == "llama3.3-70b-eagle3"
    assert written.serving_target.traffic.acceptance == MODES["eagle3"].acceptance


def test_slo_search_leaves_eagle3_out_without_a_head_or_off_pytorch_and_says_so():
    no_head = ss.search_space(resolve_spec(model="llama-70b", gpu="h100-sxm", runtime="pytorch"))
    assert "eagle3" not in {m for m, _, _ in no_head.modes}
    assert "no EAGLE-3 head in the registry is trained for llama-70b" in no_head.unsearched["eagle3"]
    engine = ss.search_space(resolve_spec(model="llama3.3-70b", gpu="h100-sxm", runtime="engine"))
    assert "PyTorch backend only" in engine.unsearched["eagle3"]
    r = ss.search(resolve_spec(model="llama-70b", gpu="h100-sxm", runtime="pytorch", precision="fp8", tp=4),
                  ss.Slo(ttft_ms=1000, tpot_ms=40), ss.Traffic(1024, 256), check=resolve_checked_spec)
    assert "eagle3 not searched (no EAGLE-3 head" in r.speculation_note


def test_a_bench_report_feeds_eagle3_and_must_match_a_fixed_mode(tmp_path, capsys):
    from pipeline.cli.commands import plan_command

    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"model": "llama3.3-70b", "precision": "fp8", "acceptance_rate": 0.5,
                                  "speculation_mode": "eagle3", "draft_len": 3}))
    terms = ss.read_bench_terms(report, model="llama3.3-70b", precision="fp8")
    assert terms["mode"] == "eagle3"
    assert expected_tokens_per_step(terms["acceptance"], 3) == pytest.approx(1 + 3 * 0.5, abs=1e-3)
    plan_command(EAGLE, slo=True, ttft_ms="1000", tpot_ms="40", bench_report=str(report), json_=True)
    out = json.loads(capsys.readouterr().out)
    assert (out["traffic"]["measured_mode"], out["traffic"]["acceptance"]) == ("eagle3", terms["acceptance"])
    assert out["pick"]["mode"] == "eagle3"  # the spec fixes the mode
    with pytest.raises(SpecError, match="measured eagle3 speculation, but the spec fixes ngram"):
        plan_command(NGRAM, slo=True, ttft_ms="1000", tpot_ms="40", bench_report=str(report))
