"""The speculation break-even: the acceptance rate per drafted token below which the spec's speculation mode
(draft-target or ngram) yields fewer output tokens per second than the target alone, at the planned batch, on the
same GPUs (so it also costs more per token).

Both sides come from the fitted perf model (`planner.serving_estimate`, which costs each mode's drafting); the tok/s
of speculation grows with the acceptance rate, so the break-even is found by bisection on 0..1. N-gram drafts cost
no forward pass, so its break-even is lower than draft-target's at the same K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.core.gpus import GPUS
from pipeline.core.spec import BuildSpec
from pipeline.planning.planner import plan_capacity, serving_estimate
from pipeline.planning.speculation_modes import without_speculation

BISECTION_STEPS = 30  # 2^-30 of the acceptance range: far below what a rule threshold needs


@dataclass(frozen=True)
class BreakEven:
    acceptance: float  # 0..1; 1.0 when no acceptance makes speculation pay at this batch
    batch: int  # the batch the estimate is made at (the plan's decode batch, capped by the speculation gate)
    tokens_per_s_target_only: float
    pays_off: bool  # some acceptance <= 1 beats the target alone


def speculation_break_even(spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None,
                           prefix_hit_ratio: float = 0.0) -> BreakEven | None:
    """The acceptance rate at which the spec's speculation mode matches the target alone in tok/s; None without
    speculation."""
    if spec.speculation_mode is None:
        return None
    plan = plan_capacity(spec, input_len=input_len, output_len=output_len, prefix_hit_ratio=prefix_hit_ratio)
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
