"""The prefix-cache hit-ratio alert of a fleet: its floor is the fleet's expectation (pipeline.planning.fleet)."""

from pipeline.core.spec import PlannedTraffic, ServingTarget
from pipeline.ops.monitoring.rules import hit_ratio_floor, rule_groups, watch_plan
from pipeline.planning.perf_model import HIT_RATIO_WARNING
from pipeline.planning.fleet import PrefixShape, Routing
from pipeline.planning.planner import plan_capacity
from pipeline.stages.check import resolve_spec


def _spec(replicas: int, share: float = 0.7):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    return spec.model_copy(update={"serving_target": ServingTarget(
        replicas=replicas, ttft_ms=400.0, tpot_ms=30.0,
        traffic=PlannedTraffic(input_len=2048, output_len=128, prefix_share=share))})


def _alert(w):
    return next(r for g in rule_groups(w) for r in g["rules"] if r.get("alert") == "PrefixCacheHitRatioLow")


def test_one_replica_keeps_the_share_and_the_text():
    w = watch_plan(_spec(1), deployment="x", gpus=4)
    assert (w.hit_ratio_min, w.hit_ratio_basis) == (0.7, "")
    alert = _alert(w)
    assert alert["expr"].endswith("< 0.7") and "fleet" not in alert["annotations"]["description"]


def test_replicas_take_the_fleet_expectation():
    spec = _spec(4)
    terms = dict(input_len=2048, output_len=128, prefix_hit_ratio=0.7)
    many = plan_capacity(spec, routing=Routing("round-robin", PrefixShape(prefixes=500, requests_per_prefix=6)),
                         **terms)
    floor, basis = hit_ratio_floor(many, 0.7, prefix_alert=False)
    assert floor == round(many.fleet["hit_ratio"]["round-robin"], 4) and floor < 0.7
    assert "4 replicas behind round-robin" in basis
    kv = plan_capacity(spec, routing=Routing("kv", PrefixShape(prefixes=500, requests_per_prefix=6)), **terms)
    assert floor < hit_ratio_floor(kv, 0.7, prefix_alert=False)[0] <= 0.7
    # the spec's traffic (bench's one shared prefix): round-robin keeps one server's ratio; the alert says why
    w = watch_plan(spec, deployment="x", gpus=16)
    assert w.hit_ratio_min == 0.7 and "fleet's expected ratio over 4 replicas" in _alert(w)["annotations"][
        "description"]
    assert hit_ratio_floor(many, 0.0, prefix_alert=True)[0] == HIT_RATIO_WARNING and hit_ratio_floor(many, 0.0,
                                                                                       prefix_alert=False)[0] is None


def test_the_spec_records_the_prefix_shape_and_the_alert_and_plan_read_it_back(capsys):
    from pipeline.cli.commands import plan_command
    from pipeline.core.spec import spec_from_document

    shaped = PlannedTraffic(input_len=2048, output_len=128, prefix_share=0.7, shared_prefixes=500,
                            requests_per_prefix=6)
    assert {"shared_prefixes": 500, "requests_per_prefix": 6.0}.items() <= shaped.model_dump().items()
    assert "shared_prefixes" not in _spec(4).serving_target.traffic.model_dump()  # one prefix: dumped as before
    spec = _spec(4).model_copy(update={"serving_target": _spec(4).serving_target.model_copy(
        update={"traffic": shaped})})
    again = spec_from_document(spec.model_dump(mode="json"))
    assert again.serving_target.traffic.shared_prefixes == 500
    w = watch_plan(again, deployment="x", gpus=16)
    expected = plan_capacity(again, input_len=2048, output_len=128, prefix_hit_ratio=0.7,
                             routing=Routing("round-robin", PrefixShape(prefixes=500, requests_per_prefix=6)))
    assert w.hit_ratio_min == round(expected.fleet["hit_ratio"]["round-robin"], 4) < 0.7
    plan_command(again, input_len="2048", output_len="128", prefix_hit="0.7")  # no shape flags: the spec's
    assert "(500 shared prefixes)" in capsys.readouterr().out


def test_the_alert_expects_the_deployments_router():
    shaped = PlannedTraffic(input_len=2048, output_len=128, prefix_share=0.7, shared_prefixes=500,
                            requests_per_prefix=6)
    spec = _spec(4).model_copy(update={"serving_target": _spec(4).serving_target.model_copy(
        update={"traffic": shaped})})
    rr, kv = (watch_plan(spec, deployment="x", gpus=16, router=r) for r in ("round-robin", "kv"))
    assert rr.hit_ratio_min < kv.hit_ratio_min <= 0.7
    assert "behind kv routing" in _alert(kv)["annotations"]["description"]
