"""`plan --slo`: the cheapest configuration meeting an SLO, its Pareto front, why the others lose, the spec it
writes (loaded back through the real spec loader and `check`'s rules)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from pipeline.cli.commands import plan_command
from pipeline.cli.flags import spec_from_flags
from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPUS
from pipeline.planning import slo_search as ss
from pipeline.planning.planner import fit_shortfall, engine_shapes
from pipeline.stages.check import resolve_checked_spec

DONE_WHEN = ss.Slo(ttft_ms=500, tpot_ms=40)
TRAFFIC = ss.Traffic(input_len=2048, output_len=512)


def _spec(**flags):
    return spec_from_flags({"model": "llama-70b", "gpu": "h100-sxm", **flags})


@pytest.fixture(scope="module")
def done_when():
    return ss.search(_spec(), DONE_WHEN, TRAFFIC, check=resolve_checked_spec)


def test_pick_meets_the_slo_and_is_the_cheapest_that_does(done_when):
    r = done_when
    p = r.pick
    assert p is not None and p.ttft_ms <= 500 and p.tpot_ms <= 40
    cheaper = [c for c in r.front if c.cost_per_1m_output_tokens_usd < p.cost_per_1m_output_tokens_usd]
    assert all(c.ttft_ms > 500 or c.tpot_ms > 40 for c in cheaper)  # the front's cheaper points miss the SLO
    assert set(r.losses) <= set(ss.LOSSES) and r.losses["does not fit"].count > 0
    assert r.losses["costs more"].count > 0 and "per 1M" in r.losses["costs more"].example
    assert r.searched == sum(loss.count for loss in r.losses.values()) + 1  # the pick, or lost for one reason
    # the pick passes check's whole rule set, and its memory fits at its batch
    spec = resolve_checked_spec(**ss.layout_overrides(_spec(), p.structure(), batch=p.max_batch))
    assert spec.max_batch_size == p.max_batch and spec.quantization.precision == p.precision
    assert fit_shortfall(spec, *engine_shapes(spec), GPUS["h100-sxm"]) <= 0


def test_front_is_pareto_and_holds_the_pick(done_when):
    front = done_when.front
    assert done_when.pick in front and len(front) >= 2
    for a in front:
        assert not any(b.tokens_per_s_per_gpu >= a.tokens_per_s_per_gpu and b.tpot_ms < a.tpot_ms
                       for b in front if b is not a)
    assert [c.tpot_ms for c in front] == sorted(c.tpot_ms for c in front)


def test_does_not_fit_is_pruned_by_memory_first():
    """bf16 70B at tp=1 (131 GiB of weights) does not fit one H100 at any batch: one count per batch, none
    evaluated."""
    r = ss.search(_spec(precision="bf16", tp=1, pp=1), DONE_WHEN, TRAFFIC, check=resolve_checked_spec)
    assert r.pick is None and r.front == []
    gated = [b for b in ss.BATCHES if b <= 8]
    assert r.losses["does not fit"].count == len(ss.BATCHES) + len(ss.DRAFT_LENS) * len(gated) == r.searched
    assert "exceed a h100-sxm" in r.losses["does not fit"].example


def test_speculation_pays_only_below_its_load_gate():
    """A tight TPOT at high acceptance takes a draft; at acceptance 0 no draft pays."""
    tight = ss.Slo(ttft_ms=1000, tpot_ms=12)
    spec = _spec(precision="fp8", tp=4)
    fast = ss.search(spec, tight, ss.Traffic(1024, 256, acceptance=0.9), check=resolve_checked_spec)
    assert fast.pick is not None and fast.pick.draft == "llama-1b" and fast.pick.speculation_active
    assert fast.pick.max_batch <= spec.speculation.max_batch_for_speculation
    slow = ss.search(spec, ss.Slo(1000, 40), ss.Traffic(1024, 256, acceptance=0.0), check=resolve_checked_spec)
    assert slow.pick is not None and slow.pick.draft is None


def test_prefix_reuse_saves_prefill():
    cold = ss.search(_spec(precision="fp8", tp=2), DONE_WHEN, TRAFFIC, check=resolve_checked_spec, speculation=False)
    warm = ss.search(_spec(precision="fp8", tp=2), DONE_WHEN, ss.Traffic(2048, 512, prefix_share=0.75),
                     check=resolve_checked_spec, speculation=False)
    assert warm.pick.cost_per_1m_output_tokens_usd < cold.pick.cost_per_1m_output_tokens_usd
    same = [c for c in warm.front if c.max_batch == 1]
    assert same and same[0].ttft_ms < [c for c in cold.front if c.max_batch == 1][0].ttft_ms


def test_a_rate_provisions_replicas_and_prices_them():
    r = ss.search(_spec(precision="fp8", tp=4), DONE_WHEN, ss.Traffic(2048, 512, rate=50.0),
                  check=resolve_checked_spec, speculation=False)
    p = r.pick
    assert p.replicas * p.tokens_per_s >= 50 * 512 > (p.replicas - 1) * p.tokens_per_s
    assert p.cost_per_1m_output_tokens_usd == pytest.approx(
        p.replicas * p.gpus * 3.0 / 3600 / (50 * 512) * 1e6, abs=1e-4)


def test_what_the_user_set_stays_fixed():
    r = ss.search(_spec(precision="fp8", tp=2, runtime="engine"), DONE_WHEN, TRAFFIC, check=resolve_checked_spec)
    assert {(c.precision, c.tp, c.runtime) for c in r.front} == {("fp8", 2, "engine")}


def test_no_slo_met_exits_2_naming_the_nearest_miss(capsys):
    with pytest.raises(SpecError, match=r"no configuration .* meets TTFT <= 50 ms and TPOT <= 1 ms; nearest miss: "
                                        r".*TTFT \d+ ms, TPOT [\d.]+ ms"):
        plan_command(_spec(), slo=True, ttft_ms="50", tpot_ms="1", input_len="2048", output_len="512")
    assert SpecError.exit_code == 2 and capsys.readouterr().out == ""


def test_write_spec_loads_back_through_the_spec_loader_and_check(tmp_path, capsys):
    out = tmp_path / "best.yaml"
    plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", input_len="2048", output_len="512",
                 write_spec=str(out), json_=True, serving_mode="agg")  # the aggregated pick (disagg: test_disagg.py)
    data = json.loads(capsys.readouterr().out)
    pick = data["pick"]
    assert data["spec_file"] == str(out)
    doc = yaml.safe_load(out.read_text())
    assert doc["model"] == "llama-70b" and doc["limits"]["max_batch_size"] == pick["max_batch"]
    spec = resolve_checked_spec(spec_file=out)  # `check --spec` and `build --spec` resolve exactly this
    assert (spec.quantization.precision, spec.parallelism.tp, spec.parallelism.pp, spec.max_batch_size,
            spec.runtime) == (pick["precision"], pick["tp"], pick["pp"], pick["max_batch"], pick["runtime"])
    assert (spec.draft_model.name if spec.draft_model else None) == pick["draft"]
    assert [p.name for p in tmp_path.iterdir()] == ["best.yaml"]  # no temporary left


def test_write_spec_refuses_a_bad_path_and_writes_nothing(tmp_path):
    with pytest.raises(SpecError, match="does not exist; create it first"):
        plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", write_spec=str(tmp_path / "no" / "x.yaml"))
    with pytest.raises(SpecError, match="expected a .yaml file path"):
        plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", write_spec=str(tmp_path / "x.txt"))
    assert list(tmp_path.iterdir()) == []


LLAMA_FP8 = {"model": "llama-70b", "precision": "fp8"}  # what `invoke bench --json` names at its top level


def test_bench_report_feeds_acceptance_and_prefix_share(tmp_path, capsys):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({**LLAMA_FP8, "acceptance_rate": 0.55, "prefix_cache_hit_ratio": 0.62,
                                  "ttft_ms_p99": 80.0, "levels": [], "something_new": {"x": 1}}))
    assert ss.read_bench_terms(report, model="llama-70b", precision="fp8") == {"acceptance": 0.55,
                                                                                "prefix_share": 0.62}
    plan_command(_spec(precision="fp8", tp=4), slo=True, ttft_ms="500", tpot_ms="40", bench_report=str(report),
                 json_=True)
    traffic = json.loads(capsys.readouterr().out)["traffic"]
    assert (traffic["acceptance"], traffic["prefix_share"]) == (0.55, 0.62)
    plan_command(_spec(precision="fp8", tp=4), slo=True, ttft_ms="500", tpot_ms="40", bench_report=str(report),
                 acceptance="0.8", json_=True)  # a flag wins over the report
    assert json.loads(capsys.readouterr().out)["traffic"]["acceptance"] == 0.8


@pytest.mark.parametrize("named, needle", [
    ({"model": "llama-8b", "precision": "fp8"}, "measured model llama-8b precision fp8, not llama-70b fp8"),
    ({"model": "llama-70b", "precision": "int4_awq"}, "measured model llama-70b precision int4_awq, not llama-70b fp8"),
    ({"model": "ensemble"}, "measured model ensemble precision unknown"),  # a report from before it named the build
    ({}, "measured model unknown precision unknown"),
    ({"model": "llama-70b", "precision": None}, "precision unknown, not llama-70b fp8"),
])
def test_a_bench_report_of_another_build_exits_2_naming_both(tmp_path, capsys, named, needle):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({**named, "acceptance_rate": 0.2}))
    with pytest.raises(SpecError, match=re.escape(needle) + ".*--accept-foreign-bench-report"):
        plan_command(_spec(precision="fp8", tp=4), slo=True, ttft_ms="500", tpot_ms="40", bench_report=str(report))
    assert SpecError.exit_code == 2 and capsys.readouterr().out == ""
    plan_command(_spec(precision="fp8", tp=4), slo=True, ttft_ms="500", tpot_ms="40", bench_report=str(report),
                 accept_foreign_bench_report=True, json_=True)  # taken knowingly
    assert json.loads(capsys.readouterr().out)["traffic"]["acceptance"] == 0.2


def test_a_searched_precision_takes_a_report_of_any_precision_of_the_model(tmp_path):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"model": "llama-70b", "precision": "bf16", "acceptance_rate": 0.4}))
    assert ss.read_bench_terms(report, model="llama-70b", precision=None) == {"acceptance": 0.4}
    with pytest.raises(SpecError, match=re.escape("not llama-8b (any precision) as searched")):
        ss.read_bench_terms(report, model="llama-8b", precision=None)
    report.write_text(json.dumps({"model": "llama-70b", "acceptance_rate": 0.4}))
    with pytest.raises(SpecError, match="precision unknown"):
        ss.read_bench_terms(report, model="llama-70b", precision=None)


@pytest.mark.parametrize("content, needle", [
    ("[1, 2]", "expected a JSON object"),
    ('{"model": "llama-70b", "precision": "fp8", "acceptance_rate": 1.5}',
     "acceptance_rate=1.5 must be a number within 0..1"),
    ("not json", "not a readable JSON report"),
])
def test_bad_bench_reports_are_one_line(tmp_path, content, needle):
    report = tmp_path / "bench.json"
    report.write_text(content)
    with pytest.raises(SpecError, match=needle):
        ss.read_bench_terms(report, model="llama-70b", precision="fp8")
    with pytest.raises(SpecError, match="does not exist"):
        ss.read_bench_terms(tmp_path / "none.json", model="llama-70b", precision="fp8")


def test_slo_flags_need_slo_and_slo_needs_its_targets():
    with pytest.raises(SpecError, match="belong to --slo; add --slo"):
        plan_command(_spec(), ttft_ms="500")
    with pytest.raises(SpecError, match="belong to --slo; add --slo"):
        plan_command(_spec(), accept_foreign_bench_report=True)
    with pytest.raises(SpecError, match="drop --compare"):
        plan_command(_spec(), slo=True, compare=True, ttft_ms="500", tpot_ms="40")
    with pytest.raises(SpecError, match="needs --ttft-ms and --tpot-ms"):
        plan_command(_spec(), slo=True, ttft_ms="500")
    with pytest.raises(SpecError, match="target trtllm"):
        ss.search(spec_from_flags({"model": "tiny-llama", "target": "reference"}), DONE_WHEN, TRAFFIC,
                  check=resolve_checked_spec)


def test_text_report_prints_pick_front_and_losses(capsys):
    plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", input_len="2048", output_len="512")
    out = capsys.readouterr().out
    assert "\npick: " in out and "Pareto front within TTFT 500 ms (tok/s per GPU vs TPOT; * the pick)" in out
    assert "  does not fit: " in out and "  costs more: " in out and "(e.g. " in out


def _precision_record(path, *, model="llama-70b", gpu="h100-sxm", passing=("fp8",)):
    from pipeline.core.manifests import PrecisionCandidate, PrecisionSearch

    cands = [PrecisionCandidate(precision=p, kv_cache="fp8", ppl_delta_pct=0.3 if p in passing else 3.0,
                                passed=p in passing, build_id=f"b-{p}") for p in ("fp8", "int4_awq")]
    PrecisionSearch(model=model, gpu=gpu, runtime="engine", threshold_pct=1.0, candidates=cands, refused={},
                    not_tried=[], passing=list(passing), chosen=passing[-1] if passing else "fp8").write(path)
    return path


def test_search_takes_the_quality_gates_passing_set(tmp_path, monkeypatch, capsys):
    """A `--precision auto` record narrows the precisions searched to those that passed its gate: with only fp8
    passing, the default pick (w4a8_awq) is out; the record is found under engines/ when not given."""
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    (tmp_path / "engines" / "b-fp8").mkdir(parents=True)
    _precision_record(tmp_path / "engines" / "b-fp8" / "precision_search.json")
    plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", input_len="2048", output_len="512", json_=True)
    out = json.loads(capsys.readouterr().out)
    assert out["precisions"] == ["fp8"] and "precision_search.json" in out["precision_source"]
    assert out["pick"]["precision"] == "fp8" and {c["precision"] for c in out["front"]} == {"fp8"}
    # a record of another model is refused by name when given; ignored when only found
    other = _precision_record(tmp_path / "other.json", model="llama-8b")
    with pytest.raises(SpecError, match="records llama-8b, not llama-70b"):
        plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", precision_search=str(other))
    (tmp_path / "engines" / "b-fp8" / "precision_search.json").unlink()
    plan_command(_spec(), slo=True, ttft_ms="500", tpot_ms="40", input_len="2048", output_len="512", json_=True)
    out = json.loads(capsys.readouterr().out)
    assert out["precision_source"] == "searched" and out["pick"]["precision"] != "fp8"


def test_the_pick_prefers_checked_precisions_and_says_so(done_when):
    """Without verdicts only bf16 (the reference) is checked: it beats the cheaper unchecked quantized picks, each
    of which is counted and named; with fp8's gate passed, fp8 wins over bf16."""
    spec = _spec(tp=8)
    r = ss.search(spec, DONE_WHEN, TRAFFIC, check=resolve_checked_spec, quality={})
    assert r.pick.precision == "bf16" and r.pick.quality == "checked"
    assert r.pick.cost_per_1m_output_tokens_usd > done_when.pick.cost_per_1m_output_tokens_usd
    assert {c.quality for c in r.front if c.precision != "bf16"} == {"unchecked"}
    passed_over = r.losses["quality unchecked"]
    assert passed_over.count > 0 and "quality unchecked" in passed_over.example
    assert r.quality_note.startswith("quality: prefers checked precisions: bf16 is checked (the unquantized "
                                     "reference) over ")
    assert r.searched == sum(loss.count for loss in r.losses.values()) + 1
    fp8 = ss.search(spec, DONE_WHEN, TRAFFIC, check=resolve_checked_spec, quality={"fp8": True, "w4a8_awq": False})
    assert fp8.pick.precision == "fp8"
    assert fp8.pick.cost_per_1m_output_tokens_usd < r.pick.cost_per_1m_output_tokens_usd
    assert {c.quality for c in fp8.front if c.precision == "w4a8_awq"} <= {"failed"}


def test_with_no_checked_precision_the_cheapest_is_picked_and_called_unchecked(done_when):
    r = ss.search(_spec(), DONE_WHEN, TRAFFIC, check=resolve_checked_spec, precisions=("fp8", "int4_awq", "w4a8_awq"),
                  quality={})
    assert r.pick == dataclasses.replace(done_when.pick, quality="unchecked")  # the cheapest, as without verdicts
    assert "quality unchecked" not in r.losses
    assert r.quality_note.startswith("quality: no precision meeting the SLO has a passing quality gate of this model "
                                     "(all unchecked): picked the cheapest")


def test_plan_prints_quality_from_the_records_under_engines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    plan_command(_spec(tp=8), slo=True, ttft_ms="500", tpot_ms="40", input_len="2048", output_len="512")
    out = capsys.readouterr().out
    assert "\nquality: prefers checked precisions: bf16 is checked" in out and " unchecked\n" in out
    (tmp_path / "engines" / "b-fp8").mkdir(parents=True)
    _precision_record(tmp_path / "engines" / "b-fp8" / "precision_search.json", passing=("fp8",))
    plan_command(_spec(tp=8, precision="fp8"), slo=True, ttft_ms="500", tpot_ms="40", input_len="2048",
                 output_len="512", json_=True)
    out = json.loads(capsys.readouterr().out)
    assert out["pick"]["quality"] == "checked"
    assert out["quality_note"] == "quality: fp8 is checked (its quality gate passed)"


BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "0")


@pytest.mark.parametrize("flag", ["ttft_ms", "tpot_ms", "rate", "acceptance", "prefix_share", "prefix_hit"])
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_plan_slo_refuses_non_finite_or_non_positive_numbers_in_one_line(flag, value, capsys):
    """NaN passes every `< minimum` comparison: each of --slo's numbers is refused by name, exit 2, before any
    search (0 is a valid acceptance or prefix share)."""
    if value == "0" and flag in ("acceptance", "prefix_share", "prefix_hit"):
        value = "1.5"  # their bound is 0..1
    args = {"ttft_ms": "500", "tpot_ms": "40", flag: value}
    with pytest.raises(SpecError) as err:
        plan_command(_spec(precision="fp8", tp=4), slo=True, **args)
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 2 and capsys.readouterr().out == ""
    assert message.startswith(f"--{flag.replace('_', '-')}=")  # the flag the user typed


@pytest.mark.parametrize("flag", ["acceptance", "prefix_hit"])
@pytest.mark.parametrize("value", [*BAD_NUMBERS[:4], "1.5"])
def test_plan_refuses_non_finite_or_out_of_range_terms(flag, value):
    for compare in (False, True):
        with pytest.raises(SpecError, match=f"^--{flag.replace('_', '-')}=") as err:
            plan_command(_spec(precision="fp8", tp=4), compare=compare, **{flag: value})
        assert err.value.exit_code == 2


def test_a_nan_flag_is_one_line_and_exit_2_through_the_cli(capsys):
    from pipeline.cli.flags import exit_on_error

    with pytest.raises(SystemExit) as done:
        exit_on_error(plan_command)(_spec(precision="fp8", tp=4), slo=True, ttft_ms="nan", tpot_ms="40")
    assert done.value.code == 2
    assert capsys.readouterr().err == "error: --ttft-ms='nan': expected a finite number >= 1e-09\n"
