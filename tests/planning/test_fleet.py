"""The fleet prefix-hit model (pipeline.planning.fleet) and the plan's fleet figures."""

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import PlannedTraffic, ServingTarget
from pipeline.planning.fleet import (
    DEFAULT_SPILL, FleetCache, PrefixShape, Routing, fleet_hit_ratio, held, replicas_reached,
)
from pipeline.planning.planner import format_capacity_plan, plan_capacity
from pipeline.stages.check import resolve_spec

# The issue's measurement (Dynamo 1.6.1 frontend + two dynamo.mocker workers, --engine-type trtllm): 16 shared
# ~690-token prompts, 200 KV blocks per worker; the mocker's TRT-LLM block size is 32 tokens (its --block-size help).
BLOCK, PROMPT, PROMPTS, BLOCKS = 32, 690, 16, 200
MEASURED_C1 = {"kv": 0.887, "round-robin": 0.713}


def _anchor(in_flight_tokens: float = 0.0) -> tuple[float, dict[str, float]]:
    reused = PROMPT // BLOCK * BLOCK
    cache = FleetCache(2, BLOCKS * BLOCK - in_flight_tokens, reused)
    shape = PrefixShape(prefixes=PROMPTS)
    h1 = reused / PROMPT  # whole prompts repeat: every full block is reusable once cached
    return h1, {r: fleet_hit_ratio(h1, cache, Routing(r, shape)) for r in ("kv", "round-robin")}


def test_the_issues_measurement_direction_and_rough_size():
    """Steady state, uniform prompt choice, the default spill (not fitted): KV 0.93 vs round-robin 0.58, a gap of
    0.35 against the measured 0.17 at concurrency 1. The model's round-robin is the worst case for its working set
    (352 blocks of prompts in 200-block caches): the measured run's ordered traffic kept more."""
    h1, fleet = _anchor()
    # steady state: each worker holds 200 of the 16 x 21 blocks round-robin asks it for
    assert fleet["round-robin"] == pytest.approx(h1 * BLOCKS / (PROMPTS * (PROMPT // BLOCK)))
    assert fleet["kv"] >= 0.85 and fleet["kv"] == pytest.approx(MEASURED_C1["kv"], abs=0.06)
    gap, measured = fleet["kv"] - fleet["round-robin"], MEASURED_C1["kv"] - MEASURED_C1["round-robin"]
    assert measured <= gap <= 2.5 * measured
    assert fleet["round-robin"] < MEASURED_C1["round-robin"]  # the model's side of the error: it under-predicts


def test_in_flight_tokens_lower_round_robin_first():
    _, idle = _anchor()
    _, busy = _anchor(in_flight_tokens=4 * 146)  # concurrency 8 on two workers, ~146 unshared tokens each
    assert busy["round-robin"] < idle["round-robin"] and busy["kv"] > busy["round-robin"] + 0.10


def test_cold_misses_multiply_with_round_robin_only():
    cache, shape = FleetCache(4, 1e9, 512), PrefixShape(prefixes=100, requests_per_prefix=5)
    rr = fleet_hit_ratio(0.6, cache, Routing("round-robin", shape))
    reached = replicas_reached(5, 4)
    assert 1 < reached < 4 and rr == pytest.approx(0.6 * (1 - reached / 5))
    kv = fleet_hit_ratio(0.6, cache, Routing("kv", shape, spill=0.0))
    assert kv == pytest.approx(0.6 * (1 - 1 / 5))  # the cache holds everything: one cold miss per prefix
    assert fleet_hit_ratio(0.6, cache, Routing("kv", shape)) == pytest.approx((1 - DEFAULT_SPILL) * kv
                                                                               + DEFAULT_SPILL * rr)


def test_one_replica_is_one_server_and_one_lasting_prefix_keeps_h1():
    shape = PrefixShape(prefixes=50, requests_per_prefix=3)
    one = {r: fleet_hit_ratio(0.42, FleetCache(1, 1000, 256), Routing(r, shape)) for r in ("kv", "round-robin")}
    assert one["kv"] == one["round-robin"] == pytest.approx(0.42 * held(1000, 50 * 256) * (1 - 1 / 3))
    for router in ("kv", "round-robin"):
        assert fleet_hit_ratio(0.42, FleetCache(8, 1000, 256), Routing(router)) == 0.42
        assert fleet_hit_ratio(0.0, FleetCache(8, 1000, 256), Routing(router, shape)) == 0.0
    assert replicas_reached(None, 3) == 3


def test_bad_routing_is_refused():
    with pytest.raises(SpecError, match="round-robin"):
        Routing("random")
    with pytest.raises(SpecError, match="spill"):
        Routing(spill=1.5)


def _replicated(n: int):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    return spec.model_copy(update={"serving_target": ServingTarget(
        replicas=n, ttft_ms=500, tpot_ms=40, traffic=PlannedTraffic(input_len=2048, output_len=256,
                                                                       prefix_share=0.75))})


def test_plan_with_replicas_uses_the_fleet_ratio_and_says_what_kv_saves():
    terms = dict(input_len=2048, output_len=256, prefix_hit_ratio=0.75)
    one = plan_capacity(_replicated(1), **terms)
    assert one.fleet is None and "fleet" not in one.as_dict()
    shape = PrefixShape(prefixes=400, requests_per_prefix=8)
    rr = plan_capacity(_replicated(4), routing=Routing("round-robin", shape), **terms)
    kv = plan_capacity(_replicated(4), routing=Routing("kv", shape), **terms)
    f = rr.fleet
    assert f is not None and f["hit_ratio"]["round-robin"] < f["hit_ratio"]["kv"] < 0.75
    assert rr.estimate_hit_ratio == f["hit_ratio"]["round-robin"] and kv.estimate_hit_ratio == f["hit_ratio"]["kv"]
    assert rr.cost_per_1m_output_tokens_usd > one.cost_per_1m_output_tokens_usd  # fewer hits: more prefill
    assert f["kv_saves_usd_per_1m"] > 0 and f["kv_saves_ttft_ms"] > 0
    assert f["cost_per_1m_output_tokens_usd"]["round-robin"] == rr.cost_per_1m_output_tokens_usd
    assert f"KV routing saves ${f['kv_saves_usd_per_1m']:.4f} per 1M" in format_capacity_plan(rr)
    # bench's one shared prefix, forever: round-robin loses nothing, the figures are one server's
    same = plan_capacity(_replicated(4), **terms)
    assert same.fleet["hit_ratio"] == {"round-robin": 0.75, "kv": 0.75}
    assert same.cost_per_1m_output_tokens_usd == one.cost_per_1m_output_tokens_usd


def test_slo_search_sizes_the_fleet_at_its_hit_ratio():
    from pipeline.cli.flags import spec_from_flags
    from pipeline.planning import slo_search as ss
    from pipeline.stages.check import resolve_checked_spec

    spec = spec_from_flags({"model": "llama-70b", "gpu": "h100-sxm", "precision": "fp8", "tp": "4"})
    shape = PrefixShape(prefixes=2000, requests_per_prefix=4)
    picks = {}
    for name, routing in (("one prefix", Routing()), ("round-robin", Routing("round-robin", shape)),
                          ("kv", Routing("kv", shape))):
        traffic = ss.Traffic(2048, 512, prefix_share=0.75, rate=50.0, routing=routing)
        r = ss.search(spec, ss.Slo(ttft_ms=500, tpot_ms=40), traffic, check=resolve_checked_spec, speculation=False)
        picks[name] = p = r.pick
        assert p.replicas > 1 and p.replicas * p.tokens_per_s >= 50 * 512  # re-sized at the fleet's ratio
        text = ss.format_search(r)
        assert f"behind {routing.router} routing" in text
        assert ("--shared-prefixes 2000 --prefix-requests 4`" in text) == (routing.shape == shape)
        recorded = ss.serving_target(r).traffic  # the written spec keeps the shape the fleet was sized for
        assert (recorded.shared_prefixes, recorded.requests_per_prefix) == (routing.shape.prefixes,
                                                                            routing.shape.requests_per_prefix)
    assert picks["one prefix"].prefix_hit_ratio == 0.75  # steady state, one prefix: one server's ratio
    assert picks["round-robin"].prefix_hit_ratio < picks["kv"].prefix_hit_ratio < 0.75
    assert picks["round-robin"].cost_per_1m_output_tokens_usd >= picks["kv"].cost_per_1m_output_tokens_usd \
        >= picks["one prefix"].cost_per_1m_output_tokens_usd


def test_plan_command_prints_the_routing_line_and_json(capsys):
    import json

    from pipeline.cli.commands import plan_command

    flags = dict(input_len="2048", output_len="256", prefix_hit="0.75", shared_prefixes="400", prefix_requests="8")
    plan_command(_replicated(4), **flags)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("KV routing vs round-robin"))
    assert "prefix hit over 4 replicas:" in line and "(400 shared prefixes); KV routing saves $" in line
    plan_command(_replicated(4), router="kv", json_=True, **flags)
    data = json.loads(capsys.readouterr().out)
    assert data["fleet"]["router"] == "kv" and data["fleet"]["requests_per_prefix"] == 8
    assert data["prefix_hit_ratio"] == 0.75  # one server's, as given; the estimate is at the fleet's
    with pytest.raises(SpecError, match="--compare"):
        plan_command(_replicated(4), compare=True, router="kv")
    with pytest.raises(SpecError, match="plan.*router|round-robin"):
        plan_command(_replicated(4), router="random")
