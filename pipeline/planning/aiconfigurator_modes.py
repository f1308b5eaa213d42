"""AIConfigurator's own aggregated-vs-disaggregated verdict (`aiconfigurator cli default`, both serving modes) beside
`plan --slo`'s (pipeline.planning.disagg) in the space both search: its checkpoint's precision, no draft, no prefix
reuse, its GPUs (8 per node). `plan --slo --estimator aiconfigurator` prints both; tests/planning/
test_disagg_agreement.py holds the verdicts against recorded runs (scripts/record_aic_disagg.py re-records them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel

from pipeline.core.errors import RunError, SpecError
from pipeline.core.table import format_table
from pipeline.planning import aiconfigurator as aic
from pipeline.planning import disagg, slo_search
from pipeline.planning.placement import capacity

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

# (registry model, precision) -> the checkpoint it reads the quantization from (its bundled model configs)
CHECKPOINTS = {("llama-70b", "bf16"): "meta-llama/Meta-Llama-3.1-70B",
               ("llama-8b", "bf16"): "meta-llama/Meta-Llama-3.1-8B",
               ("llama-70b", "fp8"): "nvidia/Llama-3.1-70B-Instruct-FP8"}
GPUS_PER_NODE = 8  # its systems' nodes (h100_sxm.yaml, h200_sxm.yaml)


class ModesVerdict(BaseModel):
    """Its best of each mode (tokens/s/gpu; None: no configuration met the SLO) and the winner."""

    agg_tokens_per_s_per_gpu: float | None
    disagg_tokens_per_s_per_gpu: float | None
    winner: str  # agg | disagg
    disagg_layout: str = ""  # e.g. "2 x prefill tp1 + 1 x decode tp2 bs 168"

    @property
    def ratio(self) -> float | None:
        """Disaggregated over aggregated tokens/s per GPU."""
        a, d = self.agg_tokens_per_s_per_gpu, self.disagg_tokens_per_s_per_gpu
        return round(d / a, 4) if a and d else None


def parse_modes_report(stdout: str) -> ModesVerdict:
    """Rank 1 of its "agg" and "disagg" Top Configurations tables and its "Best Experiment Chosen".

    Raises:
        RunError: the report names no best experiment or its rank-1 rows cannot be read (another version's layout).
    """
    chosen = re.search(r"Best Experiment Chosen: (agg|disagg) at", stdout)
    if chosen is None:
        raise RunError(f"aiconfigurator: its report names no best experiment (none met the SLO?); is it "
                       f"{aic.AIC_REQUIREMENT}?")
    disagg_part = stdout.partition("disagg Top Configurations")[2]
    agg_row = aic.top_row(stdout.partition("disagg Top Configurations")[0], "agg Top Configurations")
    disagg_row = aic.top_row(disagg_part, "")
    try:
        agg = float(agg_row["tokens/s/gpu"]) if agg_row else None
        dis = float(disagg_row["tokens/s/gpu"]) if disagg_row else None
        layout = (f"{disagg_row['(p)workers']} x prefill {disagg_row['(p)parallel']} + {disagg_row['(d)workers']} x "
                  f"decode {disagg_row['(d)parallel']} bs {disagg_row['(d)bs']}") if disagg_row else ""
    except (KeyError, ValueError) as exc:
        raise RunError(f"aiconfigurator: cannot read its agg/disagg rows ({exc}); is it "
                       f"{aic.AIC_REQUIREMENT}?") from exc
    return ModesVerdict(agg_tokens_per_s_per_gpu=agg, disagg_tokens_per_s_per_gpu=dis, winner=chosen.group(1),
                        disagg_layout=layout)


def modes_search(*, model: str, precision: str, gpu: str, total_gpus: int, lengths: tuple[int, int],
                 slo: slo_search.Slo) -> aic.AicSearch | str:
    """Its run for a plan, or why it has none (a model, precision or GPU outside its data)."""
    path = CHECKPOINTS.get((model, precision))
    if path is None:
        return (f"AIConfigurator has no checkpoint of {model} at {precision} (it reads the precision from one: "
                f"{', '.join(f'{m} {p}' for m, p in CHECKPOINTS)})")
    if gpu not in aic.SYSTEMS:
        return f"AIConfigurator has no data for GPU {gpu!r}"
    if total_gpus < 2:
        return "AIConfigurator compares disaggregated serving on 2 GPUs or more"
    return aic.AicSearch(model_path=path, system=aic.SYSTEMS[gpu], total_gpus=total_gpus, isl=lengths[0],
                         osl=lengths[1], ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms, serving_mode="auto")


def ours_in_its_space(search: aic.AicSearch, *, model: str, gpu: str, precision: str,
                      check: Callable[..., BuildSpec]) -> disagg.ServingModes:
    """`plan --slo`'s agg and disagg bests at its precision, without a draft or prefix reuse, on its GPUs.

    Raises:
        SpecError: no aggregated configuration meets the SLO by our estimate.
    """
    nodes = max(1, search.total_gpus // GPUS_PER_NODE)
    spec = check(model=model, gpu=gpu, precision=precision, gpu_count=min(search.total_gpus, GPUS_PER_NODE),
                 nodes=nodes, runtime=disagg.RUNTIME)
    found = slo_search.search(spec, slo_search.Slo(search.ttft_ms, search.tpot_ms),
                              slo_search.Traffic(search.isl, search.osl), check=check, speculation=False)
    modes = disagg.serving_modes(spec, found, check=check)
    if modes is None:
        raise SpecError(f"plan --slo: nothing aggregated meets {search.ttft_ms:g}/{search.tpot_ms:g} ms for {model}; "
                        f"nearest miss: {found.nearest_miss}")
    return modes


def run(search: aic.AicSearch, exe: str) -> tuple[str, ModesVerdict]:
    """Run its comparison; the report's text and its verdict."""
    done = aic.run_offline(search.argv(exe), 2 * aic.RUN_TIMEOUT_S)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RunError(f"aiconfigurator cli default failed (exit {done.returncode}): {last[0][:300]}")
    report = done.stdout[: aic.OUTPUT_CAP]
    return report, parse_modes_report(report)


def second_opinion(spec: BuildSpec, result: slo_search.SloSearch, *, check: Callable[..., BuildSpec]) -> str:
    """`plan --slo --estimator aiconfigurator`: its verdict beside ours in its space (the pick's precision), or one
    line saying why there is none."""
    pick = result.pick
    precision = pick.precision if pick is not None else spec.quantization.precision
    search = modes_search(model=spec.model.name, precision=precision, gpu=spec.hardware.gpu,
                          total_gpus=capacity(spec.hardware), lengths=(result.traffic.input_len,
                                                                       result.traffic.output_len), slo=result.slo)
    if isinstance(search, str):
        return f"aiconfigurator: no agg-vs-disagg comparison: {search}"
    ours = ours_in_its_space(search, model=spec.model.name, gpu=spec.hardware.gpu, precision=precision, check=check)
    _, theirs = run(search, aic.ensure_installed())
    return format_beside(ours, theirs, " ".join(search.argv("aiconfigurator")))


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def format_beside(ours: disagg.ServingModes, theirs: ModesVerdict, command: str) -> str:
    """Both bests per mode, the disagg/agg ratio and the verdict, ours (in its space) beside its."""
    d = ours.disagg
    rows = [("in its space", "plan --slo", f"AIConfigurator ({aic.AIC_REQUIREMENT})"),
            ("aggregated tok/s/GPU", f"{ours.agg_tokens_per_s_per_gpu:,.0f} ({ours.agg})",
             _fmt(theirs.agg_tokens_per_s_per_gpu)),
            ("disaggregated tok/s/GPU", f"{d.tokens_per_s_per_gpu:,.0f} ({d.label()})" if d else "-",
             f"{_fmt(theirs.disagg_tokens_per_s_per_gpu)} ({theirs.disagg_layout})" if theirs.disagg_layout else "-"),
            ("disagg / agg", _fmt(ours.ratio, ".2f"), _fmt(theirs.ratio, ".2f")),
            ("verdict", ours.winner, theirs.winner)]
    return "\n".join([format_table(rows), f"command: {command}"])
