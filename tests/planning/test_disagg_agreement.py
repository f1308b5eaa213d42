"""`plan --slo`'s aggregated-vs-disaggregated verdict against AIConfigurator's own (`cli default`), in the space both
search: its checkpoint's precision, no draft, no prefix reuse, its GPUs. On every recorded run the winner is the
same and our disagg/agg ratio is within 25 % of its. The runs are recorded (scripts/record_aic_disagg.py, commands
in the index); a slow test re-runs one live when its venv exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.errors import RunError
from pipeline.planning import aiconfigurator as aic
from pipeline.planning import aiconfigurator_modes as modes
from pipeline.planning.slo_search import Slo
from pipeline.stages.check import resolve_checked_spec

DATA = Path(__file__).resolve().parents[1] / "data"
INDEX = json.loads((DATA / "aiconfigurator_disagg.json").read_text())
CASES = {c["name"]: c for c in INDEX["cases"]}
RATIO_TOLERANCE = 0.25


def _report(name: str) -> str:
    return (DATA / "aiconfigurator_disagg" / f"{name}.stdout").read_text()


def _ours(case: dict) -> modes.disagg.ServingModes:
    search = aic.AicSearch(**case["search"])
    return modes.ours_in_its_space(search, model=case["model"], gpu=case["gpu"], precision=case["precision"],
                                   check=resolve_checked_spec)


def test_the_recorded_runs_cover_both_winners_and_the_issues_cases():
    winners = {c["verdict"]["winner"] for c in CASES.values()}
    assert winners == {"agg", "disagg"} and len(CASES) >= 10
    assert {"70b-fp8-16g-4000-500", "70b-fp8-8g-1024-256", "70b-fp8-8g-256-2048"} <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_winner_and_ratio_within_25_percent(name):
    case = CASES[name]
    search = aic.AicSearch(**case["search"])
    assert " ".join(search.argv("aiconfigurator")) == case["command"]
    assert search == modes.modes_search(model=case["model"], precision=case["precision"], gpu=case["gpu"],
                                        total_gpus=search.total_gpus, lengths=(search.isl, search.osl),
                                        slo=Slo(search.ttft_ms, search.tpot_ms))
    theirs = modes.parse_modes_report(_report(name))
    assert theirs.model_dump() == case["verdict"]
    ours = _ours(case)
    assert ours.disagg is not None and ours.ratio is not None and theirs.ratio is not None
    assert ours.winner == theirs.winner, f"{name}: ours {ours.ratio:.3f}, its {theirs.ratio:.3f}"
    assert abs(ours.ratio / theirs.ratio - 1) <= RATIO_TOLERANCE, f"{name}: ours {ours.ratio}, its {theirs.ratio}"
    # each side meets the SLO by our own estimate
    assert ours.disagg.ttft_ms <= search.ttft_ms and ours.disagg.tpot_ms <= search.tpot_ms


def test_modes_report_parser_reads_both_tables_and_refuses_what_it_cannot_read():
    name = "70b-fp8-8g-1024-256"
    verdict = modes.parse_modes_report(_report(name))
    assert verdict.winner == "disagg" and verdict.disagg_layout.startswith("2 x prefill tp1pp1 + 1 x decode tp2pp1")
    only_agg = _report(name).partition("disagg Top Configurations")[0].replace("Chosen: disagg", "Chosen: agg")
    agg = modes.parse_modes_report(only_agg)
    assert agg.disagg_tokens_per_s_per_gpu is None and agg.ratio is None and agg.winner == "agg"
    with pytest.raises(RunError, match="names no best experiment"):
        modes.parse_modes_report(_report(name).replace("Best Experiment Chosen", "Best"))
    with pytest.raises(RunError, match="cannot read its agg/disagg rows"):
        modes.parse_modes_report(_report(name).replace("(p)workers", "(p)wrk"))


def test_a_plan_outside_its_data_gets_one_line():
    why = modes.modes_search(model="qwen2.5-7b", precision="fp8", gpu="h100-sxm", total_gpus=8, lengths=(512, 128),
                             slo=Slo(500, 30))
    assert isinstance(why, str) and "no checkpoint of qwen2.5-7b at fp8" in why
    assert "2 GPUs or more" in modes.modes_search(model="llama-8b", precision="bf16", gpu="h100-sxm", total_gpus=1,
                                                  lengths=(512, 128), slo=Slo(500, 30))


@pytest.mark.slow
def test_agreement_live():
    exe = aic.TOOL.located()
    if exe is None:
        pytest.skip(f"no AIConfigurator venv (set {aic.AIC_ENV} or run `invoke plan --estimator aiconfigurator`)")
    case = CASES["70b-fp8-8g-1024-256"]
    _, theirs = modes.run(aic.AicSearch(**case["search"]), exe)
    ours = _ours(case)
    assert ours.winner == theirs.winner and theirs.ratio is not None and ours.ratio is not None
    assert abs(ours.ratio / theirs.ratio - 1) <= RATIO_TOLERANCE
