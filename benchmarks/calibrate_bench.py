"""Overhead of the calibrate stage vs bare ModelOpt quantize + export on the same tiny model, in one run.

Peer ("bare"): load the HF model, `mtq.quantize` over the very same calibration samples, and
`export_tensorrt_llm_checkpoint` (the minimum any pipeline must do). Ours: `run_calibrate(..., force=True)`, which
adds sample selection + fingerprint, the held-out quality gate, the CPU round-trip check, tokenizer copy and
manifest hashing. Prints both times, the ratio (goal <= 1.05) and the stage's own breakdown, so the cost of the
quality gate / round-trip (features) is visible apart from plumbing.

    python benchmarks/calibrate_bench.py [--precision fp8] [--repeat 2] [--calib-size 64] [--calib-seq-len 128]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def bare(src: Path, samples: list[list[int]], precision: str, kv: str, out: Path) -> tuple[float, dict[str, float]]:
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM

    from pipeline.stages.calibrate.recipes import quant_config

    t = t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    cfg = quant_config(precision, kv)
    phases = {"load_s": time.perf_counter() - t}
    t = time.perf_counter()

    def loop(m):
        with torch.no_grad():
            for s in samples:
                m(torch.tensor([s]))

    if cfg is not None:
        mtq.quantize(model, cfg, loop)
    phases["calibrate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    with torch.inference_mode():
        export_tensorrt_llm_checkpoint(
            copy.deepcopy(model),
            "llama",
            torch.bfloat16,
            export_dir=out,
            inference_tensor_parallel=1,
            inference_pipeline_parallel=1,
        )
    phases["export_s"] = time.perf_counter() - t
    return time.perf_counter() - t0, phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--kv-cache", default=None)
    ap.add_argument("--calib-size", type=int, default=None)
    ap.add_argument("--calib-seq-len", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="calibrate-bench-"))
    os.environ["PIPELINE_ROOT"] = str(work / "out")
    os.environ.setdefault("PIPELINE_CACHE", str(work / "cache"))
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.calibrate import data
    from pipeline.stages.calibrate.stage import _plan, run_calibrate
    from pipeline.stages.download.stage import download_model

    spec = resolve_spec(
        model=args.model,
        precision=args.precision,
        kv_cache=args.kv_cache,
        calib_size=args.calib_size,
        calib_seq_len=args.calib_seq_len,
        enable_kv_cache_reuse=False,
        enable_chunked_context=False,
    )
    src = download_model(spec.model).path
    plan = _plan(spec, "target")
    texts, source = data.load_texts(None)
    samples = data.pack(
        texts, data.tokenizer_fn(src), size=plan.calib_size, seq_len=plan.calib_seq_len, seed=plan.seed, source=source
    ).samples
    import modelopt.torch.export
    import modelopt.torch.quantization  # noqa: F401 - warm imports so neither side pays them
    import transformers  # noqa: F401

    t_bare, t_ours, breakdown, bare_phases = [], [], {}, {}
    with contextlib.redirect_stdout(sys.stderr):
        for i in range(args.repeat):
            for side in ("bare", "ours") if i % 2 == 0 else ("ours", "bare"):  # alternate: no order bias
                if side == "bare":
                    tb, ph = bare(src, samples, plan.precision, plan.kv, work / f"bare{i}")
                    if not t_bare or tb < min(t_bare):
                        bare_phases = ph
                    t_bare.append(tb)
                else:
                    t = time.perf_counter()
                    res = run_calibrate(spec, force=True, source=src)
                    to = time.perf_counter() - t
                    if not t_ours or to < min(t_ours):
                        breakdown = res.manifest.timings
                    t_ours.append(to)
    b, o = min(t_bare), min(t_ours)
    features = sum(breakdown.get(k, 0.0) for k in ("reference_s", "quality_s", "roundtrip_s"))
    print(
        f"model={args.model} precision={plan.precision} kv={plan.kv} calib={len(samples)}x{plan.calib_seq_len} "
        f"repeat={args.repeat} (min of runs)"
    )
    print(f"bare modelopt quantize+export: {b:.2f} s")
    print(f"calibrate stage (all):         {o:.2f} s   ratio {o / b:.3f}  (goal <= 1.05)")
    print(f"  of which quality gate + round-trip: {features:.2f} s")
    print(f"calibrate stage minus gate/round-trip: {o - features:.2f} s   ratio {(o - features) / b:.3f}")
    print("bare breakdown:  " + ", ".join(f"{k}={v:.2f}" for k, v in bare_phases.items()))
    print("stage breakdown: " + ", ".join(f"{k}={v:.2f}" for k, v in breakdown.items()))


if __name__ == "__main__":
    main()
