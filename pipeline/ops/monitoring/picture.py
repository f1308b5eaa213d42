"""A PNG of the dashboard's panels drawn from a live Prometheus (its `query_range` API), for places without Grafana:
the same panels, queries and alert thresholds as the Grafana dashboard (`panels.py`), drawn with matplotlib."""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.local_url import check_local
from pipeline.ops.monitoring.panels import Panel, panels
from pipeline.ops.monitoring.rules import WatchPlan

MAX_RESPONSE_BYTES = 16 * 1024 * 1024


def query_range(prometheus_url: str, expr: str, *, start: float, end: float,
                step_s: float) -> list[tuple[float, float]]:
    """(unix time, value) samples of `expr`'s first series (NaN and infinite values dropped)."""
    check_local(prometheus_url)
    query = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"})
    try:
        with urllib.request.urlopen(f"{prometheus_url.rstrip('/')}/api/v1/query_range?{query}", timeout=30) as r:
            body = json.loads(r.read(MAX_RESPONSE_BYTES))
    except (OSError, ValueError) as exc:
        raise PipelineError(f"cannot query Prometheus at {prometheus_url} ({exc}); is it running?") from None
    result = body.get("data", {}).get("result", []) if body.get("status") == "success" else []
    if not result:
        return []
    points = [(float(t), float(v)) for t, v in result[0]["values"]]
    return [(t, v) for t, v in points if math.isfinite(v)]


def _scale(p: Panel) -> tuple[float, str]:
    return {"percentunit": (100.0, "%"), "percent": (1.0, "%"), "µs": (1e-3, "ms"), "ms": (1.0, "ms"),
            "reqps": (1.0, "req/s"), "decmbytes": (1.0, "MiB"), "currencyUSD": (1.0, "USD"), "short": (1.0, "")}[p.unit]


def _text(s: str) -> str:
    return s.replace("$", r"\$")  # not matplotlib mathtext


def render_dashboard(w: WatchPlan, *, prometheus_url: str, start: float, end: float, path: Path,
                     step_s: float = 1.0) -> Path | None:
    """Draw every panel over start..end to `path`; None when matplotlib is not installed (`.[plot]`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    chosen = panels(w)
    rows = math.ceil(len(chosen) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.2 * rows), squeeze=False)
    for ax, p in zip(axes.flat, chosen):
        factor, unit = _scale(p)
        points = query_range(prometheus_url, p.expr, start=start, end=end, step_s=step_s)
        if points:
            ax.plot([t - start for t, _ in points], [v * factor for _, v in points], ".-", color="tab:blue",
                    markersize=3, label=w.deployment)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")
        if p.threshold is not None:
            ax.axhline(p.threshold * factor, color="tab:red", linestyle="--",
                       label=f"alert {'below' if p.threshold_below else 'above'} {p.threshold * factor:.3g} {unit}")
            ax.legend(loc="best", fontsize=8)
        if p.unit == "currencyUSD":
            ax.set_yscale("log")  # an idle or slow server costs orders of magnitude above the plan
        ax.set_title(_text(p.title) + (f" ({unit})" if unit else ""), fontsize=10)
        ax.set_xlim(0, end - start)
        ax.set_xlabel("seconds", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    fig.suptitle(_text(f"TensorRT-LLM: {w.deployment} ({w.gpus} GPU x ${w.gpu_price_per_hour:g}/h, rates over "
                       f"{w.window})"), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
