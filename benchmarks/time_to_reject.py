"""Time-to-reject an impossible build vs the named peer `python -c pass` (bare interpreter start), same run.

Goal: an invalid spec or impossible build is rejected in < 1 s, before any download. Each command is run N times
as a fresh process (what a user or CI sees); medians are compared.

    python benchmarks/time_to_reject.py [-n 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> (task argv, documented exit code: 2 bad input, 4 this host cannot do it; README's table)
CASES = {
    "invalid spec (fp8 on a100)": (["build", "--model", "llama-70b", "--precision", "fp8", "--gpu", "a100"], 2),
    "unknown model": (["build", "--model", "llama-700b"], 2),
    "impossible trtllm build here (host check)": (["build", "--model", "llama-70b", "--precision", "fp8", "--tp", "4"],
                                                  4),
}


def timed(argv: list[str], env: dict[str, str], expect: int) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != expect:
        raise SystemExit(f"{argv}: exit {r.returncode}, expected {expect}: {r.stderr.strip()[-300:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="runs per command (median reported)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PIPELINE_ROOT=f"{tmp}/out", PIPELINE_CACHE=f"{tmp}/cache", HF_HUB_OFFLINE="1")
        peer = statistics.median(timed([sys.executable, "-c", "pass"], env, 0) for _ in range(args.n))
        print(f"peer: python -c pass                          median {peer * 1000:7.1f} ms")
        worst = 0.0
        for name, (task, code) in CASES.items():
            t = statistics.median(timed([sys.executable, "-m", "invoke", *task], env, code) for _ in range(args.n))
            worst = max(worst, t)
            print(f"{name:45s} median {t * 1000:7.1f} ms  ratio vs peer {t / peer:5.1f}x")
        assert not Path(tmp, "out").exists(), "a rejected build left outputs behind"
    verdict = "PASS" if worst < 1.0 else "FAIL"
    print(f"worst time-to-reject {worst:.3f} s (goal < 1 s): {verdict}; ratio vs interpreter start {worst / peer:.1f}x")


if __name__ == "__main__":
    main()
