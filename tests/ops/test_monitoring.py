"""`deploy`'s monitoring files: Prometheus rules from the spec and the planner, the Grafana dashboard built with the
foundation SDK, and how Prometheus scrapes the server as the rules' job, all written beside the serving files (k8s:
a validated PrometheusRule, PodMonitor and dashboard ConfigMap; Slurm: rules and a file_sd scrape config)."""

import copy
import json

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.k8s import LWS_NAME_LABEL
from pipeline.ops.deploy.validate import validate_object
from pipeline.ops.monitoring import rules
from pipeline.ops.monitoring.dashboard import dashboard
from pipeline.ops.monitoring.rules import prometheus_rule, rule_groups, watch_plan
from pipeline.ops.monitoring.scrape import pod_monitor
from pipeline.planning.break_even import speculation_break_even
from pipeline.planning.planner import plan_capacity, serving_estimate
from tests.support.k8s import PIPELINE_IMAGE

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
    assert "PrefixCacheHitRatioLow" not in by  # no declared shared prefix, no flag
    assert "[15m]" in by[rules.HIT_RATIO]["expr"] and 'kv_cache_block_type="reused"' in by[rules.HIT_RATIO]["expr"]
    assert f"< {speculation_break_even(spec).acceptance:g}" in by["SpeculationBelowBreakEven"]["expr"]
    assert by["QueueTimeHigh"]["expr"].endswith(f"> {round(plan.ttft_ms_estimate, 1) * 1000:g}")
    # no SLO: latency limits are the plan's estimates x the documented margin
    ttft = round(plan.ttft_ms_estimate * rules.LATENCY_MARGIN, 1)
    assert by["TTFTP99AboveSLO"]["expr"] == f'trtllm:ttft_ms:p99{{job="llama70"}} > {ttft:g}'
    assert by["TPOTAboveSLO"]["expr"].endswith(f"> {round(plan.tpot_ms_estimate * rules.LATENCY_MARGIN, 2):g}")
    assert "plan's estimate" in by["TTFTP99AboveSLO"]["annotations"]["summary"]
    assert by["TargetDown"]["expr"] == 'up{job="llama70"} == 0 or absent(up{job="llama70"})'
    assert by["RequestFailureRatioHigh"]["expr"] == f'trtllm:request_failure_ratio{{job="llama70"}} > ' \
        f'{rules.ERROR_RATIO_MAX:g}'
    assert 'nv_inference_request_failure{job="llama70",model="tensorrt_llm"}' in by[rules.ERROR_RATIO]["expr"]
    assert "nv_inference_first_response_histogram_ms_bucket" in by[rules.TTFT_P99]["expr"]
    assert 'request_type="waiting"' in by[rules.WAITING]["expr"] and "deriv(" in by["QueueGrowing"]["expr"]
    flagged = _by_name(rule_groups(watch_plan(spec, deployment="llama70", gpus=4, prefix_alert=True)))
    assert flagged["PrefixCacheHitRatioLow"]["expr"] == 'trtllm:prefix_cache_hit_ratio{job="llama70"} < 0.6'
    assert flagged["PrefixCacheHitRatioLow"]["for"] == "15m"
    # $ per 1M output tokens: 4 GPUs x $2.5/h, per second, x 1e6 / tok/s
    assert by[rules.COST]["expr"].startswith(f"{4 * 2.5 / 3600 * 1e6:.10g} / trtllm:output_tokens_per_s")
    assert by[rules.COST]["labels"] == {"gpus": "4", "usd_per_gpu_hour": "2.5"}
    limit = plan.cost_per_1m_output_tokens_usd * rules.COST_ALERT_FACTOR
    assert f"> {limit:.6g}" in by["CostPerTokenAbovePlan"]["expr"]
    plain = _by_name(rule_groups(watch_plan(resolve_spec(model="llama-70b", precision="fp8"), deployment="x",
                                            gpus=1)))
    assert "SpeculationBelowBreakEven" not in plain and rules.ACCEPTANCE not in plain


def test_short_window_and_for_are_parameters():
    w = watch_plan(resolve_spec(model="tiny-llama", precision="fp8"), deployment="t", gpus=1,
                   timing=("20s", "0s"))
    by = _by_name(rule_groups(w))
    assert "[20s]" in by[rules.HIT_RATIO]["expr"] and by["TargetDown"]["for"] == "0s"


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
    assert board["uid"] == "trtllm-llama70" and board["title"] == "TensorRT-LLM: llama70"
    by_title = {p["title"]: p for p in board["panels"]}
    assert set(by_title) == {"Requests/s", "Request failure ratio", "TTFT p99", "Time per output token (mean)",
                             "Mean queue time", "Waiting requests", "GPU utilization", "GPU memory used",
                             "Prefix-cache hit ratio", "KV-cache blocks used", "Speculation acceptance",
                             "$ per 1M output tokens", "Output tokens/s"}
    assert by_title["TTFT p99"]["fieldConfig"]["defaults"]["thresholds"]["steps"][1] == \
        {"color": "red", "value": w.ttft_ms_max}
    assert by_title["GPU utilization"]["targets"][0]["expr"] == "DCGM_FI_DEV_GPU_UTIL{}"
    assert by_title["GPU memory used"]["targets"][0]["expr"] == "DCGM_FI_DEV_FB_USED{}"
    assert by_title["GPU memory used"]["fieldConfig"]["defaults"]["unit"] == "decmbytes"
    hit = dashboard(watch_plan(resolve_spec(model="llama-70b", precision="fp8", draft="auto"), deployment="llama70",
                               gpus=4, prefix_alert=True))["panels"]
    hit = next(p for p in hit if p["title"] == "Prefix-cache hit ratio")
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
    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                   release_url=URL, output=str(out), name="llama70",
                   namespace="serving")
    objects = {o["kind"]: o for o in yaml.safe_load_all((out / "monitoring.yaml").read_text())}
    assert set(objects) == {"PrometheusRule", "PodMonitor", "ConfigMap"}
    assert objects["PrometheusRule"]["metadata"]["namespace"] == "serving"
    alerts = _by_name(objects["PrometheusRule"]["spec"]["groups"])
    assert alerts["TargetDown"]["expr"].startswith('up{job="llama70"}') and "PrefixCacheHitRatioLow" not in alerts
    cm = objects["ConfigMap"]
    gpu = next(p for p in json.loads(cm["data"]["llama70-trtllm.json"])["panels"] if p["title"] == "GPU utilization")
    assert gpu["targets"][0]["expr"] == 'DCGM_FI_DEV_GPU_UTIL{namespace="serving",pod=~"llama70-.+"}'
    assert "--metrics-config=histogram_latencies=true" in yaml.safe_load_all((out / "serving.yaml").read_text()) \
        .__next__()["data"]["rank.sh"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(cm["data"]["llama70-trtllm.json"])
    assert board == json.loads((out / "dashboard.json").read_text()) and board["uid"] == "trtllm-llama70"


def _server_pod(serving: list[dict]) -> tuple[dict[str, str], dict]:
    """(labels, pod spec) of the pod that serves metrics: the Deployment's, or the LeaderWorkerSet leader's with
    the set's name label its controller adds."""
    by_kind = {o["kind"]: o for o in serving}
    if "Deployment" in by_kind:
        template = by_kind["Deployment"]["spec"]["template"]
        return template["metadata"]["labels"], template["spec"]
    lws = by_kind["LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    return {**template["metadata"]["labels"], LWS_NAME_LABEL: lws["metadata"]["name"]}, template["spec"]


@pytest.mark.parametrize("precision,serving_kind", [("fp8", "Deployment"), ("bf16", "LeaderWorkerSet")])
def test_pod_monitor_scrapes_exactly_the_serving_pod_as_the_rules_job(tmp_path, precision, serving_kind):
    out = tmp_path / precision
    deploy_command(resolve_spec(model="llama-405b", precision=precision), platform="k8s", pipeline_image=PIPELINE_IMAGE,
                   release_url=URL,
                   output=str(out), name="big", namespace="serving")
    serving = list(yaml.safe_load_all((out / "serving.yaml").read_text()))
    assert serving_kind in {o["kind"] for o in serving}
    monitoring = {o["kind"]: o for o in yaml.safe_load_all((out / "monitoring.yaml").read_text())}
    monitor = monitoring["PodMonitor"]
    validate_object(monitor)
    assert monitor["metadata"]["namespace"] == "serving"  # its own namespace: the pods' (no namespaceSelector)
    labels, pod = _server_pod(serving)
    assert monitor["spec"]["selector"] == {"matchLabels": labels}
    if serving_kind == "LeaderWorkerSet":  # the workers serve nothing: their role label keeps them out
        worker = next(o for o in serving if o["kind"] == serving_kind)["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        assert worker["metadata"]["labels"]["role"] != labels["role"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    assert ports[endpoint["port"]] == 8002 and endpoint["path"] == "/metrics"
    assert endpoint["relabelings"] == [{"action": "replace", "targetLabel": "job", "replacement": "big"}]
    assert all('job="big"' in r["expr"] for r in _by_name(monitoring["PrometheusRule"]["spec"]["groups"]).values())


def test_pod_monitor_fits_the_operator_crd_and_a_wrong_field_is_refused():
    obj = pod_monitor("llama70", namespace="serving", labels={}, pod_selector={"role": "leader"}, port="metrics")
    validate_object(obj)
    bad = copy.deepcopy(obj)
    bad["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["action"] = "rename"
    with pytest.raises(DeployError, match="PodMonitor llama70-trtllm fails the monitoring.coreos.com/v1 CRD"):
        validate_object(bad)
    bad = copy.deepcopy(obj)
    bad["spec"]["podMetricsEndpoints"][0]["portName"] = "metrics"  # strict: not a PodMetricsEndpoint field
    with pytest.raises(DeployError, match="podMetricsEndpoints.0"):
        validate_object(bad)


def test_slurm_deploy_writes_a_plain_rules_file_and_a_scrape_config(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8")
    out = tmp_path / "slurm"
    deploy_command(spec, platform="slurm", release_url=URL, output=str(out), name="llama70")
    groups = yaml.safe_load((out / "prometheus-rules.yml").read_text())["groups"]
    assert [g["name"] for g in groups] == ["llama70.trtllm.recording", "llama70.trtllm.alerts"]
    assert (out / "dashboard.json").is_file()
    scrape = yaml.safe_load((out / "prometheus-scrape.yml").read_text())
    assert scrape == {"scrape_configs": [{
        "job_name": "llama70", "honor_labels": True, "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [str(out / "prometheus-targets.json")]}]}]}
    assert f"targets={out}/prometheus-targets.json" in (out / "serve.sbatch").read_text().splitlines()


def test_slurm_directory_prometheus_cannot_glob_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "node[1]"
    with pytest.raises(DeployError, match="glob pattern") as exc:
        deploy_command(resolve_spec(model="llama-70b", precision="fp8"), platform="slurm", release_url=URL,
                       output=str(out), name="llama70")
    assert exc.value.exit_code == 2 and not out.exists()


@pytest.mark.parametrize("runtime,serve_mode", [("pytorch", None), ("engine", "trtllm-serve")])
def test_trtllm_serve_is_watched_through_its_prometheus_route(tmp_path, runtime, serve_mode):
    """trtllm-serve 1.2's `/metrics` is JSON: the scrape reads `/prometheus/metrics` on the HTTP port, and the rules
    read its `trtllm_*` families (no failure, token or queue-length counters: no such alerts)."""
    spec = resolve_spec(model="llama-8b", precision="fp8", runtime=runtime)
    deploy_command(spec, platform="slurm", release_url=URL, output=str(tmp_path / "s"), name="pt",
                   serve_mode=serve_mode)
    scrape = yaml.safe_load((tmp_path / "s" / "prometheus-scrape.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/prometheus/metrics"
    assert '"$(hostname)" 8000 ' in (tmp_path / "s" / "serve.sbatch").read_text()  # the target is the HTTP port
    by = _by_name(yaml.safe_load((tmp_path / "s" / "prometheus-rules.yml").read_text())["groups"])
    assert set(by) == {rules.HIT_RATIO, rules.QUEUE_US, rules.KV_USED, rules.REQUEST_RATE, rules.TTFT_P99, rules.TPOT,
                       "TargetDown", "TTFTP99AboveSLO", "TPOTAboveSLO", "QueueTimeHigh"}
    assert "trtllm_time_to_first_token_seconds_bucket" in by[rules.TTFT_P99]["expr"]
    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(tmp_path / "k"),
                   name="pt",
                   serve_mode=serve_mode)
    monitor = next(o for o in yaml.safe_load_all((tmp_path / "k" / "monitoring.yaml").read_text())
                   if o["kind"] == "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/prometheus/metrics")
    ports = {p["name"] for o in yaml.safe_load_all((tmp_path / "k" / "serving.yaml").read_text())
             if o["kind"] in ("Deployment", "LeaderWorkerSet")
             for c in _server_pod([o])[1]["containers"] for p in c.get("ports", [])}
    assert "http" in ports


def test_monitoring_labels_reach_every_monitoring_object(tmp_path):
    out = tmp_path / "k"
    deploy_command(resolve_spec(model="llama-70b", precision="fp8"), platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(out),
                   name="llama70", monitoring_label=["release=kube-prometheus-stack", "example.com/team=infer"])
    objects = list(yaml.safe_load_all((out / "monitoring.yaml").read_text()))
    assert {o["kind"] for o in objects} == {"PrometheusRule", "PodMonitor", "ConfigMap"}
    for o in objects:
        assert o["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert o["metadata"]["labels"]["example.com/team"] == "infer"
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == "llama70"


@pytest.mark.parametrize("label,fix", [("release", "KEY=VALUE"), ("Bad Key=x", "KEY=VALUE"),
                                       ("release=-x", "KEY=VALUE"), (f"k={'v' * 64}", "KEY=VALUE"),
                                       ("UPPER_/k=v", "KEY=VALUE"), ("app.kubernetes.io/name=x", "sets that label")])
def test_bad_monitoring_label_is_exit_2_with_the_fix(tmp_path, label, fix):
    with pytest.raises(DeployError, match=fix) as exc:
        deploy_command(resolve_spec(model="llama-70b", precision="fp8"), platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL,
                       output=str(tmp_path / "k"), name="llama70", monitoring_label=[label])
    assert exc.value.exit_code == 2 and not (tmp_path / "k").exists()
    with pytest.raises(DeployError, match="--platform k8s"):
        deploy_command(resolve_spec(model="llama-70b", precision="fp8"), platform="slurm", release_url=URL,
                       output=str(tmp_path / "s"), name="llama70", monitoring_label=["release=x"])


def test_prefix_alert_follows_the_declared_traffic_or_the_flag(tmp_path):
    from pipeline.core.spec import PlannedTraffic, ServingTarget

    spec = resolve_spec(model="llama-70b", precision="fp8")
    shared = spec.model_copy(update={"serving_target": ServingTarget(
        ttft_ms=400.0, tpot_ms=30.0, traffic=PlannedTraffic(input_len=2048, output_len=128, prefix_share=0.7))})
    by = _by_name(rule_groups(watch_plan(shared, deployment="x", gpus=4)))
    assert by["PrefixCacheHitRatioLow"]["expr"].endswith("< 0.7")
    assert by["TTFTP99AboveSLO"]["expr"].endswith("> 400") and by["TPOTAboveSLO"]["expr"].endswith("> 30")
    assert "the SLO" in by["TPOTAboveSLO"]["annotations"]["summary"]
    distinct = shared.model_copy(update={"serving_target": shared.serving_target.model_copy(update={
        "traffic": PlannedTraffic(input_len=2048, output_len=128)})})
    assert "PrefixCacheHitRatioLow" not in _by_name(rule_groups(watch_plan(distinct, deployment="x", gpus=4)))
    out = tmp_path / "s"
    deploy_command(spec, platform="slurm", release_url=URL, output=str(out), name="x", prefix_cache_alert=True)
    assert "PrefixCacheHitRatioLow" in _by_name(yaml.safe_load((out / "prometheus-rules.yml").read_text())["groups"])


def test_the_break_even_alert_is_the_spec_modes_and_names_it():
    spec = resolve_spec(model="llama-70b", precision="fp8", draft="auto", tp=4)
    w = watch_plan(spec, deployment="llama70", gpus=4)
    alert = _by_name(rule_groups(w))["SpeculationBelowBreakEven"]
    assert w.speculation_mode == "draft-target" and w.speculation_note == ""
    assert alert["expr"].endswith(f"< {speculation_break_even(spec).acceptance:g}")
    assert "draft-target draft acceptance below the planner's draft-target break-even" in \
        alert["annotations"]["summary"]


@pytest.mark.parametrize("spec_kw,source", [
    (dict(model="llama3.3-70b", draft="auto", speculative_decoding="eagle3"), "trtllm-serve"),
    (dict(model="llama-70b", speculative_decoding="ngram"), "trtllm-serve"),
    (dict(model="llama-70b", draft="auto"), "trtllm-serve"),
    (dict(model="tiny-llama", draft="auto", target="reference"), "triton"),  # the llmapi reference on Triton
])
def test_llm_api_speculation_has_no_acceptance_series_so_no_alert_and_the_rules_say_why(spec_kw, source):
    """TensorRT-LLM 1.2.1's LLM API exports no draft-token series (trtllm-serve's collector has none; the Triton
    llmapi model answers acceptance_rate per response): no acceptance rule, and the rules file names the mode and
    its break-even instead."""
    spec = resolve_spec(precision="fp8", runtime="pytorch", **spec_kw)
    w = watch_plan(spec, deployment="pt", gpus=4, source=source)
    by = _by_name(rule_groups(w))
    assert w.acceptance_min is None and "SpeculationBelowBreakEven" not in by and rules.ACCEPTANCE not in by
    even = speculation_break_even(spec)
    mode = spec.speculation_mode
    assert w.speculation_note.startswith(f"{mode} acceptance is not watched")
    assert f"break-even is {even.acceptance:.0%} per drafted token at batch {even.batch}" in w.speculation_note
    text = rules.rules_file(w)
    assert text.startswith(f"# {w.speculation_note}\n") and yaml.safe_load(text)["groups"] == rule_groups(w)
    plain = watch_plan(resolve_spec(model="llama-70b", precision="fp8", runtime="pytorch"), deployment="pt", gpus=4,
                       source=source)
    assert plain.speculation_note == "" and not rules.rules_file(plain).startswith("#")
