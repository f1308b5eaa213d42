"""The monitoring rules on Debian's Prometheus: `promtool check rules` and `promtool test rules` (input series that
fire each alert and series that do not), `promtool check config` on a prometheus.yml made of Slurm deploy's rules and
scrape snippet, then a live Prometheus scraping the CPU reference server through a file_sd target file shaped like
the one serve.sbatch writes (the deploy snippet's scrape config) while `bench`
drives the shared-prefix and the no-shared-prefix workloads: the recorded hit ratio says which workload ran, and
the hit-ratio alert fires only without the shared prefix. The reference server exports every metric family and
label of the C++ tensorrtllm backend (tests/support/cpp_metrics_table.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cpp_metrics_table import CPP_FAMILIES
from tests.support.prometheus import Prometheus, ensure_prometheus, promtool

pytestmark = pytest.mark.slow
JOB = "tiny"
PREFIX = 192  # 6 blocks of the tiny build's 32 tokens
PNG_ENV = "PIPELINE_DASHBOARD_PNG"  # write the dashboard picture here (README's docs/dashboard.png)


@pytest.fixture(scope="module")
def prometheus_installed():
    ensure_prometheus()


def _plan(**kw):
    from pipeline.core.spec import resolve_spec
    from pipeline.ops.monitoring.rules import watch_plan

    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference")
    return watch_plan(spec, deployment=JOB, gpus=1, prefix_alert=True, **kw)


def _write_rules(directory: Path, w) -> Path:
    from pipeline.ops.monitoring.rules import rules_file

    path = directory / "rules.yml"
    path.write_text(rules_file(w))
    return path


# ------------------------------------------------------------------------------------------------ promtool
def _series(w, *, hit: float, queue_factor: float, accepted: float, cost_factor: float, fail: float,
            ttft_factor: float, tpot_factor: float, waiting: str, up: str) -> list[dict]:
    """Input series (one sample a minute) putting each watched quantity at the given level: `fail` the share of
    failed requests, `*_factor` multiples of the alert limits, `waiting` and `up` promtool value strings."""
    sel = f'job="{JOB}",model="tensorrt_llm",version="1"'
    bls = f'job="{JOB}",model="tensorrt_llm_bls",version="1"'
    prompt_per_min = 3200
    queue_us = w.queue_ms_max * 1000 * queue_factor
    tok_s = w.usd_per_second * 1e6 / (w.cost_per_1m_plan * 2.0 * cost_factor)
    ttft_ms = w.ttft_ms_max * ttft_factor  # every request's first response takes this long
    le_below, le_above = ttft_ms / 2, ttft_ms * 2  # buckets around it: p99 interpolates inside (le_below, le_above]
    infer_us = w.tpot_ms_max * tpot_factor * 1000 * tok_s * 60 / 10  # per request: output tokens x TPOT
    return [
        {"series": f'up{{job="{JOB}",instance="node-1:8002"}}', "values": up},
        {"series": f'nv_trt_llm_kv_cache_block_metrics{{{sel},kv_cache_block_type="reused"}}',
         "values": f"0+{prompt_per_min * hit / 32:g}x60"},
        {"series": f'nv_trt_llm_kv_cache_block_metrics{{{sel},kv_cache_block_type="tokens_per"}}',
         "values": "32x60"},
        {"series": f'nv_trt_llm_kv_cache_block_metrics{{{sel},kv_cache_block_type="fraction"}}', "values": "0.5x60"},
        {"series": f'nv_llm_input_token_len_sum{{{sel},response_metric_type="total_input_tokens"}}',
         "values": f"0+{prompt_per_min}x60"},
        {"series": f"nv_inference_queue_duration_us{{{sel}}}", "values": f"0+{queue_us * 10:g}x60"},
        {"series": f"nv_inference_request_success{{{sel}}}", "values": "0+10x60"},
        {"series": f'nv_inference_request_failure{{{sel},reason="BACKEND"}}',
         "values": f"0+{10 * fail / (1 - fail):g}x60"},
        {"series": f'nv_inference_first_response_histogram_ms_bucket{{{sel},le="{le_below:g}"}}', "values": "0x60"},
        {"series": f'nv_inference_first_response_histogram_ms_bucket{{{sel},le="{le_above:g}"}}',
         "values": "0+10x60"},
        {"series": f'nv_inference_first_response_histogram_ms_bucket{{{sel},le="+Inf"}}', "values": "0+10x60"},
        {"series": f"nv_inference_compute_infer_duration_us{{{sel}}}", "values": f"0+{infer_us * 10:g}x60"},
        {"series": f'nv_trt_llm_request_metrics{{{sel},request_type="waiting"}}', "values": waiting},
        {"series": f'nv_llm_output_token_len_sum{{{sel},response_metric_type="total_output_tokens"}}',
         "values": f"0+{tok_s * 60:g}x60"},
        {"series": f'nv_trt_llm_speculation_draft_tokens{{{bls},draft_token_type="proposed"}}',
         "values": "0+100x60"},
        {"series": f'nv_trt_llm_speculation_draft_tokens{{{bls},draft_token_type="accepted"}}',
         "values": f"0+{100 * accepted:g}x60"},
    ]


def _expected(w, alert: str, firing: bool) -> dict:
    from pipeline.ops.monitoring.rules import rule_groups

    rule = next(r for g in rule_groups(w) for r in g["rules"] if r.get("alert") == alert)
    labels = {**rule["labels"], "job": JOB}
    if alert == "CostPerTokenAbovePlan":  # the recorded cost series carries its basis
        labels |= {"gpus": str(w.gpus), "usd_per_gpu_hour": f"{w.gpu_price_per_hour:g}"}
    if alert == "TargetDown":  # `up == 0` keeps the target's instance
        labels |= {"instance": "node-1:8002"}
    exp = [{"exp_labels": labels, "exp_annotations": rule["annotations"]}] if firing else []
    return {"eval_time": "40m", "alertname": alert, "exp_alerts": exp}


ALERTS = ("TargetDown", "RequestFailureRatioHigh", "QueueGrowing", "TTFTP99AboveSLO", "TPOTAboveSLO",
          "QueueTimeHigh", "PrefixCacheHitRatioLow", "SpeculationBelowBreakEven", "CostPerTokenAbovePlan")
RULES = 20  # 11 recording + 9 alerting (prefix alert on)


def _tests(w, rules: Path) -> dict:
    """promtool's unit tests: the bad series fire every alert, the healthy ones none, and a scrape target that
    vanished fires TargetDown through `absent(up)`."""
    bad = _series(w, hit=0.25, queue_factor=3, accepted=w.acceptance_min / 2, cost_factor=4, fail=0.2,
                  ttft_factor=3, tpot_factor=3, waiting="1+1x60", up="0x60")
    good = _series(w, hit=0.9, queue_factor=0.1, accepted=min(1.0, (1 + w.acceptance_min) / 2), cost_factor=0.25,
                   fail=0.0, ttft_factor=0.25, tpot_factor=0.25, waiting="0 3 0 2 0x57", up="1x60")
    gone = [s for s in good if not s["series"].startswith("up{")]
    hit = f'trtllm:prefix_cache_hit_ratio{{job="{JOB}"}}'
    ratio = f'trtllm:request_failure_ratio{{job="{JOB}"}}'
    down = _expected(w, "TargetDown", True)
    down["exp_alerts"][0]["exp_labels"].pop("instance")  # absent(up{job=...}) carries the job only
    return {"rule_files": [rules.name], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": bad,
                       "alert_rule_test": [_expected(w, a, True) for a in ALERTS],
                       "promql_expr_test": [{"expr": hit, "eval_time": "40m",
                                             "exp_samples": [{"labels": hit, "value": 0.25}]},
                                            {"expr": ratio, "eval_time": "40m",
                                             "exp_samples": [{"labels": ratio, "value": 0.2}]}]},
                      {"interval": "1m", "input_series": good,
                       "alert_rule_test": [_expected(w, a, False) for a in ALERTS]},
                      {"interval": "1m", "input_series": gone, "alert_rule_test": [down]}]}


def test_promtool_checks_the_rules_and_each_alert_fires_only_on_its_condition(prometheus_installed, tmp_path):
    w = _plan()
    assert w.acceptance_min is not None and w.cost_per_1m_plan is not None and w.hit_ratio_min is not None
    rules = _write_rules(tmp_path, w)
    res = promtool("check", "rules", str(rules), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {RULES} rules found" in res.stdout, res.stdout
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(_tests(w, rules), sort_keys=False))
    res = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_test_fails_when_a_healthy_series_is_expected_to_fire(prometheus_installed, tmp_path):
    """The harness can fail: expecting TTFTP99AboveSLO on the healthy series is reported as a failed test."""
    w = _plan()
    rules = _write_rules(tmp_path, w)
    tests = _tests(w, rules)
    tests["tests"][1]["alert_rule_test"] = [_expected(w, "TTFTP99AboveSLO", True)]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    res = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert res.returncode != 0 and "TTFTP99AboveSLO" in res.stdout + res.stderr, res.stdout + res.stderr


def _serve_series(w, *, ttft_s: float, tpot_s: float, queue_s: float, hit: float) -> list[dict]:
    """trtllm-serve's own families (1.2 MetricsCollector labels), 10 requests a minute at the given latencies."""
    lab = f'job="{JOB}",instance="node-1:8000",model_name="undefined",engine_type="undefined"'
    out = [{"series": f'up{{job="{JOB}",instance="node-1:8000"}}', "values": "1x60"},
           {"series": f'trtllm_request_success_total{{{lab},finished_reason="stop"}}', "values": "0+10x60"},
           {"series": f"trtllm_kv_cache_hit_rate{{{lab}}}", "values": f"{hit:g}x60"},
           {"series": f"trtllm_kv_cache_utilization{{{lab}}}", "values": "0.4x60"}]
    for family, value in (("time_to_first_token", ttft_s), ("time_per_output_token", tpot_s),
                          ("request_queue_time", queue_s)):
        name = f"trtllm_{family}_seconds"
        out += [{"series": f'{name}_bucket{{{lab},le="{value / 2:g}"}}', "values": "0x60"},
                {"series": f'{name}_bucket{{{lab},le="{value * 2:g}"}}', "values": "0+10x60"},
                {"series": f'{name}_bucket{{{lab},le="+Inf"}}', "values": "0+10x60"},
                {"series": f"{name}_sum{{{lab}}}", "values": f"0+{10 * value:g}x60"},
                {"series": f"{name}_count{{{lab}}}", "values": "0+10x60"}]
    return out


def test_promtool_trtllm_serve_rules_fire_on_its_own_metric_names(prometheus_installed, tmp_path):
    w = _plan(source="trtllm-serve")
    rules = _write_rules(tmp_path, w)
    alerts = ("TTFTP99AboveSLO", "TPOTAboveSLO", "QueueTimeHigh", "PrefixCacheHitRatioLow")
    bad = _serve_series(w, ttft_s=w.ttft_ms_max * 3 / 1000, tpot_s=w.tpot_ms_max * 3 / 1000,
                        queue_s=w.queue_ms_max * 3 / 1000, hit=w.hit_ratio_min / 2)
    good = _serve_series(w, ttft_s=w.ttft_ms_max / 4000, tpot_s=w.tpot_ms_max / 4000, queue_s=w.queue_ms_max / 4000,
                         hit=min(1.0, w.hit_ratio_min * 1.5))
    tests = {"rule_files": [rules.name], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": bad,
                        "alert_rule_test": [_expected(w, a, True) for a in alerts]},
                       {"interval": "1m", "input_series": good,
                        "alert_rule_test": [_expected(w, a, False) for a in (*alerts, "TargetDown")]}]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    res = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_rejects_a_broken_rule(prometheus_installed, tmp_path):
    path = tmp_path / "rules.yml"
    groups = yaml.safe_load(_write_rules(tmp_path, _plan()).read_text())
    groups["groups"][0]["rules"][0]["expr"] = "sum by (job) (rate(x[15m])"  # unbalanced
    path.write_text(yaml.safe_dump(groups))
    res = promtool("check", "rules", str(path), cwd=tmp_path)
    assert res.returncode != 0 and "unclosed left parenthesis" in res.stdout + res.stderr


def _targets_file(directory: Path, host: str) -> Path:
    """A file_sd file as serve.sbatch writes it (tests/ops/deploy/test_slurm_scripts.py runs that line)."""
    path = directory / "prometheus-targets.json"
    path.write_text(json.dumps([{"targets": [host], "labels": {"job": JOB}}]) + "\n")
    return path


def test_promtool_checks_a_config_of_the_slurm_rules_and_scrape_snippet(prometheus_installed, tmp_path):
    from pipeline.cli.commands import deploy_command
    from pipeline.core.spec import resolve_spec

    out = tmp_path / "slurm"
    spec = resolve_spec(model="llama-70b", precision="fp8", draft="auto")
    deploy_command(spec, platform="slurm", release_url="https://h.invalid/r.tar.gz", output=str(out), name=JOB)
    _targets_file(out, "node-1:8002")
    scrape = yaml.safe_load((out / "prometheus-scrape.yml").read_text())["scrape_configs"]
    config = {"global": {"scrape_interval": "15s"}, "rule_files": [str(out / "prometheus-rules.yml")],
              "scrape_configs": scrape}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    res = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 1 rule files found" in res.stdout and "SUCCESS: 19 rules found" in res.stdout, res.stdout
    (out / "prometheus-targets.json").write_text('[{"targets": "node-1:8002"}]')  # not a list of targets
    res = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert res.returncode != 0 and "checking SD file" in res.stdout + res.stderr, res.stdout + res.stderr


# ------------------------------------------------------------------------------------------------ live
@pytest.fixture(scope="module")
def watched(prometheus_installed, tiny_reference_repo, tmp_path_factory):
    """The tiny reference repo served by tritonserver, scraped by Prometheus every second through deploy's Slurm
    scrape config and a file_sd target file, with the deploy rules (rates over 20 s, alerts after 10 s: the plan's
    documented test parameters; 10 s outlasts the low ratio at the start of a shared-prefix run, while its first
    prompts are still cold)."""
    from pipeline.ops.monitoring.scrape import scrape_config
    from pipeline.serving.serve import TritonServer

    repo = tiny_reference_repo("watch")
    d = tmp_path_factory.mktemp("prometheus")
    w = _plan(timing=("20s", "10s"))
    with TritonServer(repo, ready_timeout_s=300) as server:
        host = server.metrics_url.split("//", 1)[1].split("/", 1)[0]
        scrape = scrape_config(JOB, str(_targets_file(d, host)))
        prom = Prometheus(d, scrape_configs=[scrape], rules=_write_rules(d, w)).start()
        try:
            deadline = time.monotonic() + 30
            while not prom.targets_up() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert prom.targets_up(), prom.api("targets")
            assert [t["labels"]["job"] for t in prom.api("targets")["activeTargets"]] == [JOB]
            yield repo, server, prom, w
        finally:
            prom.stop()


def _bench(repo, server, share: float, model: str = "ensemble", requests: int = 12):
    from pipeline.serving.bench import ServerUrls, SweepOptions, WorkloadOptions, run_bench, tokenizer_dir_of

    report = run_bench(ServerUrls(server.grpc_url),
                       WorkloadOptions(max_tokens=4, concurrency=[2], requests_per_level=requests,
                                       shared_prefix_tokens=PREFIX, shared_prefix_share=share),
                       sweep=SweepOptions(model=model), tokenizer_dir=tokenizer_dir_of(repo))
    assert report.failed == 0, report.notes
    return report


def _settle(prom, expr: str, ok, timeout_s: float = 15) -> float | None:
    """Poll `expr` until `ok(value)` (rules are evaluated every second) or the timeout; the last value."""
    deadline = time.monotonic() + timeout_s
    value = prom.value(expr)
    while not ok(value) and time.monotonic() < deadline:
        time.sleep(1)
        value = prom.value(expr)
    return value


def test_reference_server_exports_the_cpp_backend_families(watched):
    _, _, prom, _ = watched
    for family, label, values in CPP_FAMILIES:
        series = prom.api("series", **{"match[]": f'{family}{{job="{JOB}",model="tensorrt_llm"}}'})
        found = {s.get(label) for s in series}
        assert set(values) <= found, (family, label, sorted(found - {None}))


def test_hit_ratio_alert_fires_only_without_the_shared_prefix(watched, tmp_path):
    repo, server, prom, w = watched
    ratio = f'trtllm:prefix_cache_hit_ratio{{job="{JOB}"}}'
    start = time.time()
    _bench(repo, server, share=1.0)
    shared = _settle(prom, ratio, lambda v: v is not None and 0.6 < v < 1.0)  # 1.0: clamped, a cut burst
    assert shared is not None and 0.6 < shared < 1.0, shared
    alert = "PrefixCacheHitRatioLow"
    deadline = time.monotonic() + 15
    while prom.alert_states(alert) and time.monotonic() < deadline:
        time.sleep(1)
    assert not prom.alert_states(alert)
    fired = f'max_over_time(ALERTS{{alertname="{alert}",alertstate="firing"}}[{int(time.time() - start) + 2}s])'
    assert prom.value(fired) is None  # never fired during the shared-prefix run
    assert prom.value(f'trtllm:output_tokens_per_s{{job="{JOB}"}}') > 0
    cost = prom.value(f'trtllm:cost_usd_per_1m_output_tokens{{job="{JOB}"}}')
    assert cost is not None and cost > 0
    time.sleep(21)  # the shared-prefix requests leave the 20 s window
    _bench(repo, server, share=0.0)
    distinct = _settle(prom, ratio, lambda v: v is not None and v < 0.1)
    assert distinct is not None and distinct < 0.1, distinct
    deadline = time.monotonic() + 30
    while "firing" not in prom.alert_states(alert) and time.monotonic() < deadline:
        time.sleep(1)
    assert prom.alert_states(alert) == {"firing"}
    _bench(repo, server, share=1.0, model="tensorrt_llm_bls", requests=4)  # draft-target: the acceptance series
    accepted = _settle(prom, f'trtllm:speculation_acceptance{{job="{JOB}"}}', lambda v: v is not None)
    assert accepted is not None and 0.0 <= accepted <= 1.0, accepted
    time.sleep(5)  # a few more evaluations of the acceptance series for the picture
    print(f"\nhit ratio (Prometheus, 20 s window): shared prefix {shared:.2f}, distinct prefixes {distinct:.2f}; "
          f"draft acceptance {accepted:.2f}")
    from pipeline.ops.monitoring.picture import render_dashboard

    png = render_dashboard(w, prometheus_url=prom.url, start=start - 5, end=time.time(),
                           path=Path(os.environ.get(PNG_ENV) or tmp_path / "dashboard.png"))
    assert png is None or png.read_bytes()[:4] == b"\x89PNG"
