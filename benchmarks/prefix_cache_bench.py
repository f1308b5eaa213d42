"""Prefix caching, measured: the shared-prefix bench workload vs the no-shared-prefix one (the named peer), same
run, same server.

Packages the tiny draft-target reference repo, starts a real tritonserver on it, and runs `bench` on the ensemble
twice: a `--shared-prefix-tokens` prefix on `--share` of the requests, then unique prefixes of the same length.
Prints both hit ratios and TTFT p50s (the server's timestamps) and their ratio. The tiny models are generated once
into $PIPELINE_CACHE (or --model-cache).

    python benchmarks/prefix_cache_bench.py [--prefix 192] [--share 0.9] [--requests 8] [--concurrency 1,2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.serving.bench import (ServerUrls, SweepOptions, WorkloadOptions, format_report, parse_levels, run_bench,
                                    tokenizer_dir_of)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=192, help="shared prefix tokens (tiny build: max_input_len 256)")
    ap.add_argument("--share", type=float, default=0.9, help="share of requests reusing the prefix")
    ap.add_argument("--requests", type=int, default=8, help="requests per concurrency level")
    ap.add_argument("--concurrency", default="1,2")
    ap.add_argument("--model-cache", default=os.environ.get("PIPELINE_CACHE"),
                    help="where the generated tiny models live (default $PIPELINE_CACHE)")
    args = ap.parse_args()
    from pipeline.core.spec import resolve_spec
    from pipeline.serving.serve import TritonServer
    from pipeline.stages.download.tinymodel import ensure_tiny_model
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    with tempfile.TemporaryDirectory() as tmp:
        if args.model_cache:
            os.environ["PIPELINE_CACHE"] = args.model_cache
        models = {name: ensure_tiny_model(name) for name in ("tiny-llama", "tiny-llama-draft")}
        os.environ.update(PIPELINE_ROOT=f"{tmp}/out", PIPELINE_CACHE=f"{tmp}/cache")
        spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference")
        repo = package_repo(spec, PackageInputs(checkpoint=models["tiny-llama"],
                                                draft_checkpoint=models["tiny-llama-draft"],
                                                build_id="prefix-cache-bench")).path
        workload = WorkloadOptions(concurrency=parse_levels(args.concurrency), requests_per_level=args.requests,
                                   max_tokens=4, shared_prefix_tokens=args.prefix)
        with TritonServer(repo, ready_timeout_s=300) as server:
            urls, sweep = ServerUrls(server.grpc_url, server.metrics_url), SweepOptions(model="ensemble")
            shared, none = (run_bench(urls, replace(workload, shared_prefix_share=share), sweep=sweep,
                                      tokenizer_dir=tokenizer_dir_of(repo)) for share in (args.share, 0.0))
    for name, r in (("shared prefix", shared), ("no shared prefix (peer)", none)):
        print(f"--- {name}\n{format_report(r)}\n")
    ttft = lambda r: r.ttft_ms_warm_p50 if r.ttft_ms_warm_p50 is not None else r.ttft_ms_cold_p50  # noqa: E731
    p50 = lambda r: sorted(lv.ttft_ms_p50 for lv in r.levels if lv.ttft_ms_p50 is not None)  # noqa: E731
    print(f"hit ratio: shared {shared.prefix_cache_hit_ratio}, no shared prefix {none.prefix_cache_hit_ratio}")
    print(f"TTFT p50 (ms): shared-prefix warm {ttft(shared)}, cold {shared.ttft_ms_cold_p50}; "
          f"no shared prefix {none.ttft_ms_cold_p50}")
    print(f"ratio: no-shared-prefix TTFT / warm shared-prefix TTFT = {_ratio(none.ttft_ms_cold_p50, ttft(shared))}; "
          f"level TTFT p50s shared {p50(shared)} vs none {p50(none)}")
    if shared.failed or none.failed:
        raise SystemExit("some requests failed")


if __name__ == "__main__":
    main()
