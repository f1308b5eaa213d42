"""`deploy`'s monitoring files: Prometheus rules from the spec and the planner, the Grafana dashboard built with the
foundation SDK, both written beside the serving files (k8s: a validated PrometheusRule + dashboard ConfigMap)."""

import copy
import json

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.validate import validate_object
from pipeline.ops.monitoring import rules
from pipeline.ops.monitoring.dashboard import dashboard
from pipeline.ops.monitoring.rules import prometheus_rule, rule_groups, watch_plan
from pipeline.planning.break_even import speculation_break_even
from pipeline.planning.planner import plan_capacity, serving_estimate

URL = "https://releases.example.invalid/llama.tar.gz"


def _by_name(groups):
    return {r.get("record") or r["alert"]: r for g in groups for r in g["rules"]}


def test_break_even_is_where_speculation_matches_the_target_alone():
    from pipeline.core.gpus import GPUS

    spec = resolve_spec(model="llama-70b", precision="fp8", draft="auto", tp=2)
    even = speculation_break_even(spec)
    assert even is not None and 0.0 < even.acceptance < 1.0 and even.pays_off
    assert 1 <= even.batch <= spec.speculation.max_batch_for_speculation
    plan = plan_capacity(spec)

    def tok_s(s, acceptance):  # the same deployment (memory, batch) with speculation on or off
        est, _ = serving_estimate(s, GPUS[spec.hardware.gpu], tp=2, batch=even.batch, input_len=plan.input_len,
                                  output_len=plan.output_len, acceptance=acceptance, prefix_hit_ratio=0.0)
        return est.output_tokens_per_s

    plain = tok_s(spec.model_copy(update={"draft_model": None}), 0.0)
    assert plain == pytest.approx(even.tokens_per_s_target_only, abs=0.1)
    assert tok_s(spec, even.acceptance + 0.02) > plain > tok_s(spec, even.acceptance - 0.02)
    assert speculation_break_even(resolve_spec(model="llama-70b", precision="fp8")) is None


def test_rules_take_thresholds_from_the_spec_and_planner():
    spec = resolve_spec(model="llama-70b", precision="fp8", draft="auto", gpu_price_per_hour=2.5)
    w = watch_plan(spec, deployment="llama70", gpus=4)
    plan = plan_capacity(spec)
    by = _by_name(rule_groups(w))
    assert by["PrefixCacheHitRatioLow"]["expr"] == 'trtllm:prefix_cache_hit_ratio{job="llama70"} < 0.6'
    assert by["PrefixCacheHitRatioLow"]["for"] == "15m"
    assert "[15m]" in by[rules.HIT_RATIO]["expr"] and 'kv_cache_block_type="reused"' in by[rules.HIT_RATIO]["expr"]
    assert f"< {speculation_break_even(spec).acceptance:g}" in by["SpeculationBelowBreakEven"]["expr"]
    assert by["QueueTimeHigh"]["expr"].endswith(f"> {round(plan.ttft_ms_estimate, 1) * 1000:g}")
    # $ per 1M output tokens: 4 GPUs x $2.5/h, per second, x 1e6 / tok/s
    assert by[rules.COST]["expr"].startswith(f"{4 * 2.5 / 3600 * 1e6:.10g} / trtllm:output_tokens_per_s")
    assert by[rules.COST]["labels"] == {"gpus": "4", "usd_per_gpu_hour": "2.5"}
    limit = plan.cost_per_1m_output_tokens_usd * rules.COST_ALERT_FACTOR
    assert f"> {limit:.6g}" in by["CostPerTokenAbovePlan"]["expr"]
    plain = _by_name(rule_groups(watch_plan(resolve_spec(model="llama-70b", precision="fp8"), deployment="x",
                                            gpus=1)))
    assert "SpeculationBelowBreakEven" not in plain and rules.ACCEPTANCE not in plain


def test_short_window_and_for_are_parameters():
    w = watch_plan(resolve_spec(model="tiny-llama", precision="fp8"), deployment="t", gpus=1, window="20s",
                   alert_for="0s")
    by = _by_name(rule_groups(w))
    assert "[20s]" in by[rules.HIT_RATIO]["expr"] and by["PrefixCacheHitRatioLow"]["for"] == "0s"


def test_prometheus_rule_fits_the_operator_crd():
    w = watch_plan(resolve_spec(model="llama-70b", precision="fp8"), deployment="llama70", gpus=4)
    obj = prometheus_rule(w, namespace="serving", labels={"release": "kube-prometheus"})
    validate_object(obj)
    bad = copy.deepcopy(obj)
    bad["spec"]["groups"][1]["rules"][0]["for"] = "fifteen minutes"
    with pytest.raises(DeployError, match="PrometheusRule llama70-trtllm fails the monitoring.coreos.com/v1 CRD"):
        validate_object(bad)


def test_dashboard_has_a_panel_per_series_with_the_alert_thresholds():
    w = watch_plan(resolve_spec(model="llama-70b", precision="fp8", draft="auto"), deployment="llama70", gpus=4)
    board = dashboard(w)
    assert board["uid"] == "trtllm-llama70" and board["title"] == "TensorRT-LLM cost: llama70"
    by_title = {p["title"]: p for p in board["panels"]}
    assert set(by_title) == {"Prefix-cache hit ratio", "Speculation acceptance", "$ per 1M output tokens",
                             "Output tokens/s", "Mean queue time", "KV-cache blocks used"}
    hit = by_title["Prefix-cache hit ratio"]
    assert hit["type"] == "timeseries" and hit["targets"][0]["expr"] == 'trtllm:prefix_cache_hit_ratio{job="llama70"}'
    steps = hit["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["color"] for s in steps] == ["red", "green"] and steps[1]["value"] == 0.6
    assert hit["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"
    assert by_title["Speculation acceptance"]["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == \
        w.acceptance_min
    assert board["templating"]["list"][0]["type"] == "datasource"


def test_k8s_deploy_writes_rules_and_dashboard_config_map(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8")
    out = tmp_path / "k8s"
    deploy_command(spec, platform="k8s", release_url=URL, output=str(out), name="llama70", namespace="serving")
    objects = {o["kind"]: o for o in yaml.safe_load_all((out / "monitoring.yaml").read_text())}
    assert set(objects) == {"PrometheusRule", "ConfigMap"}
    assert objects["PrometheusRule"]["metadata"]["namespace"] == "serving"
    alerts = _by_name(objects["PrometheusRule"]["spec"]["groups"])
    assert alerts["PrefixCacheHitRatioLow"]["expr"].startswith('trtllm:prefix_cache_hit_ratio{job="llama70"}')
    cm = objects["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(cm["data"]["llama70-trtllm.json"])
    assert board == json.loads((out / "dashboard.json").read_text()) and board["uid"] == "trtllm-llama70"


def test_slurm_deploy_writes_a_plain_rules_file(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8")
    out = tmp_path / "slurm"
    deploy_command(spec, platform="slurm", release_url=URL, output=str(out), name="llama70")
    groups = yaml.safe_load((out / "prometheus-rules.yml").read_text())["groups"]
    assert [g["name"] for g in groups] == ["llama70.trtllm.recording", "llama70.trtllm.alerts"]
    assert (out / "dashboard.json").is_file()
