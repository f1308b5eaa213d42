"""TP the user left unset, chosen by cost: the cheapest $ per 1M output tokens at the default operating point.

A GPU target whose spec gives neither `tp` nor `pp` (nor MoE EP, draft TP or draft GPUs, which depend on them) is
planned at every TP of `planner.TP_CHOICES` within one node; each candidate gets its own engine limits
(`limits_choice`) and is estimated at its operating point (`planner.operating_point`: the lowest $ per 1M with TPOT
within `planner.DEFAULT_TPOT_TARGET_MS`). The pick is the cheapest that fits and meets the target (fewer GPUs on a
tie), else the cheapest that fits; its reason names the runner-up. `--tp` (or `tp:` in a spec file) always wins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.core.runtimes import runtime_of
from pipeline.core.errors import SpecError
from pipeline.planning.placement import node_gpus
from pipeline.planning.planner import DEFAULT_TPOT_TARGET_MS, TP_CHOICES, CapacityPlan, plan_capacity

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

_DEPENDENT = {"parallelism": ("tp", "pp", "moe_ep"), "speculation": ("draft_tp", "draft_gpu_device_ids")}


def placement_given(spec: BuildSpec) -> bool:
    """Whether the spec (flags or file) fixes the placement, or the target is not planned on GPUs."""
    if not runtime_of(spec).gpu:
        return True
    return any(name in getattr(spec, section).model_fields_set for section, names in _DEPENDENT.items()
               for name in names)


def _line(p: CapacityPlan) -> str:
    cost = f"${p.cost_per_1m_output_tokens_usd:.2f}" if p.cost_per_1m_output_tokens_usd is not None else "n/a"
    return (f"tp={p.tp} ({p.gpus} x {p.gpu}): {cost} per 1M at batch {p.decode_batch}, TPOT "
            f"{p.tpot_ms_estimate:.0f} ms, {p.output_tokens_per_s_estimate:,.0f} tok/s")


def choose_placement(spec: BuildSpec, at_tp: Callable[[int], BuildSpec]) -> BuildSpec:
    """`spec`, or the spec `at_tp(tp)` builds for the cheapest TP, with `placement_reason` saying why.

    `at_tp` resolves the same request at another TP with its engine limits chosen (a candidate whose rules refuse
    that TP is skipped).
    """
    if placement_given(spec):
        return spec
    plans: list[tuple[CapacityPlan, BuildSpec]] = []
    for tp in TP_CHOICES:
        if tp > node_gpus(spec.hardware):
            break
        try:
            candidate = spec if tp == spec.parallelism.tp else at_tp(tp)
            plan = plan_capacity(candidate)
        except SpecError:
            continue
        if plan.fits and plan.cost_per_1m_output_tokens_usd is not None:
            plans.append((plan, candidate))
    if not plans:
        return spec  # nothing fits: `check` says so, with the minimum TP

    def rank(item: tuple[CapacityPlan, BuildSpec]) -> tuple[bool, float | None, int]:
        p = item[0]
        meets = p.tpot_ms_estimate <= DEFAULT_TPOT_TARGET_MS
        return (not meets, p.cost_per_1m_output_tokens_usd, p.gpus)

    plans.sort(key=rank)
    (best, chosen), runner = plans[0], (plans[1][0] if len(plans) > 1 else None)
    meets = best.tpot_ms_estimate <= DEFAULT_TPOT_TARGET_MS
    why = (f"tp={best.tp}: the cheapest placement on {best.gpu} "
           + (f"with TPOT <= {DEFAULT_TPOT_TARGET_MS:g} ms" if meets else
              f"that fits (none keeps TPOT <= {DEFAULT_TPOT_TARGET_MS:g} ms)")
           + f": {_line(best)}" + (f"; runner-up {_line(runner)}" if runner else "")
           + "; --tp to choose")
    return chosen.with_notes(placement_reason=why)
