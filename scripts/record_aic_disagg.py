"""Record AIConfigurator's aggregated-vs-disaggregated verdicts for the agreement test.

    PIPELINE_AICONFIGURATOR=/path/to/aiconfigurator python scripts/record_aic_disagg.py [NAME ...]

For each case of `CASES` (or those named): run `aiconfigurator cli default --serving-mode auto`
(pipeline.planning.aiconfigurator_modes.modes_search), write its report to
tests/data/aiconfigurator_disagg/NAME.stdout and the index (command, its verdict) to
tests/data/aiconfigurator_disagg.json; print ours beside it. Offline: it reads its bundled configs and databases
(~20-40 s a case).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.planning import aiconfigurator as aic
from pipeline.planning import aiconfigurator_modes as modes
from pipeline.planning.slo_search import Slo
from pipeline.stages.check import resolve_checked_spec

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
INDEX = DATA / "aiconfigurator_disagg.json"
# (name, model, precision, GPU, total GPUs, isl, osl, TTFT ms, TPOT ms). The first three are the cases
# (NVIDIA-published regimes: long prompts, chat, long generations); the rest were not looked at before the model
# was written: prefill-heavy, decode-heavy, tight and loose SLOs, 8B and 70B, BF16 and FP8, H100 and H200.
CASES = [
    ("70b-fp8-16g-4000-500", "llama-70b", "fp8", "h100-sxm", 16, 4000, 500, 1000, 30),
    ("70b-fp8-8g-1024-256", "llama-70b", "fp8", "h100-sxm", 8, 1024, 256, 1000, 30),
    ("70b-fp8-8g-256-2048", "llama-70b", "fp8", "h100-sxm", 8, 256, 2048, 1000, 30),
    ("70b-fp8-8g-4000-500", "llama-70b", "fp8", "h100-sxm", 8, 4000, 500, 1000, 30),
    ("70b-fp8-8g-8000-200", "llama-70b", "fp8", "h100-sxm", 8, 8000, 200, 2000, 40),
    ("70b-fp8-16g-2048-1024", "llama-70b", "fp8", "h100-sxm", 16, 2048, 1024, 1000, 20),
    ("70b-fp8-8g-512-512", "llama-70b", "fp8", "h100-sxm", 8, 512, 512, 500, 25),
    ("70b-fp8-8g-1024-1024", "llama-70b", "fp8", "h100-sxm", 8, 1024, 1024, 600, 15),
    ("70b-fp8-h200-8g-2048-512", "llama-70b", "fp8", "h200", 8, 2048, 512, 800, 25),
    ("70b-bf16-16g-3000-300", "llama-70b", "bf16", "h100-sxm", 16, 3000, 300, 1500, 40),
    ("8b-bf16-4g-2048-256", "llama-8b", "bf16", "h100-sxm", 4, 2048, 256, 300, 15),
    ("8b-bf16-8g-256-1024", "llama-8b", "bf16", "h100-sxm", 8, 256, 1024, 500, 10),
    ("8b-bf16-8g-4096-128", "llama-8b", "bf16", "h100-sxm", 8, 4096, 128, 500, 20),
]


def record(case: tuple, exe: str) -> dict:
    name, model, precision, gpu, total, isl, osl, ttft, tpot = case
    search = modes.modes_search(model=model, precision=precision, gpu=gpu, total_gpus=total, lengths=(isl, osl),
                                slo=Slo(ttft, tpot))
    assert not isinstance(search, str), search
    report, theirs = modes.run(search, exe)
    (DATA / "aiconfigurator_disagg").mkdir(exist_ok=True)
    (DATA / "aiconfigurator_disagg" / f"{name}.stdout").write_text(report)
    ours = modes.ours_in_its_space(search, model=model, gpu=gpu, precision=precision, check=resolve_checked_spec)
    print(f"{name}: theirs {theirs.winner} {theirs.ratio}, ours {ours.winner} {ours.ratio}")
    return dict(name=name, model=model, precision=precision, gpu=gpu, search=search.model_dump(),
                command=" ".join(search.argv("aiconfigurator")), verdict=theirs.model_dump())


def main(names: list[str]) -> None:
    exe = aic.ensure_installed()
    old = {c["name"]: c for c in json.loads(INDEX.read_text())["cases"]} if INDEX.is_file() else {}
    cases = [record(c, exe) if not names or c[0] in names else old[c[0]] for c in CASES]
    index = {"aiconfigurator_version": "0.12.0", "backend": "trtllm", "cases": cases}
    INDEX.write_text(json.dumps(index, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
