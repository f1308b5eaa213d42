"""Record AIConfigurator's configuration search and its estimate of `plan --slo`'s pick, for the agreement test.

    PIPELINE_AICONFIGURATOR=/path/to/aiconfigurator python scripts/record_aic_slo.py

For each case of `CASES`: run `aiconfigurator cli default` (aggregated serving only), run our search in its space
(pipeline.planning.aiconfigurator.pick_in_its_space: its precision, no draft, no prefix reuse, its GPUs), run
`aiconfigurator cli estimate` on our pick; write the reports under tests/data/aiconfigurator_slo/ and the index
(commands, picks) to tests/data/aiconfigurator_slo.json. Offline: it reads its bundled configs and databases.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.planning import aiconfigurator as aic
from pipeline.stages.check import resolve_checked_spec

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
# (name, model, isl, osl, TTFT ms, TPOT ms): the `plan --slo` acceptance case and a tighter, shorter one.
CASES = [
    ("llama-70b-2048-512", "llama-70b", 2048, 512, 500, 40),
    ("llama-8b-2048-512", "llama-8b", 2048, 512, 500, 40),
    ("llama-70b-1024-256", "llama-70b", 1024, 256, 300, 20),
    ("llama-8b-1024-256", "llama-8b", 1024, 256, 300, 20),
]


def record(name: str, model: str, isl: int, osl: int, ttft: float, tpot: float, exe: str) -> dict:
    search = aic.AicSearch(model_path=aic.MODEL_PATHS[model], system="h100_sxm", total_gpus=8, isl=isl, osl=osl,
                           ttft_ms=ttft, tpot_ms=tpot)
    out = DATA / "aiconfigurator_slo"
    out.mkdir(exist_ok=True)
    report, theirs = aic.run_search(search, exe)
    (out / f"{name}.search.stdout").write_text(report)
    ours = aic.pick_in_its_space(search, model=model, gpu="h100-sxm", check=resolve_checked_spec)
    case = aic.pick_case(ours, model=model, gpu="h100-sxm", isl=isl, osl=osl)
    done = aic.run_offline(case.argv(exe), aic.RUN_TIMEOUT_S)
    (out / f"{name}.estimate.stdout").write_text(done.stdout[: aic.OUTPUT_CAP])
    (out / f"{name}.estimate.stderr").write_text(done.stderr[-aic.OUTPUT_CAP:])
    estimate = aic.parse_report(done.stdout, done.stderr, done.returncode)
    return dict(name=name, model=model, search_command=" ".join(search.argv("aiconfigurator")),
                search=search.model_dump(), aic_pick=theirs.model_dump(),
                our_pick=dict(precision=ours.precision, kv_cache=ours.kv_cache, tp=ours.tp, pp=ours.pp,
                              batch=ours.max_batch, tokens_per_s_per_gpu=ours.tokens_per_s_per_gpu),
                estimate_command=" ".join(case.argv("aiconfigurator")), estimate_returncode=done.returncode,
                estimate=estimate.model_dump())


def main() -> None:
    exe = aic.ensure_installed()
    records = [record(*case, exe=exe) for case in CASES]
    index = {"aiconfigurator_version": "0.12.0", "system": "h100_sxm", "backend": "trtllm", "cases": records}
    (DATA / "aiconfigurator_slo.json").write_text(json.dumps(index, indent=1) + "\n")
    for r in records:
        ratio = r["aic_pick"]["tokens_per_s_per_gpu"] / r["estimate"]["tokens_per_s_per_gpu"]
        print(f"{r['name']}: theirs {r['aic_pick']}, ours {r['our_pick']}: our cost / theirs = {ratio:.3f}")


if __name__ == "__main__":
    main()
