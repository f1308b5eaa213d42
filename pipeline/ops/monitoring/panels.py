"""The dashboard's panels as data: one per recorded series, with its unit and the alert threshold it is drawn
against. The Grafana dashboard (`dashboard.py`) and the picture (`picture.py`) are both built from this list."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.ops.monitoring import rules
from pipeline.ops.monitoring.rules import WatchPlan


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str  # PromQL over the recorded series of this deployment
    unit: str  # Grafana unit id: percentunit | µs | short | currencyUSD
    threshold: float | None = None  # the alert's threshold (None: no alert on this series)
    threshold_below: bool = True  # the alert fires below the threshold (False: above)


def panels(w: WatchPlan) -> list[Panel]:
    s = f"{{{w.selector}}}"
    out = [Panel("Prefix-cache hit ratio", f"{rules.HIT_RATIO}{s}", "percentunit", w.hit_ratio_min),
           Panel("$ per 1M output tokens", f"{rules.COST}{s}", "currencyUSD",
                 w.cost_per_1m_plan * rules.COST_ALERT_FACTOR if w.cost_per_1m_plan is not None else None,
                 threshold_below=False),
           Panel("Output tokens/s", f"{rules.OUTPUT_TOK_S}{s}", "short"),
           Panel("Mean queue time", f"{rules.QUEUE_US}{s}", "µs", w.queue_ms_max * 1000, threshold_below=False),
           Panel("KV-cache blocks used", f"{rules.KV_USED}{s}", "percentunit")]
    if w.acceptance_min is not None:
        out.insert(1, Panel("Speculation acceptance", f"{rules.ACCEPTANCE}{s}", "percentunit", w.acceptance_min))
    return out
