"""The deployment's Grafana dashboard, built with Grafana's foundation SDK (`grafana-foundation-sdk`): one time-series
panel per recorded series (operations, then cost) and per DCGM GPU series, its alert threshold drawn as a dashed line. Written as JSON and, on Kubernetes, as a
ConfigMap labelled `grafana_dashboard: "1"` for the Grafana sidecar to load."""

from __future__ import annotations

import json
from typing import Any

from pipeline.ops.monitoring.panels import Panel, panels
from pipeline.ops.monitoring.rules import WatchPlan

PANEL_WIDTH, PANEL_HEIGHT = 12, 8  # two panels a row on Grafana's 24-column grid
DATASOURCE = "${datasource}"  # a datasource variable: the dashboard works with whichever Prometheus is picked


def _panel(p: Panel):
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders import dashboard as dash
    from grafana_foundation_sdk.builders.prometheus import Dataquery
    from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
    from grafana_foundation_sdk.models.common import GraphThresholdsStyleMode
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

    ok, bad = "green", "red"
    steps = [Threshold(value=None, color=ok)]
    if p.threshold is not None:
        steps = ([Threshold(value=None, color=bad), Threshold(value=p.threshold, color=ok)] if p.threshold_below
                 else [Threshold(value=None, color=ok), Threshold(value=p.threshold, color=bad)])
    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE)
    panel = (Timeseries().title(p.title).unit(p.unit).datasource(source).height(PANEL_HEIGHT).span(PANEL_WIDTH)
             .with_target(Dataquery().expr(p.expr).legend_format(p.legend).datasource(source))
             .thresholds(dash.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)))
    if p.threshold is not None:
        panel = panel.thresholds_style(common_builders.GraphThresholdsStyleConfig()
                                       .mode(GraphThresholdsStyleMode.DASHED))
    if p.unit in ("percentunit", "percent"):
        panel = panel.min(0).max(1 if p.unit == "percentunit" else 100)
    return panel


def dashboard(w: WatchPlan) -> dict[str, Any]:
    """The dashboard model (Grafana's JSON, as a dict)."""
    from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    board = (Dashboard(f"TensorRT-LLM: {w.deployment}").uid(f"trtllm-{w.deployment}"[:40])
             .tags(["trtllm", "operations", "cost", w.source]).refresh("30s").time("now-6h", "now")
             .description(f"{w.gpus} GPU(s) x ${w.gpu_price_per_hour:g}/GPU-h ({w.gpu_price_source}); "
                          f"rates over {w.window}; latency limits: {w.latency_basis}")
             .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for p in panels(w):
        board = board.with_panel(_panel(p))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def dashboard_json(w: WatchPlan) -> str:
    return json.dumps(dashboard(w), indent=2, sort_keys=True) + "\n"


def dashboard_config_map(w: WatchPlan, *, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A ConfigMap the Grafana sidecar (`grafana_dashboard` label) loads as a dashboard."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{w.deployment}-grafana-dashboard", "namespace": namespace,
                         "labels": {**labels, "grafana_dashboard": "1"}},
            "data": {f"{w.deployment}-trtllm.json": dashboard_json(w)}}
