"""Prometheus recording and alert rules for one deployment, as data (`yaml.safe_dump`), thresholds from the spec and
the planner.

Every series is one the C++ tensorrtllm backend (TensorRT-LLM 1.2.1, `custom_metrics_reporter.cc`) or Triton core
exports, and the CPU reference backend exports them under the same names and labels, so the rules read both:

- prefix-cache hit ratio: prompt tokens served from the cache / prompt tokens, over the window:
  increase of `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused"}` (blocks reused since load) x
  `tokens_per` / increase of `nv_llm_input_token_len_sum` (the per-request prompt-length histogram);
- speculation acceptance: accepted / proposed draft tokens of the draft-target BLS model
  (`nv_trt_llm_speculation_draft_tokens`);
- mean queue time: Triton's `nv_inference_queue_duration_us` / `nv_inference_request_success` of the target model;
- output tokens/s: rate of `nv_llm_output_token_len_sum`, and from it $ per 1M output tokens at the deployment's
  GPUs x $/GPU-hour.

Every rule selects on `job="<deployment name>"`, the label `scrape.py`'s PodMonitor and file_sd config give the
deployment's metrics (Triton: port 8002).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from pipeline.core.gpus import gpu_price
from pipeline.core.spec import BuildSpec
from pipeline.planning.break_even import speculation_break_even
from pipeline.planning.planner import plan_capacity
from pipeline.serving.bench import HIT_RATIO_WARNING

TARGET_MODEL = "tensorrt_llm"
BLS_MODEL = "tensorrt_llm_bls"
PREFIX = "trtllm"  # recorded series: trtllm:<what>
HIT_RATIO = f"{PREFIX}:prefix_cache_hit_ratio"
ACCEPTANCE = f"{PREFIX}:speculation_acceptance"
QUEUE_US = f"{PREFIX}:queue_time_us:mean"
OUTPUT_TOK_S = f"{PREFIX}:output_tokens_per_s"
COST = f"{PREFIX}:cost_usd_per_1m_output_tokens"
KV_USED = f"{PREFIX}:kv_cache_used_fraction"
COST_ALERT_FACTOR = 2.0  # the cost alert fires above this multiple of the planner's estimate


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
    hit_ratio_min: float
    queue_ms_max: float  # the SLO's TTFT, else the planner's estimate: requests queue longer than a whole TTFT
    acceptance_min: float | None = None  # the planner's speculation break-even (None: no draft model)
    cost_per_1m_plan: float | None = None  # what the plan paid for (the spec's serving_target), else the planner's
    window: str = "15m"
    alert_for: str = "15m"

    @property
    def selector(self) -> str:
        return f'job="{self.deployment}"'

    @property
    def usd_per_second(self) -> float:
        return self.gpus * self.gpu_price_per_hour / 3600.0


def watch_plan(spec: BuildSpec, *, deployment: str, gpus: int, window: str = "15m",
               alert_for: str = "15m") -> WatchPlan:
    """Thresholds for `spec` served as `deployment` on `gpus` GPUs (all replicas): the spec's GPU price and the
    planner's speculation break-even; with the spec's `serving_target`, the queue limit is its SLO TTFT, the cost
    plan its estimate (else the planner's at the traffic's lengths) and the hit-ratio floor its prefix share (when
    > 0); without one, the planner's TTFT and cost at the default request lengths (1024 + 256)."""
    target = spec.serving_target
    price = gpu_price(spec.hardware.gpu, spec.hardware.gpu_price_per_hour)
    even = speculation_break_even(spec)
    if target is None:
        plan = plan_capacity(spec)
        queue_ms, cost, hit_min = plan.ttft_ms_estimate, plan.cost_per_1m_output_tokens_usd, HIT_RATIO_WARNING
    else:
        t = target.traffic
        terms = {} if t.acceptance is None else {"acceptance": t.acceptance}
        plan = plan_capacity(spec, input_len=t.input_len, output_len=t.output_len, prefix_hit_ratio=t.prefix_share,
                             **terms)
        queue_ms = target.ttft_ms
        cost = target.estimate.cost_per_1m_output_tokens_usd if target.estimate else \
            plan.cost_per_1m_output_tokens_usd
        hit_min = t.prefix_share or HIT_RATIO_WARNING  # the plan's estimate counts on that share being reused
    return WatchPlan(deployment=deployment, gpus=gpus, gpu_price_per_hour=price.usd_per_hour,
                     gpu_price_source=price.source, hit_ratio_min=hit_min, queue_ms_max=max(1.0, round(queue_ms, 1)),
                     acceptance_min=even.acceptance if even is not None else None, cost_per_1m_plan=cost,
                     window=window, alert_for=alert_for)


def _recording_rules(w: WatchPlan) -> list[dict[str, Any]]:
    s, r = w.selector, w.window
    kv = f'nv_trt_llm_kv_cache_block_metrics{{{s},model="{TARGET_MODEL}"'
    reused_tokens = (f'sum by (job) (increase({kv},kv_cache_block_type="reused"}}[{r}]) '
                     f'* ignoring(kv_cache_block_type) {kv},kv_cache_block_type="tokens_per"}})')
    prompt_tokens = (f'sum by (job) (increase(nv_llm_input_token_len_sum{{{s},model="{TARGET_MODEL}",'
                     f'response_metric_type="total_input_tokens"}}[{r}]))')
    rules = [
        # reuse is counted at prefill, prompt tokens when a request ends: a window that cuts a burst can exceed 1
        {"record": HIT_RATIO, "expr": f"clamp_max({reused_tokens} / {prompt_tokens}, 1)"},
        {"record": QUEUE_US,
         "expr": (f'sum by (job) (rate(nv_inference_queue_duration_us{{{s},model="{TARGET_MODEL}"}}[{r}])) / '
                  f'sum by (job) (rate(nv_inference_request_success{{{s},model="{TARGET_MODEL}"}}[{r}]))')},
        {"record": OUTPUT_TOK_S,
         "expr": (f'sum by (job) (rate(nv_llm_output_token_len_sum{{{s},model="{TARGET_MODEL}",'
                  f'response_metric_type="total_output_tokens"}}[{r}]))')},
        {"record": COST, "expr": f"{w.usd_per_second * 1e6:.10g} / {OUTPUT_TOK_S}{{{s}}}",
         "labels": {"gpus": str(w.gpus), "usd_per_gpu_hour": f"{w.gpu_price_per_hour:g}"}},
        {"record": KV_USED, "expr": f'max by (job) ({kv},kv_cache_block_type="fraction"}})'},
    ]
    if w.acceptance_min is not None:
        tokens = f'nv_trt_llm_speculation_draft_tokens{{{s},model="{BLS_MODEL}"'
        rules.append({"record": ACCEPTANCE,
                      "expr": (f'sum by (job) (rate({tokens},draft_token_type="accepted"}}[{r}])) / '
                               f'sum by (job) (rate({tokens},draft_token_type="proposed"}}[{r}]))')})
    return rules


def _alert(name: str, expr: str, w: WatchPlan, summary: str, description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": w.alert_for,
            "labels": {"severity": "warning", "deployment": w.deployment},
            "annotations": {"summary": summary, "description": description}}


def _alert_rules(w: WatchPlan) -> list[dict[str, Any]]:
    s = w.selector
    alerts = [
        _alert("PrefixCacheHitRatioLow", f"{HIT_RATIO}{{{s}}} < {w.hit_ratio_min:g}", w,
               f"{w.deployment}: prefix-cache hit ratio below {w.hit_ratio_min:.0%} over {w.window}",
               "Few prompt tokens come from the prefix cache: the prompt template probably varies before its "
               "shared part (put the shared text first)."),
        _alert("QueueTimeHigh", f"{QUEUE_US}{{{s}}} > {w.queue_ms_max * 1000:g}", w,
               f"{w.deployment}: mean queue time above the planned TTFT ({w.queue_ms_max:g} ms)",
               "Requests wait in Triton's queue before the model runs them: add replicas or lower the request "
               "rate."),
    ]
    if w.acceptance_min is not None:
        alerts.append(_alert(
            "SpeculationBelowBreakEven", f"{ACCEPTANCE}{{{s}}} < {w.acceptance_min:g}", w,
            f"{w.deployment}: draft acceptance below the planner's break-even ({w.acceptance_min:.0%})",
            "Too few draft tokens are accepted: speculation now costs more than the target alone; serve without "
            "the draft or pick a closer draft model."))
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
    """A plain Prometheus rules file (`rule_files:` of prometheus.yml; Slurm and other hosts)."""
    return yaml.safe_dump({"groups": rule_groups(w)}, sort_keys=False, width=120)


def prometheus_rule(w: WatchPlan, *, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The prometheus-operator `PrometheusRule` (monitoring.coreos.com/v1) holding the same groups."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": f"{w.deployment}-trtllm", "namespace": namespace, "labels": labels},
            "spec": {"groups": rule_groups(w)}}
