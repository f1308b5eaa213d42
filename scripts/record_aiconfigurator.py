"""Record AIConfigurator estimates for the planner's calibration table (tests/data/aiconfigurator_0.12.json).

    PIPELINE_AICONFIGURATOR=/path/to/aiconfigurator python scripts/record_aiconfigurator.py [--out FILE]

Without the variable it installs AIConfigurator into the pipeline cache venv first (pipeline.planning.aiconfigurator).
Each record keeps the exact command line, the parsed numbers and the status (ok / oom / no_data). Cases whose
command the output file already holds are kept, not rerun (delete the file to record everything again).

The first cases run as `cli estimate` subprocesses (their report parsed); the sweep (`sweep_cases`: 8B/70B/405B,
TP 1/2/4/8, 1k/256, 2k/512, 8k/1k, batch 1-256, H100 SXM and H200, FP8 and BF16) runs the same estimate through
AIConfigurator's Python API (`aiconfigurator.cli.api.cli_estimate`, what `cli estimate` calls) in one process of
its venv, a second per case instead of five.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import threading
from pathlib import Path

from pipeline.planning.aiconfigurator import AicCase, AicResult, ensure_installed, run_case

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


SWEEP_MODELS = {"llama-8b": "meta-llama/Meta-Llama-3.1-8B", "llama-70b": "meta-llama/Meta-Llama-3.1-70B",
                "llama-405b": "meta-llama/Meta-Llama-3.1-405B"}
SWEEP_LENGTHS = ((1024, 256), (2048, 512), (8192, 1024))
SWEEP_BATCHES = (1, 8, 16, 32, 64, 128, 256)


def sweep_cases() -> list[tuple[str, AicCase]]:
    """The fit's grid: every model x system x precision x TP x lengths x batch (out-of-memory cases are recorded)."""
    out = []
    for model, path in SWEEP_MODELS.items():
        for system in ("h100_sxm", "h200_sxm"):
            for quant in (FP8, BF16):
                for tp in (1, 2, 4, 8):
                    for isl, osl in SWEEP_LENGTHS:
                        out += [(model, AicCase(model_path=path, system=system, tp=tp, isl=isl, osl=osl, batch=b,
                                                **quant)) for b in SWEEP_BATCHES]
    return out


# Runs in AIConfigurator's venv: JSON cases on stdin, one JSON result per line on stdout.
IN_PROCESS = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from aiconfigurator.cli.api import cli_estimate
for line in sys.stdin:
    c = json.loads(line)
    try:
        r = cli_estimate(c["model_path"], c["system"], isl=c["isl"], osl=c["osl"], batch_size=c["batch"],
                         tp_size=c["tp"], gemm_quant_mode=c["gemm"], kvcache_quant_mode=c["kv"],
                         fmha_quant_mode="fp8" if c["kv"] == "fp8" else "bfloat16", prefix=c["prefix"])
        raw = r.raw
        out = dict(status="ok", backend_version=r.backend_version, ttft_ms=round(float(r.ttft), 3),
                   tpot_ms=round(float(r.tpot), 3), tokens_per_s=round(float(raw["tokens/s"]), 2),
                   tokens_per_s_per_gpu=round(float(raw["tokens/s/gpu"]), 2), memory_gb=round(float(raw["memory"]), 2),
                   kv_capacity_exceeded=r.kv_cache_warning is not None)
    except Exception as exc:
        text = str(exc)
        status = "oom" if "OOM" in text else "no_data"
        out = dict(status=status, reason="out of GPU memory at this batch" if status == "oom" else text[:200])
    print(json.dumps(out), flush=True)
"""


def run_in_process(python: Path, todo: list[AicCase], workers: int = 2):
    """Yield (case, result) as AIConfigurator processes answer (`workers` of them, each taking every n-th case)."""
    parts = [todo[i::workers] for i in range(workers)]
    answers: queue.Queue = queue.Queue()
    threads = [threading.Thread(target=lambda p=p: [answers.put(a) for a in _one_process(python, p)], daemon=True)
               for p in parts if p]
    for t in threads:
        t.start()
    for _ in todo:
        yield answers.get()


def _one_process(python: Path, todo: list[AicCase]):
    proc = subprocess.Popen([str(python), "-c", IN_PROCESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"})

    def feed() -> None:  # a thread: the child's answers must be read while the cases are still being written
        proc.stdin.write("".join(c.model_dump_json() + "\n" for c in todo))
        proc.stdin.close()

    threading.Thread(target=feed, daemon=True).start()
    for case in todo:
        yield case, AicResult(**json.loads(proc.stdout.readline()))
    proc.wait()


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

    def record(model: str, case: AicCase, result: AicResult) -> None:
        records.append(dict(model=model, **case.model_dump(), command=" ".join(case.argv("aiconfigurator")),
                            **result.model_dump()))
        print(f"{model} {case.system} tp{case.tp} {case.isl}/{case.osl} b{case.batch} {case.gemm}: {result.status} "
              f"{result.tokens_per_s} tok/s ttft {result.ttft_ms} tpot {result.tpot_ms} mem {result.memory_gb}",
              flush=True)

    seen = set()
    for model, case in cases():
        command = " ".join(case.argv("aiconfigurator"))
        seen.add(command)
        if command in have:
            records.append(have[command])
        else:
            record(model, case, run_case(case, exe))
    todo = []
    for model, case in sweep_cases():
        command = " ".join(case.argv("aiconfigurator"))
        if command in seen:
            continue
        seen.add(command)
        if command in have:
            records.append(have[command])
        else:
            todo.append((model, case))
    models = dict((id(c), m) for m, c in todo)
    out.parent.mkdir(parents=True, exist_ok=True)
    for n, (case, result) in enumerate(run_in_process(python, [c for _, c in todo]), 1):
        record(models[id(case)], case, result)
        if n % 50 == 0:  # keep what is recorded if the run stops
            out.write_text(json.dumps(dict(aiconfigurator_version=version, records=records), indent=1) + "\n")
    out.write_text(json.dumps(dict(aiconfigurator_version=version, records=records), indent=1) + "\n")


if __name__ == "__main__":
    main()
