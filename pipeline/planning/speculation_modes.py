"""Speculation modes as the planner models them: one row per mode (`MODES`) saying whether drafting runs a draft
model and what acceptance to assume when none is measured. A mode joins the planner by adding its row.

Acceptance is the rate per drafted token `a` that perf_model uses: a target step verifying K drafts yields
(1 - a^(K+1)) / (1 - a) tokens, the mean accepted length (AL, the bonus token included) that benchmarks publish.
`acceptance_for_length` inverts it, so a published AL at its K becomes the rate the planner applies at any K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.core.errors import SpecError
from pipeline.core.spec import DRAFT_TARGET, NGRAM
from pipeline.planning.perf_model import expected_tokens_per_step

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

BISECTION_STEPS = 40  # 2^-40 of the acceptance range


def acceptance_for_length(mean_accepted: float, draft_len: int) -> float:
    """The acceptance rate per drafted token at which K = `draft_len` drafts yield `mean_accepted` tokens per
    target step (the inverse of `expected_tokens_per_step`); 1 <= mean_accepted <= K + 1."""
    if draft_len < 1 or not 1.0 <= mean_accepted <= draft_len + 1:
        raise SpecError(f"a mean accepted length of {mean_accepted:g} at K={draft_len} must be within 1..K+1")
    low, high = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_step(mid, draft_len) < mean_accepted else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class ModeModel:
    """How the planner costs one speculation mode."""

    name: str
    draft_model: bool  # drafting runs a draft model: K forward passes per step, its weights and KV in memory
    acceptance: float  # the default rate per drafted token (`invoke bench` measures yours)
    source: str  # where the default comes from


# TensorRT-LLM 1.2.0 docs, blogs/tech_blog/blog7_NGram_performance_Analysis_And_Auto_Enablement: Llama-4-Scout FP8,
# 8xB200: "Average accepted length (AL) is ~1.3 in generic chat (MT-Bench, Magpie with the first round of
# conversation) and can exceed 4.0 on highly repetitive data like a translation task"; Magpie first turn AL 1.37 at
# max_matching_ngram_size 3, max_draft_len 5 (1.66 on the second turn; 3.4-4.7 on translation). The planner assumes
# generic chat's first turn: repetitive traffic accepts more (measure it with `invoke bench`, pass --acceptance).
NGRAM_PUBLISHED_LENGTH = 1.37
NGRAM_PUBLISHED_DRAFT_LEN = 5

MODES: dict[str, ModeModel] = {
    DRAFT_TARGET: ModeModel(DRAFT_TARGET, draft_model=True, acceptance=0.7,
                            source="the planner's draft-target assumption"),
    NGRAM: ModeModel(NGRAM, draft_model=False,
                     acceptance=round(acceptance_for_length(NGRAM_PUBLISHED_LENGTH, NGRAM_PUBLISHED_DRAFT_LEN), 4),
                     source=f"TensorRT-LLM 1.2.0 n-gram blog: accepted length {NGRAM_PUBLISHED_LENGTH} at "
                            f"K={NGRAM_PUBLISHED_DRAFT_LEN} on generic chat"),
}


def mode_model(mode: str) -> ModeModel:
    return MODES[mode]


def measured_mode(spec: BuildSpec) -> str:
    """The mode a given (or bench-measured) acceptance rate belongs to: the spec's, else draft-target (the one
    mode with a draft to measure before the modes)."""
    return spec.speculation_mode or DRAFT_TARGET


def acceptances(spec: BuildSpec, given: float | None) -> dict[str, float]:
    """The acceptance rate per mode: `given` for the spec's mode (`measured_mode`), each other mode's default."""
    rates = {name: m.acceptance for name, m in MODES.items()}
    if given is not None:
        rates[measured_mode(spec)] = given
    return rates


def without_speculation(spec: BuildSpec) -> BuildSpec:
    """`spec` with no speculation (no draft model, no mode): the baseline a mode is weighed against."""
    if spec.speculation_mode is None:
        return spec
    return spec.model_copy(update={"draft_model": None, "speculation": spec.speculation.model_copy(
        update={"speculative_decoding": None, "max_matching_ngram_size": None})})
