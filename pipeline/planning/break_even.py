"""The speculation break-even: the acceptance rate per drafted token below which the spec's speculation mode
(draft-target, eagle3 or ngram) yields fewer output tokens per second than the target alone, at the planned batch,
on the same GPUs (so it also costs more per token); and the break-even batch, the largest batch at which the mode at
a given acceptance still beats the target alone (where its load gate, max_batch_for_speculation, belongs).

Both sides come from the fitted perf model (`planner.serving_estimate`, which costs each mode's drafting); the tok/s
of speculation grows with the acceptance rate, so the break-even is found by bisection on 0..1. N-gram drafts cost
no forward pass and an EAGLE-3 head one layer, so their break-evens are lower than draft-target's at the same K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.core.gpus import GPUS
from pipeline.core.registry import MAX_BATCH
from pipeline.core.spec import BuildSpec
from pipeline.planning.planner import OPERATING_BATCHES, plan_capacity, serving_estimate
from pipeline.planning.speculation_modes import without_speculation

BISECTION_STEPS = 30  # 2^-30 of the acceptance range: far below what a rule threshold needs


@dataclass(frozen=True)
class BreakEven:
    acceptance: float  # 0..1; 1.0 when no acceptance makes speculation pay at this batch
    batch: int  # the batch the estimate is made at (the plan's decode batch, capped by the speculation gate)
    tokens_per_s_target_only: float
    pays_off: bool  # some acceptance <= 1 beats the target alone


def speculation_break_even(spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None,
                           prefix_hit_ratio: float = 0.0, batch: int | None = None) -> BreakEven | None:
    """The acceptance rate at which the spec's speculation mode matches the target alone in tok/s, at `batch`
    (None: the plan's decode batch, capped by the load gate); None without speculation."""
    if spec.speculation_mode is None:
        return None
    plan = plan_capacity(spec, input_len=input_len, output_len=output_len, prefix_hit_ratio=prefix_hit_ratio)
    if batch is None:
        batch = max(1, min(plan.decode_batch, spec.speculation.max_batch_for_speculation))
    gpu = GPUS[spec.hardware.gpu]
    common: dict[str, Any] = dict(tp=spec.parallelism.tp, input_len=plan.input_len, output_len=plan.output_len,
                                  prefix_hit_ratio=prefix_hit_ratio)
    plain, _ = serving_estimate(without_speculation(spec), gpu, batch=batch, acceptance=0.0, **common)

    def speculative_tok_s(acceptance: float) -> float:
        est, _ = serving_estimate(spec, gpu, batch=batch, acceptance=acceptance, **common)
        return est.output_tokens_per_s

    base = plain.output_tokens_per_s
    if speculative_tok_s(1.0) <= base:
        return BreakEven(1.0, batch, round(base, 1), pays_off=False)
    low, high = 0.0, 1.0
    if speculative_tok_s(low) >= base:
        return BreakEven(0.0, batch, round(base, 1), pays_off=True)
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if speculative_tok_s(mid) < base else (low, mid)
    return BreakEven(round(high, 4), batch, round(base, 1), pays_off=True)


def break_even_batch(spec: BuildSpec, *, acceptance: float | None, ceiling: int, input_len: int, output_len: int,
                     prefix_hit_ratio: float = 0.0) -> int:
    """The largest batch (of `planner.OPERATING_BATCHES` up to `ceiling`) at which the spec's speculation mode at
    `acceptance` (None: its default) yields more tok/s than the target alone, the load gate lifted; 0 when it pays
    at none."""
    if spec.speculation_mode is None:
        return 0
    ungated = spec.model_copy(update={"speculation": spec.speculation.model_copy(
        update={"max_batch_for_speculation": MAX_BATCH})})
    gpu = GPUS[spec.hardware.gpu]
    common: dict[str, Any] = dict(tp=spec.parallelism.tp, input_len=input_len, output_len=output_len,
                                  prefix_hit_ratio=prefix_hit_ratio)
    best = 0
    for batch in sorted({b for b in OPERATING_BATCHES if b < ceiling} | {ceiling}):
        spec_est, _ = serving_estimate(ungated, gpu, batch=batch, acceptance=acceptance, **common)
        plain_est, _ = serving_estimate(without_speculation(spec), gpu, batch=batch, acceptance=0.0, **common)
        if spec_est.output_tokens_per_s <= plain_est.output_tokens_per_s:
            break  # the gain only shrinks with the batch (drafting and verification grow with it)
        best = batch
    return best
