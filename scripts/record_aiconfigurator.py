"""Record AIConfigurator estimates for the planner's calibration table (tests/data/aiconfigurator_0.12.json).

    PIPELINE_AICONFIGURATOR=/path/to/aiconfigurator python scripts/record_aiconfigurator.py [--out FILE]

Without the variable it installs AIConfigurator into the pipeline cache venv first (pipeline.planning.aiconfigurator).
Each record keeps the exact command line, the parsed numbers and the status (ok / oom / no_data). Cases whose
command the output file already holds are kept, not rerun (delete the file to record everything again).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from pipeline.planning.aiconfigurator import AicCase, ensure_installed, run_case

LENGTHS = ((1024, 256), (2048, 512))
FP8 = dict(gemm="fp8_static", kv="fp8")
BF16 = dict(gemm="bfloat16", kv="bfloat16")


def cases() -> list[tuple[str, AicCase]]:
    """(registry model, case): FP8 sweeps (70B TP 1/4/8, 8B TP 1/2, 1024/256 and 2048/512, batch 1-64), memory-edge probes, BF16 and prefix points."""
    out = []

    def add(model, path, tp, isl, osl, batches, quant, prefix=0):
        for b in batches:
            out.append((model, AicCase(model_path=path, system="h100_sxm", tp=tp, isl=isl, osl=osl, batch=b,
                                       prefix=prefix, **quant)))

    l70, l8 = "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-8B"
    for isl, osl in LENGTHS:
        for tp in (1, 4, 8):
            add("llama-70b", l70, tp, isl, osl, (1, 8, 32, 64), FP8)
        for tp in (1, 2):
            add("llama-8b", l8, tp, isl, osl, (1, 8, 32, 64), FP8)
    add("llama-70b", l70, 1, 1024, 256, (16, 24, 28, 33, 34, 36, 38, 48), FP8)
    add("llama-70b", l70, 1, 2048, 512, (4, 12, 16, 17, 18, 20, 24), FP8)
    add("llama-70b", l70, 2, 1024, 256, (1, 32, 64), FP8)
    add("llama-8b", l8, 1, 1024, 256, (128,), FP8)
    add("llama-8b", l8, 1, 1024, 256, (1, 32, 64), BF16)
    add("llama-70b", l70, 4, 1024, 256, (1, 32, 64), BF16)
    add("llama-70b", l70, 8, 1024, 256, (32,), BF16)
    add("llama-70b", l70, 2, 1024, 256, (1, 8, 16, 32, 40, 44, 48), BF16)
    add("llama-70b", l70, 4, 1024, 256, (32,), FP8, prefix=512)
    add("llama-8b", l8, 1, 1024, 256, (32,), FP8, prefix=512)
    add("llama-70b", l70, 4, 1024, 256, (64,), dict(gemm="int4_wo", kv="fp8"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/data/aiconfigurator_0.12.json")
    args = parser.parse_args()
    exe = ensure_installed()
    python = Path(exe).with_name("python")
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('aiconfigurator'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.is_file() else {}
    if old and old.get("aiconfigurator_version") != version:
        old = {}
    have = {r["command"]: r for r in old.get("records", [])}
    records = []
    for model, case in cases():
        argv = case.argv("aiconfigurator")
        if " ".join(argv) in have:
            records.append(have[" ".join(argv)])
            continue
        result = run_case(case, exe)
        records.append(dict(model=model, **case.model_dump(), command=" ".join(argv), **result.model_dump()))
        print(f"{model} tp{case.tp} {case.isl}/{case.osl} b{case.batch} {case.gemm}: {result.status} "
              f"{result.tokens_per_s} tok/s ttft {result.ttft_ms} tpot {result.tpot_ms} mem {result.memory_gb} kv_exceeded {result.kv_capacity_exceeded}",
              flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(aiconfigurator_version=version, records=records), indent=1) + "\n")


if __name__ == "__main__":
    main()
