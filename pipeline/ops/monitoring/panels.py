"""The dashboard's panels as data: operations (requests, failures, latency, queue, GPUs) then cost, each with its
unit and the alert threshold it is drawn against. The Grafana dashboard (`dashboard.py`) and the picture
(`picture.py`) are both built from this list.

GPU panels read NVIDIA's DCGM exporter (`DCGM_FI_DEV_GPU_UTIL`, percent busy; `DCGM_FI_DEV_FB_USED`, framebuffer
MiB used), which runs beside the deployment (the GPU operator installs it on Kubernetes); they select the
deployment's GPUs with `WatchPlan.gpu_selector`."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.ops.monitoring import rules
from pipeline.ops.monitoring.rules import WatchPlan

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str  # PromQL over the recorded series of this deployment (or DCGM's)
    unit: str  # Grafana unit id: percentunit | percent | µs | ms | reqps | short | decmbytes | currencyUSD
    threshold: float | None = None  # the alert's threshold (None: no alert on this series)
    threshold_below: bool = True  # the alert fires below the threshold (False: above)
    legend: str = "{{job}}"


def panels(w: WatchPlan) -> list[Panel]:
    s, gpu = f"{{{w.selector}}}", f"{{{w.gpu_selector}}}"
    triton = w.source == "triton"
    out = [Panel("Requests/s", f"{rules.REQUEST_RATE}{s}", "reqps"),
           *([Panel("Request failure ratio", f"{rules.ERROR_RATIO}{s}", "percentunit", rules.ERROR_RATIO_MAX,
                    threshold_below=False)] if triton else []),
           Panel("TTFT p99", f"{rules.TTFT_P99}{s}", "ms", w.ttft_ms_max, threshold_below=False),
           Panel("Time per output token (mean)", f"{rules.TPOT}{s}", "ms", w.tpot_ms_max, threshold_below=False),
           Panel("Mean queue time", f"{rules.QUEUE_US}{s}", "µs", w.queue_ms_max * 1000, threshold_below=False),
           *([Panel("Waiting requests", f"{rules.WAITING}{s}", "short")] if triton else []),
           Panel("GPU utilization", f"{GPU_UTIL}{gpu}", "percent", legend="{{Hostname}} GPU {{gpu}}"),
           Panel("GPU memory used", f"{GPU_FB_USED}{gpu}", "decmbytes", legend="{{Hostname}} GPU {{gpu}}"),
           Panel("Prefix-cache hit ratio", f"{rules.HIT_RATIO}{s}", "percentunit", w.hit_ratio_min),
           Panel("KV-cache blocks used", f"{rules.KV_USED}{s}", "percentunit")]
    if w.acceptance_min is not None:
        out.append(Panel("Speculation acceptance", f"{rules.ACCEPTANCE}{s}", "percentunit", w.acceptance_min))
    if w.cost_per_1m_plan is not None:
        out += [Panel("$ per 1M output tokens", f"{rules.COST}{s}", "currencyUSD",
                      w.cost_per_1m_plan * rules.COST_ALERT_FACTOR, threshold_below=False),
                Panel("Output tokens/s", f"{rules.OUTPUT_TOK_S}{s}", "short")]
    return out
