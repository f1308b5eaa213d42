"""The disaggregated-serving model (pipeline.planning.disagg) and `plan --slo`'s agg-vs-disagg verdict."""

from __future__ import annotations

import json

import pytest

from pipeline.cli.commands import plan_command
from pipeline.cli.flags import spec_from_flags
from pipeline.core.errors import SpecError
from pipeline.planning import disagg
from pipeline.planning import slo_search as ss
from pipeline.planning.fleet import PrefixShape, Routing
from pipeline.stages.check import resolve_checked_spec

SLO = ss.Slo(ttft_ms=1000, tpot_ms=30)
PREFILL_HEAVY = ss.Traffic(input_len=4000, output_len=500)


def _spec(**flags):
    return resolve_checked_spec(**{"model": "llama-70b", "gpu": "h100-sxm", "precision": "fp8", **flags})


def test_units_tile_nodes():
    assert disagg.unit_sizes(_spec()) == (1, 2, 4, 8)
    assert disagg.unit_sizes(_spec(gpu_count=8, nodes=2)) == (1, 2, 4, 8, 16)
    assert disagg.unit_sizes(_spec(gpu_count=4, nodes=3)) == (1, 2, 4, 8, 12)


def test_match_balances_the_pools_within_the_unit_sizes():
    p = disagg.Worker("prefill", "fp8", 1, 1, 500.0, requests_per_s=3.0)
    d = disagg.Worker("decode", "fp8", 2, 64, 25.0, requests_per_s=5.0)
    x, y, rate = disagg.match(p, d, (1, 2, 4, 8))
    # 2 prefill (5.4 req/s after pairing) + 1 decode (4.6): 4 GPUs; 6 + 1 (16.2 vs 4.6) wastes prefill
    assert (x, y) == (2, 1) and rate == pytest.approx(min(2 * 3.0 * 0.9, 5.0 * 0.92))
    assert disagg.match(p, d, (8,)) is not None and disagg.match(p, d, (1, 2)) is None  # 1 + 2 GPUs is 3


def test_workers_carry_the_queue_the_handoff_and_the_corrections():
    spec = _spec(tp=1, max_batch_size=1, runtime="pytorch")
    p = disagg.prefill_worker(spec, PREFILL_HEAVY, prefix_hit=0.0)
    step = 1e3 / p.requests_per_s  # the corrected prefill step
    assert p.latency_ms > step * disagg.PREFILL_QUEUE  # plus the KV hand-off
    assert p.latency_ms - step * disagg.PREFILL_QUEUE < 5  # 4000 tokens of FP8 KV over NVLink: ~1.5 ms
    reused = disagg.prefill_worker(spec, PREFILL_HEAVY, prefix_hit=0.5)
    assert reused.requests_per_s > 1.5 * p.requests_per_s  # half the prompt is not prefilled again
    small, large = (disagg.decode_worker(spec, PREFILL_HEAVY, b) for b in (8, 64))
    assert large.latency_ms > small.latency_ms and large.requests_per_s > 4 * small.requests_per_s


def test_the_pick_and_the_disaggregated_best_for_a_prefill_heavy_load():
    spec = _spec()
    found = ss.search(spec, SLO, PREFILL_HEAVY, check=resolve_checked_spec, speculation=False)
    modes = disagg.serving_modes(spec, found, check=resolve_checked_spec)
    d = modes.disagg
    assert d is not None and modes.winner == "disagg" and modes.ratio > 1.1
    assert d.ttft_ms <= SLO.ttft_ms and d.tpot_ms <= SLO.tpot_ms
    assert d.gpus == d.prefill_workers * d.prefill.tp + d.decode_workers * d.decode.tp and d.gpus in (1, 2, 4, 8)
    assert d.prefill.precision == d.decode.precision == found.pick.precision
    assert d.tokens_per_s_per_gpu / found.pick.tokens_per_s_per_gpu == pytest.approx(modes.ratio, rel=0.01)


def test_long_generations_stay_aggregated():
    spec = _spec()
    found = ss.search(spec, SLO, ss.Traffic(input_len=256, output_len=2048), check=resolve_checked_spec,
                      speculation=False)
    modes = disagg.serving_modes(spec, found, check=resolve_checked_spec)
    assert modes.winner == "agg" and modes.ratio < 0.9
    assert "aggregated wins" in modes.lines()[-1]


def test_a_rate_provisions_units_and_round_robin_prefill_loses_prefix_hits():
    traffic = ss.Traffic(input_len=4000, output_len=500, rate=40.0, prefix_share=0.6,
                         routing=Routing("round-robin", PrefixShape(prefixes=64, requests_per_prefix=8)))
    spec = _spec()
    rr = disagg.search(spec, SLO, traffic, ("fp8",), check=resolve_checked_spec)
    kv = disagg.search(spec, SLO, ss.Traffic(**{**traffic.__dict__, "routing": Routing("kv", traffic.routing.shape)}),
                       ("fp8",), check=resolve_checked_spec)
    assert rr is not None and kv is not None and rr.replicas > 1
    assert rr.requests_per_s * rr.replicas >= 40.0 and kv.requests_per_s * kv.replicas >= 40.0
    assert kv.prefill.requests_per_s > rr.prefill.requests_per_s  # KV routing keeps the prompts' prefix hits
    assert kv.cost_per_1m_output_tokens_usd < rr.cost_per_1m_output_tokens_usd and kv.replicas < rr.replicas


@pytest.mark.parametrize("flags, why", [
    ({"runtime": "engine"}, "the spec fixes engine"),
    ({"gpu_count": 1, "tp": 1}, "2 GPUs or more"),
])
def test_disaggregation_unsearched_says_why(flags, why):
    spec = _spec(**flags)
    found = ss.search(spec, SLO, ss.Traffic(input_len=1024, output_len=256), check=resolve_checked_spec,
                      speculation=False)
    modes = disagg.serving_modes(spec, found, check=resolve_checked_spec)
    assert modes.disagg is None and modes.winner == "agg" and why in modes.note
    assert modes.lines() == [f"serving mode: aggregated ({modes.note})"]


def test_plan_slo_prints_and_records_the_verdict(capsys):
    flags = dict(slo=True, ttft_ms="1000", tpot_ms="30", input_len="4000", output_len="500")
    spec = spec_from_flags({"model": "llama-70b", "gpu": "h100-sxm", "precision": "fp8"})
    plan_command(spec, **flags)
    out = capsys.readouterr().out
    assert "\ndisaggregated best: " in out and "\nserving mode: disaggregated pays: " in out
    assert "`--write-spec FILE` writes the unit" in out and "`invoke deploy --platform dynamo --spec FILE`" in out
    plan_command(spec, json=True, **flags)
    data = json.loads(capsys.readouterr().out)
    assert data["serving_modes"]["winner"] == "disagg" and data["serving_modes"]["disagg"]["prefill"]["role"] == \
        "prefill"


def test_estimator_with_slo_outside_its_data_is_one_line(capsys):
    spec = spec_from_flags({"model": "qwen2.5-7b", "gpu": "h100-sxm", "precision": "fp8"})
    plan_command(spec, slo=True, ttft_ms="500", tpot_ms="30", input_len="1024", output_len="256",
                 estimator="aiconfigurator")
    out = capsys.readouterr().out
    assert "aiconfigurator: no agg-vs-disagg comparison: AIConfigurator has no checkpoint of qwen2.5-7b at fp8" in out


def test_write_spec_writes_the_disaggregated_unit_when_it_pays_and_the_pick_with_serving_mode_agg(tmp_path, capsys):
    from pipeline.core.spec import resolve_spec

    spec = spec_from_flags({"model": "llama-70b", "gpu": "h100-sxm", "precision": "fp8"})
    flags = dict(slo=True, ttft_ms="1000", tpot_ms="30", input_len="4000", output_len="500", rate="10")
    plan_command(spec, write_spec=str(tmp_path / "unit.yaml"), **flags)
    unit = resolve_checked_spec(spec_file=tmp_path / "unit.yaml")
    d = unit.serving_target.disagg
    assert unit.runtime == "pytorch" and unit.speculation_mode is None and d is not None
    assert unit.serving_target.traffic.acceptance is None and unit.serving_target.replicas >= 1
    assert (tmp_path / "unit.yaml").read_text().startswith("# plan --slo pick: disaggregated ")
    printed = capsys.readouterr().out
    assert f"{d.prefill_workers} x prefill fp8 tp={d.prefill_tp} + {d.decode_workers} x decode fp8 " \
           f"tp={unit.parallelism.tp} batch {unit.max_batch_size}" in printed
    plan_command(spec, write_spec=str(tmp_path / "agg.yaml"), serving_mode="agg", **flags)
    agg = resolve_checked_spec(spec_file=tmp_path / "agg.yaml")
    assert agg.serving_target.disagg is None and "serving mode:" not in capsys.readouterr().out
    target = unit.serving_target.model_dump(mode="json", exclude_none=True)
    doc = {"model": "llama-70b", "quantization": {"precision": "fp8"}, "serving_target": target}
    with pytest.raises(SpecError, match="Dynamo's TensorRT-LLM workers run the PyTorch runtime"):
        resolve_spec(spec_data={**doc, "runtime": "engine"})
    with pytest.raises(SpecError, match="the unit was planned without speculation"):
        resolve_spec(spec_data={**doc, "runtime": "pytorch", "speculation": {"speculative_decoding": "ngram"}})
    bad = {**target, "disagg": {**target["disagg"], "prefill_tp": 3}}
    with pytest.raises(SpecError, match="serving_target.disagg.prefill_tp=3"):
        resolve_spec(spec_data={**doc, "runtime": "pytorch", "serving_target": bad})
    with pytest.raises(SpecError, match="belong to --slo"):
        plan_command(spec, serving_mode="agg")
