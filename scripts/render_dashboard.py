"""Draw the deployment dashboard's panels from a running Prometheus into a PNG (no Grafana needed).

    python scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 --job tiny --minutes 5 \
        --model tiny-llama --precision fp8 --draft auto --target reference --window 20s --out docs/dashboard.png

The panels, queries and thresholds are the ones `invoke deploy` writes (pipeline.ops.monitoring); `--window` must
match the rules Prometheus evaluates. README's docs/dashboard.png was drawn by the same function at the end of the
live Prometheus test: `PIPELINE_DASHBOARD_PNG=docs/dashboard.png pytest tests/ops/test_monitoring_prometheus.py`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeline.core.spec import resolve_spec
from pipeline.ops.monitoring.picture import render_dashboard
from pipeline.ops.monitoring.rules import watch_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--job", required=True, help="the deployment's scrape job (deploy --name)")
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", required=True)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--target", default=None)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--window", default="15m")
    ap.add_argument("--out", type=Path, default=Path("dashboard.png"))
    a = ap.parse_args()
    spec = resolve_spec(model=a.model, precision=a.precision, draft=a.draft, target=a.target)
    w = watch_plan(spec, deployment=a.job, gpus=a.gpus, window=a.window)
    end = time.time()
    png = render_dashboard(w, prometheus_url=a.prometheus, start=end - a.minutes * 60, end=end, path=a.out,
                           step_s=max(1.0, a.minutes * 60 / 600))
    print(f"dashboard: {png}" if png else "dashboard: skipped (matplotlib is not installed: pip install '.[plot]')")


if __name__ == "__main__":
    main()
