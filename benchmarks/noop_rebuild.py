"""No-op rebuild vs first build of the same spec (the named peer), measured in the same run. Goal: ratio <= 0.02.

Both are `invoke build` processes on fresh PIPELINE_ROOT/PIPELINE_CACHE dirs (what a user or CI sees, interpreter
start included). The rebuild must do no work: the script also checks that no manifest changed.

    python benchmarks/noop_rebuild.py [--model tiny-llama --precision fp8 --target reference] [-n 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def manifests(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(root.rglob("manifest.json"))}


def run(argv: list[str], env: dict[str, str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "invoke", *argv, "--json"], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"invoke {' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return dt, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--target", default="reference")
    ap.add_argument("-n", type=int, default=3, help="no-op rebuilds (median reported)")
    args = ap.parse_args()
    spec = ["build", "--model", args.model, "--precision", args.precision, "--target", args.target]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PIPELINE_ROOT=f"{tmp}/out", PIPELINE_CACHE=f"{tmp}/cache", HF_HUB_OFFLINE="1")
        first, report = run(spec, env)
        stages = ", ".join(f"{s['stage']}={s['status']}" for s in report["stages"])
        print(f"peer: first build            {first:8.2f} s  ({stages})")
        before = manifests(Path(tmp))
        times = []
        for _ in range(args.n):
            t, rep = run(spec, env)
            if not rep["noop"]:
                raise SystemExit(f"rebuild was not a no-op: {rep['stages']}")
            times.append(t)
        if manifests(Path(tmp)) != before:
            raise SystemExit("a no-op rebuild rewrote a manifest")
        noop = statistics.median(times)
        ratio = noop / first
        print(f"no-op rebuild (median of {args.n}) {noop:8.3f} s")
        print(f"ratio no-op / first build    {ratio:8.4f}  (goal <= 0.02): {'PASS' if ratio <= 0.02 else 'FAIL'}")


if __name__ == "__main__":
    main()
