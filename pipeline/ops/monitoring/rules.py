"""Prometheus recording and alert rules for one deployment, as data (`yaml.safe_dump`), thresholds from the spec and
the planner: what it costs (hit ratio, speculation, $ per token) and whether it works (target up, failures, TTFT p99,
TPOT, queue).

Triton deployments (`source="triton"`): every series is one the C++ tensorrtllm backend (TensorRT-LLM 1.2.1,
`custom_metrics_reporter.cc`) or Triton core exports, and the CPU reference backend exports them under the same names
and labels, so the rules read both; all select `model="tensorrt_llm"` (every request reaches it):

- prefix-cache hit ratio: prompt tokens served from the cache / prompt tokens, over the window:
  increase of `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused"}` (blocks reused since load) x
  `tokens_per` / increase of `nv_llm_input_token_len_sum` (the per-request prompt-length histogram);
- speculation acceptance: accepted / proposed draft tokens of the draft-target BLS model
  (`nv_trt_llm_speculation_draft_tokens`), the alert's threshold the planner's break-even of the spec's mode;
- mean queue time: Triton's `nv_inference_queue_duration_us` / `nv_inference_request_success`;
- output tokens/s: rate of `nv_llm_output_token_len_sum`, and from it $ per 1M output tokens at the deployment's
  GPUs x $/GPU-hour;
- requests/s and the failure ratio: `nv_inference_request_failure` / (failures + `nv_inference_request_success`);
- TTFT p99: Triton's `nv_inference_first_response_histogram_ms` (exported with `--metrics-config
  histogram_latencies=true`, which the launch plan passes);
- TPOT: `nv_inference_compute_infer_duration_us` per output token, a mean that includes prefill (an upper bound);
- waiting requests: `nv_trt_llm_request_metrics{request_type="waiting"}`; the queue grows when it never empties
  over the window and its slope is positive.

trtllm-serve deployments (`source="trtllm-serve"`): TensorRT-LLM 1.2's `/metrics` route is JSON iteration stats, not
Prometheus; its Prometheus text is `/prometheus/metrics`, mounted only with `return_perf_metrics: true` in the LLM-API
options (deploy writes it), from `tensorrt_llm/metrics/collector.py` (`MetricsCollector`, 1.2-era: prefix `trtllm_`,
labels `model_name`, `engine_type`): `trtllm_request_success_total{finished_reason}`, the histograms
`trtllm_time_to_first_token_seconds`, `trtllm_time_per_output_token_seconds`, `trtllm_request_queue_time_seconds`,
`trtllm_e2e_request_latency_seconds`, and the gauges `trtllm_kv_cache_hit_rate`, `trtllm_kv_cache_utilization`
(`tensorrt_llm/serve/openai_server.py`, `mount_metrics`). It counts no failed requests, no tokens and no waiting
requests, so those deployments get no failure-ratio, cost or queue-growth alert.

Speculation on the LLM API (runtime pytorch: eagle3, ngram, draft-target) exports no draft-token series in 1.2.1:
trtllm-serve's collector has none (its `trtllm_spec_decode_*` counters came after 1.2, TensorRT-LLM PR #12545), and
the Triton llmapi model answers `acceptance_rate` per response, no metric. Those deployments get no acceptance
watch; the rules file says so with the mode's break-even (`WatchPlan.speculation_note`), to compare with `invoke
bench`'s measured acceptance.

Every rule selects on `job="<deployment name>"`, the label `scrape.py`'s PodMonitor and file_sd config give the
deployment's metrics. Latency limits: the spec's `serving_target` SLO, else the planner's estimate x `LATENCY_MARGIN`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import yaml

from pipeline.core.gpus import gpu_price
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.planning.break_even import speculation_break_even
from pipeline.planning.fleet import traffic_routing
from pipeline.planning.perf_model import HIT_RATIO_WARNING
from pipeline.planning.planner import CapacityPlan, plan_capacity

Source = Literal["triton", "trtllm-serve"]
TARGET_MODEL = "tensorrt_llm"
BLS_MODEL = "tensorrt_llm_bls"
PREFIX = "trtllm"  # recorded series: trtllm:<what>
HIT_RATIO = f"{PREFIX}:prefix_cache_hit_ratio"
ACCEPTANCE = f"{PREFIX}:speculation_acceptance"
QUEUE_US = f"{PREFIX}:queue_time_us:mean"
OUTPUT_TOK_S = f"{PREFIX}:output_tokens_per_s"
COST = f"{PREFIX}:cost_usd_per_1m_output_tokens"
KV_USED = f"{PREFIX}:kv_cache_used_fraction"
REQUEST_RATE = f"{PREFIX}:requests_per_s"
ERROR_RATIO = f"{PREFIX}:request_failure_ratio"
TTFT_P99 = f"{PREFIX}:ttft_ms:p99"
TPOT = f"{PREFIX}:tpot_ms:mean"
WAITING = f"{PREFIX}:waiting_requests"
COST_ALERT_FACTOR = 2.0  # the cost alert fires above this multiple of the planner's estimate
LATENCY_MARGIN = 2.0  # without a serving_target SLO, latency alerts fire above this multiple of the plan's estimate
ERROR_RATIO_MAX = 0.05  # the failure alert fires above this share of failed requests


@dataclass(frozen=True)
class WatchPlan:
    """What the rules and the dashboard watch, and their thresholds.

    `window` (range of every rate, default 15m) and `alert_for` (how long a condition holds before its alert
    fires, default 15m) are parameters so that a test can evaluate the same rules in seconds; deployments keep
    the defaults.
    """

    deployment: str  # the scrape job's name
    gpus: int  # of every replica together
    gpu_price_per_hour: float
    gpu_price_source: str
    hit_ratio_min: float | None  # None: no hit-ratio alert (the traffic declares no shared prefix)
    queue_ms_max: float  # the SLO's TTFT, else the planner's estimate: requests queue longer than a whole TTFT
    ttft_ms_max: float  # TTFT p99 limit: the SLO's, else the planner's estimate x LATENCY_MARGIN
    tpot_ms_max: float  # likewise for TPOT
    latency_basis: str  # where the latency limits come from (alert text)
    acceptance_min: float | None = None  # the spec's mode's break-even, where a draft-token series is exported
    speculation_mode: str | None = None  # draft-target, eagle3, ngram or None
    speculation_note: str = ""  # why a speculating deployment's acceptance is not watched ("" when it is, or none)
    cost_per_1m_plan: float | None = None  # what the plan paid for (the spec's serving_target), else the planner's
    source: Source = "triton"  # which server's metrics the rules read
    gpu_selector: str = ""  # DCGM exporter labels of the deployment's GPUs (empty: every GPU it reports)
    window: str = "15m"
    alert_for: str = "15m"
    hit_ratio_basis: str = ""  # with replicas: the fleet expectation the hit-ratio floor is ("" for one server)

    @property
    def selector(self) -> str:
        return f'job="{self.deployment}"'

    @property
    def usd_per_second(self) -> float:
        return self.gpus * self.gpu_price_per_hour / 3600.0


def watch_plan(spec: BuildSpec, *, deployment: str, gpus: int, source: Source = "triton", prefix_alert: bool = False,
               gpu_selector: str = "", router: str = "round-robin", timing: tuple[str, str] = ("15m", "15m")
               ) -> WatchPlan:
    """Thresholds for `spec` served as `deployment` on `gpus` GPUs (all replicas): the spec's GPU price and the
    planner's speculation break-even; with the spec's `serving_target`, the latency limits are its SLO, the queue
    limit its TTFT, the cost plan its estimate (else the planner's at the traffic's lengths); without one, the
    planner's estimates at the default request lengths (1024 + 256), latency x LATENCY_MARGIN. The hit-ratio alert
    only where shared prefixes are expected: the traffic's prefix share (its floor) when > 0, with replicas the
    fleet's expectation at it behind `router` (`hit_ratio_floor`), else with `prefix_alert` (bench's warning
    level). `timing`: the rate window and how long a condition holds before it fires. trtllm-serve
    exports no token or draft counters: no cost or speculation watch, and neither does the LLM API
    (`acceptance_watch`)."""
    target = spec.serving_target
    price = gpu_price(spec.hardware.gpu, spec.hardware.gpu_price_per_hour)
    even = speculation_break_even(spec)
    watched, unwatched = acceptance_watch(spec, source)
    if target is None:
        plan = plan_capacity(spec)
        queue_ms, cost = plan.ttft_ms_estimate, plan.cost_per_1m_output_tokens_usd
        ttft, tpot = plan.ttft_ms_estimate * LATENCY_MARGIN, plan.tpot_ms_estimate * LATENCY_MARGIN
        basis, share = f"{LATENCY_MARGIN:g}x the plan's estimate", 0.0
    else:
        t = target.traffic
        plan = plan_capacity(spec, input_len=t.input_len, output_len=t.output_len, prefix_hit_ratio=t.prefix_share,
                             acceptance=t.acceptance, routing=traffic_routing(t, router))
        queue_ms, ttft, tpot, basis, share = target.ttft_ms, target.ttft_ms, target.tpot_ms, "the SLO", t.prefix_share
        cost = target.estimate.cost_per_1m_output_tokens_usd if target.estimate else \
            plan.cost_per_1m_output_tokens_usd
    hit_min, hit_basis = hit_ratio_floor(plan, share, prefix_alert=prefix_alert)
    return WatchPlan(deployment=deployment, gpus=gpus, gpu_price_per_hour=price.usd_per_hour,
                     gpu_price_source=price.source, hit_ratio_min=hit_min, queue_ms_max=max(1.0, round(queue_ms, 1)),
                     ttft_ms_max=max(1.0, round(ttft, 1)), tpot_ms_max=max(0.1, round(tpot, 2)),
                     latency_basis=basis, acceptance_min=even.acceptance if even is not None and watched else None,
                     speculation_mode=spec.speculation_mode,
                     speculation_note=f"{unwatched}; the planner's break-even is {even.acceptance:.0%} per drafted "
                     f"token at batch {even.batch}" if even is not None and not watched else "",
                     cost_per_1m_plan=cost if source == "triton" else None, source=source,
                     gpu_selector=gpu_selector, window=timing[0], alert_for=timing[1], hit_ratio_basis=hit_basis)


def hit_ratio_floor(plan: CapacityPlan, share: float, *, prefix_alert: bool) -> tuple[float | None, str]:
    """The hit-ratio alert's floor and where it comes from: the traffic's prefix share for one server; with the
    serving_target's replicas, the fleet's expectation at that share (the plan's `fleet`, behind the deployment's
    router; the recorded ratio sums every replica's tokens, so it is the fleet's); bench's warning
    level with `prefix_alert` and no declared share; None: no alert."""
    if share <= 0:
        return (HIT_RATIO_WARNING if prefix_alert else None), ""
    if plan.fleet is None:
        return share, ""
    floor = round(plan.estimate_hit_ratio, 4)
    return floor, (f"the fleet's expected ratio over {plan.fleet['replicas']} replicas behind {plan.fleet['router']} "
                   f"routing, from one server's {share:.0%} (pipeline.planning.fleet)")


def acceptance_watch(spec: BuildSpec, source: Source) -> tuple[bool, str]:
    """Whether the deployment exports a draft-acceptance series (the BLS model's draft-token counters: draft-target
    engines served by Triton), else why not."""
    mode = spec.speculation_mode
    if runtime_of(spec).llmapi:
        return False, (f"{mode} acceptance is not watched: TensorRT-LLM 1.2.1's LLM API exports no draft-token "
                       "series (trtllm-serve's Prometheus collector has none; the Triton llmapi model answers "
                       "acceptance_rate per response); measure it with `invoke bench`")
    if source != "triton":
        return False, (f"{mode} acceptance is not watched: trtllm-serve 1.2.1 exports no draft-token series; "
                       "serve with Triton (the BLS model counts drafts) or measure it with `invoke bench`")
    return True, ""


def _triton_rules(w: WatchPlan) -> list[dict[str, Any]]:
    s, r = w.selector, w.window
    m = f'{s},model="{TARGET_MODEL}"'
    kv = f'nv_trt_llm_kv_cache_block_metrics{{{m}'
    reused_tokens = (f'sum by (job) (increase({kv},kv_cache_block_type="reused"}}[{r}]) '
                     f'* ignoring(kv_cache_block_type) {kv},kv_cache_block_type="tokens_per"}})')
    prompt_tokens = (f'sum by (job) (increase(nv_llm_input_token_len_sum{{{m},'
                     f'response_metric_type="total_input_tokens"}}[{r}]))')
    success = f"sum by (job) (rate(nv_inference_request_success{{{m}}}[{r}]))"
    failure = f"sum by (job) (rate(nv_inference_request_failure{{{m}}}[{r}]))"
    output = f'sum by (job) (rate(nv_llm_output_token_len_sum{{{m},response_metric_type="total_output_tokens"}}[{r}]))'
    rules: list[dict[str, Any]] = [
        # reuse is counted at prefill, prompt tokens when a request ends: a window that cuts a burst can exceed 1
        {"record": HIT_RATIO, "expr": f"clamp_max({reused_tokens} / {prompt_tokens}, 1)"},
        {"record": QUEUE_US,
         "expr": f"sum by (job) (rate(nv_inference_queue_duration_us{{{m}}}[{r}])) / {success}"},
        {"record": OUTPUT_TOK_S, "expr": output},
        {"record": COST, "expr": f"{w.usd_per_second * 1e6:.10g} / {OUTPUT_TOK_S}{{{s}}}",
         "labels": {"gpus": str(w.gpus), "usd_per_gpu_hour": f"{w.gpu_price_per_hour:g}"}},
        {"record": KV_USED, "expr": f'max by (job) ({kv},kv_cache_block_type="fraction"}})'},
        # a server that never failed may export no failure series: count it as none
        {"record": REQUEST_RATE, "expr": f"{success} + ({failure} or {success} * 0)"},
        {"record": ERROR_RATIO, "expr": f"{failure} / {REQUEST_RATE}{{{s}}}"},
        {"record": TTFT_P99, "expr": (f"histogram_quantile(0.99, sum by (job, le) "
                                      f"(rate(nv_inference_first_response_histogram_ms_bucket{{{m}}}[{r}])))")},
        {"record": TPOT,
         "expr": f"sum by (job) (rate(nv_inference_compute_infer_duration_us{{{m}}}[{r}])) / 1000 / {output}"},
        {"record": WAITING, "expr": f'sum by (job) (nv_trt_llm_request_metrics{{{m},request_type="waiting"}})'},
    ]
    if w.acceptance_min is not None:
        tokens = f'nv_trt_llm_speculation_draft_tokens{{{s},model="{BLS_MODEL}"'
        rules.append({"record": ACCEPTANCE,
                      "expr": (f'sum by (job) (rate({tokens},draft_token_type="accepted"}}[{r}])) / '
                               f'sum by (job) (rate({tokens},draft_token_type="proposed"}}[{r}]))')})
    return rules


def _trtllm_serve_rules(w: WatchPlan) -> list[dict[str, Any]]:
    s, r = w.selector, w.window

    def mean(family: str, scale: str) -> str:
        return (f"{scale} * sum by (job) (rate({family}_sum{{{s}}}[{r}])) / "
                f"sum by (job) (rate({family}_count{{{s}}}[{r}]))")

    return [
        {"record": HIT_RATIO, "expr": f"max by (job) (avg_over_time(trtllm_kv_cache_hit_rate{{{s}}}[{r}]))"},
        {"record": QUEUE_US, "expr": mean("trtllm_request_queue_time_seconds", "1e6")},
        {"record": KV_USED, "expr": f"max by (job) (trtllm_kv_cache_utilization{{{s}}})"},
        {"record": REQUEST_RATE, "expr": f"sum by (job) (rate(trtllm_request_success_total{{{s}}}[{r}]))"},
        {"record": TTFT_P99, "expr": (f"1000 * histogram_quantile(0.99, sum by (job, le) "
                                      f"(rate(trtllm_time_to_first_token_seconds_bucket{{{s}}}[{r}])))")},
        {"record": TPOT, "expr": mean("trtllm_time_per_output_token_seconds", "1000")},
    ]


def _recording_rules(w: WatchPlan) -> list[dict[str, Any]]:
    return _triton_rules(w) if w.source == "triton" else _trtllm_serve_rules(w)


def _alert(name: str, expr: str, w: WatchPlan, summary: str, description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": w.alert_for,
            "labels": {"severity": "warning", "deployment": w.deployment},
            "annotations": {"summary": summary, "description": description}}


def _alert_rules(w: WatchPlan) -> list[dict[str, Any]]:
    s, r = w.selector, w.window
    server = "Triton" if w.source == "triton" else "trtllm-serve"
    alerts = [
        _alert("TargetDown", f"up{{{s}}} == 0 or absent(up{{{s}}})", w,
               f"{w.deployment}: Prometheus cannot scrape the server",
               f"The {server} metrics endpoint does not answer (or no target is discovered): the server is down, "
               "still loading, or the scrape config does not reach it."),
        _alert("TTFTP99AboveSLO", f"{TTFT_P99}{{{s}}} > {w.ttft_ms_max:g}", w,
               f"{w.deployment}: TTFT p99 above {w.ttft_ms_max:g} ms ({w.latency_basis})",
               "First tokens come late: prefill is queued or too slow; add replicas or lower the request rate."),
        _alert("TPOTAboveSLO", f"{TPOT}{{{s}}} > {w.tpot_ms_max:g}", w,
               f"{w.deployment}: time per output token above {w.tpot_ms_max:g} ms ({w.latency_basis})",
               "Decoding is slower than planned: the batch is larger than the plan's, or the GPUs are shared."),
        _alert("QueueTimeHigh", f"{QUEUE_US}{{{s}}} > {w.queue_ms_max * 1000:g}", w,
               f"{w.deployment}: mean queue time above the planned TTFT ({w.queue_ms_max:g} ms)",
               f"Requests wait in {server}'s queue before the model runs them: add replicas or lower the request "
               "rate."),
    ]
    if w.source == "triton":
        alerts[1:1] = [
            _alert("RequestFailureRatioHigh", f"{ERROR_RATIO}{{{s}}} > {ERROR_RATIO_MAX:g}", w,
                   f"{w.deployment}: more than {ERROR_RATIO_MAX:.0%} of requests fail",
                   "tensorrt_llm answers requests with errors: read the server log (bad inputs, out of KV cache, "
                   "a rank down)."),
            _alert("QueueGrowing", f"min_over_time({WAITING}{{{s}}}[{r}]) > 0 and deriv({WAITING}{{{s}}}[{r}]) > 0",
                   w, f"{w.deployment}: the waiting queue never empties and keeps growing over {r}",
                   "More requests arrive than the deployment serves: add replicas or lower the request rate.")]
    if w.hit_ratio_min is not None:
        alerts.append(_alert(
            "PrefixCacheHitRatioLow", f"{HIT_RATIO}{{{s}}} < {w.hit_ratio_min:g}", w,
            f"{w.deployment}: prefix-cache hit ratio below {w.hit_ratio_min:.0%} over {r}",
            "Few prompt tokens come from the prefix cache although the traffic shares prefixes: the prompt "
            "template probably varies before its shared part (put the shared text first)."
            + (f" The floor is {w.hit_ratio_basis}." if w.hit_ratio_basis else "")))
    if w.acceptance_min is not None:
        alerts.append(_alert(
            "SpeculationBelowBreakEven", f"{ACCEPTANCE}{{{s}}} < {w.acceptance_min:g}", w,
            f"{w.deployment}: {w.speculation_mode} draft acceptance below the planner's {w.speculation_mode} "
            f"break-even ({w.acceptance_min:.0%})",
            f"Too few draft tokens are accepted: {w.speculation_mode} speculation now costs more than the target "
            "alone; serve without the draft or pick a closer draft model."))
    if w.cost_per_1m_plan is not None:
        limit = w.cost_per_1m_plan * COST_ALERT_FACTOR
        alerts.append(_alert(
            "CostPerTokenAbovePlan", f"{COST}{{{s}}} > {limit:.6g} and on(job) {OUTPUT_TOK_S}{{{s}}} > 0", w,
            f"{w.deployment}: $ per 1M output tokens above {COST_ALERT_FACTOR:g}x the plan (${limit:.4g})",
            f"{w.gpus} GPU(s) x ${w.gpu_price_per_hour:g}/h produce too few output tokens: the deployment is "
            "under-used; scale it down."))
    return alerts


def rule_groups(w: WatchPlan) -> list[dict[str, Any]]:
    """The rule groups: recording rules first (the alerts read their series)."""
    return [{"name": f"{w.deployment}.trtllm.recording", "rules": _recording_rules(w)},
            {"name": f"{w.deployment}.trtllm.alerts", "rules": _alert_rules(w)}]


def rules_file(w: WatchPlan) -> str:
    """A plain Prometheus rules file (`rule_files:` of prometheus.yml; Slurm and other hosts), headed by the
    speculation note where acceptance goes unwatched."""
    head = f"# {w.speculation_note}\n" if w.speculation_note else ""
    return head + yaml.safe_dump({"groups": rule_groups(w)}, sort_keys=False, width=120)


def prometheus_rule(w: WatchPlan, *, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The prometheus-operator `PrometheusRule` (monitoring.coreos.com/v1) holding the same groups."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": f"{w.deployment}-trtllm", "namespace": namespace, "labels": labels},
            "spec": {"groups": rule_groups(w)}}
