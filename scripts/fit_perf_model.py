"""Fit pipeline.planning.perf_model's CALIBRATION to recorded AIConfigurator estimates and print the constants.

    python scripts/fit_perf_model.py [tests/data/aiconfigurator_0.12.json]

Minimises the squared log error of TTFT, TPOT and output tok/s over the records with status "ok" (needs scipy,
a development-only tool). Paste the printed Calibration into pipeline/planning/perf_model.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np
from scipy.optimize import minimize

from pipeline.core.gpus import GPUS
from pipeline.core.registry import load_registry
from pipeline.planning.perf_model import CALIBRATION, Calibration, EngineCost, estimate

PRECISION = {"fp8_static": "fp8", "bfloat16": "bf16"}
KV = {"fp8": "fp8", "bfloat16": "bf16"}
SYSTEM_GPU = {"h100_sxm": "h100-sxm", "h200_sxm": "h200"}


def usable(records: list[dict]) -> list[dict]:
    return [r for r in records if r["status"] == "ok" and r["gemm"] in PRECISION]


def predict(r: dict, cal: Calibration, registry) -> tuple[float, float, float]:
    eng = EngineCost(registry[r["model"]].architecture, PRECISION[r["gemm"]], KV[r["kv"]], r["tp"],
                     GPUS[SYSTEM_GPU[r["system"]]])
    e = estimate(eng, input_len=r["isl"], output_len=r["osl"], batch=r["batch"], prefix_reused=r["prefix"], cal=cal)
    return e.ttft_ms, e.tpot_ms, e.output_tokens_per_s


def loss(x: np.ndarray, records: list[dict], registry, names: list[str]) -> float:
    cal = Calibration(**dict(zip(names, np.exp(x), strict=True)))
    if any(getattr(cal, n) > 1.0 for n in names if "efficiency" in n):
        return 1e9
    total = 0.0
    for r in records:
        got = predict(r, cal, registry)
        for g, want in zip(got, (r["ttft_ms"], r["tpot_ms"], r["tokens_per_s"]), strict=True):
            total += math.log(max(g, 1e-9) / want) ** 2
    return total


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/aiconfigurator_0.12.json"
    records = usable(json.loads(open(path).read())["records"])
    registry = load_registry()
    names = [f.name for f in dataclasses.fields(Calibration)]
    x0 = np.log([getattr(CALIBRATION, n) for n in names])
    best = minimize(loss, x0, args=(records, registry, names), method="Nelder-Mead",
                    options=dict(maxiter=6000, maxfev=6000, xatol=1e-4, fatol=1e-6))
    cal = Calibration(**{n: round(float(v), 4) for n, v in zip(names, np.exp(best.x), strict=True)})
    print(f"loss {best.fun:.4f} over {len(records)} records")
    print(cal)
    worst = 0.0
    for r in records:
        got = predict(r, cal, registry)
        ratios = [g / w for g, w in zip(got, (r["ttft_ms"], r["tpot_ms"], r["tokens_per_s"]), strict=True)]
        worst = max(worst, *(abs(q - 1) for q in ratios))
        print(f"{r['model']:10} tp{r['tp']} {r['isl']}/{r['osl']} b{r['batch']:<3} {r['gemm']:10} p{r['prefix']:<4} "
              + "  ".join(f"{q:5.2f}" for q in ratios))
    print(f"worst relative error {worst:.1%}")


if __name__ == "__main__":
    main()
