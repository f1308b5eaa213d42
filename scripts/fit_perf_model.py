"""Fit pipeline.planning.perf_model's CALIBRATION to recorded AIConfigurator estimates and print the constants.

    python scripts/fit_perf_model.py [tests/data/aiconfigurator_0.12.json]

Least squares on the log ratio of TTFT, TPOT and output tok/s over the usable records (benchmarks/planner_accuracy.py:
status "ok", batch <= 256, H100 SXM and H200, FP8 and BF16) whose batch is not held out (needs scipy, a
development-only tool). Paste the printed Calibration into pipeline/planning/perf_model.py, then run
benchmarks/planner_accuracy.py for the held-out ratios.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from pipeline.planning.perf_model import CALIBRATION, Calibration

_SPEC = importlib.util.spec_from_file_location(
    "planner_accuracy", Path(__file__).resolve().parents[1] / "benchmarks" / "planner_accuracy.py")
accuracy = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(accuracy)


POWER = 4  # above 2: the worst points weigh more (the goal is on the worst ratio)


def residuals(x: np.ndarray, records: list[dict], names: list[str]) -> np.ndarray:
    cal = Calibration(**dict(zip(names, np.exp(x), strict=True)))
    r = np.log(np.array([accuracy.ratios(r, cal) for r in records])).ravel()
    return r * np.abs(r) ** (POWER / 2 - 1)  # least squares of these: sum |log ratio| ** POWER


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else accuracy.DATA
    records = [r for r in accuracy.load(path) if r["batch"] not in accuracy.HELD_OUT_BATCHES]
    names = [f.name for f in dataclasses.fields(Calibration)]
    x0 = np.log([getattr(CALIBRATION, n) for n in names])
    upper = [0.0 if "efficiency" in n else np.inf for n in names]  # achieved fractions stay <= 1
    fit = least_squares(residuals, np.minimum(x0, upper), bounds=([-np.inf] * len(names), upper),
                        args=(records, names), x_scale=1.0, diff_step=1e-3)
    cal = Calibration(**{n: round(float(v), 4) for n, v in zip(names, np.exp(fit.x), strict=True)})
    print(f"mean |log ratio|^{POWER} {np.mean(fit.fun ** 2):.2e} over {len(records)} fitted records")
    print(cal)


if __name__ == "__main__":
    main()
