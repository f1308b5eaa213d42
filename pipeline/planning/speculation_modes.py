"""Speculation modes as the planner models them: one row per mode (`MODES`) saying what drafting runs (a draft model,
an EAGLE-3 head inside the target, or nothing) and what acceptance to assume when none is measured. A mode joins the
planner by adding its row.

Acceptance is the rate per drafted token `a` that perf_model uses: a target step verifying K drafts yields
(1 - a^(K+1)) / (1 - a) tokens, the mean accepted length (AL, the bonus token included) that benchmarks publish.
`acceptance_for_length` inverts it, so a published AL at its K becomes the rate the planner applies at any K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPU
from pipeline.core.registry import Architecture, ModelEntry
from pipeline.core.spec import DRAFT_TARGET, EAGLE3, NGRAM
from pipeline.planning.perf_model import Eagle3HeadCost, expected_tokens_per_step, kv_bytes_per_token

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
    head: bool = False  # drafting runs an EAGLE-3 head inside the target: K head steps, its weights and one KV layer


# TensorRT-LLM 1.2.0 docs, blogs/tech_blog/blog7_NGram_performance_Analysis_And_Auto_Enablement: Llama-4-Scout FP8,
# 8xB200: "Average accepted length (AL) is ~1.3 in generic chat (MT-Bench, Magpie with the first round of
# conversation) and can exceed 4.0 on highly repetitive data like a translation task"; Magpie first turn AL 1.37 at
# max_matching_ngram_size 3, max_draft_len 5 (1.66 on the second turn; 3.4-4.7 on translation). The planner assumes
# generic chat's first turn: repetitive traffic accepts more (measure it with `invoke bench`, pass --acceptance).
NGRAM_PUBLISHED_LENGTH = 1.37
NGRAM_PUBLISHED_DRAFT_LEN = 5

# EAGLE-3 drafts a linear chain in TensorRT-LLM 1.2's PyTorch path (docs features/speculative-decoding: "each
# request uses a single sequence of draft tokens with length max_draft_len"), so the default comes from published
# chain figures, never the paper's tree ones: nebius/EAGLE3-Llama-3.3-70B-Instruct's model card measured public heads
# at temperature 1 with a K=7 chain, MT-bench accepted length 2.77 for yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (the
# registry's 8B head) and 2.88 for RedHatAI's Llama-3.3-70B head; the planner takes the lower (generic chat; code and
# math accept more: 3.3-3.6). The rate fitted at K=7 reproduces the per-K chain curve of RedHatAI's Llama-4-Maverick
# head (`MAVERICK_CHAIN_LENGTHS`) within 7 % at every K from 1 to 7, slightly low: fitting at K=7 is safe at K=3-4.
EAGLE3_PUBLISHED_LENGTH = 2.77
EAGLE3_PUBLISHED_DRAFT_LEN = 7
# RedHatAI/Llama4-Maverick-17B-128E-Instruct-speculator.eagle3 model card: chain accepted length at K = 1..7
MAVERICK_CHAIN_LENGTHS = {"coding": (1.83, 2.45, 2.94, 3.26, 3.47, 3.57, 3.62),
                          "math": (1.86, 2.56, 3.08, 3.53, 3.73, 3.91, 4.02),
                          "summarization": (1.69, 2.12, 2.37, 2.52, 2.60, 2.63, 2.63)}
# A target with no registered head is planned with one of the published recipe at its width (EAGLE3-LLaMA3.1-
# Instruct-8B's config: one decoder layer of the target's shape, draft vocabulary 32000, 16-bit weights, K=3 as the
# registry's heads default to), labelled an estimate.
EAGLE3_RECIPE_DRAFT_VOCAB = 32000
EAGLE3_RECIPE_DRAFT_LEN = 3
EAGLE3_DEFAULT_CAPTURE = 3  # TensorRT-LLM's default eagle3_layers_to_capture: (1, L/2 - 1, L - 4)
HEAD_PRECISION = "fp16"  # the published heads' torch_dtype; TensorRT-LLM serves a head in its own dtype

MODES: dict[str, ModeModel] = {
    DRAFT_TARGET: ModeModel(DRAFT_TARGET, draft_model=True, acceptance=0.7,
                            source="the planner's draft-target assumption"),
    NGRAM: ModeModel(NGRAM, draft_model=False,
                     acceptance=round(acceptance_for_length(NGRAM_PUBLISHED_LENGTH, NGRAM_PUBLISHED_DRAFT_LEN), 4),
                     source=f"TensorRT-LLM 1.2.0 n-gram blog: accepted length {NGRAM_PUBLISHED_LENGTH} at "
                            f"K={NGRAM_PUBLISHED_DRAFT_LEN} on generic chat"),
    EAGLE3: ModeModel(EAGLE3, draft_model=False, head=True,
                      acceptance=round(acceptance_for_length(EAGLE3_PUBLISHED_LENGTH, EAGLE3_PUBLISHED_DRAFT_LEN), 4),
                      source=f"chain accepted length {EAGLE3_PUBLISHED_LENGTH} at K={EAGLE3_PUBLISHED_DRAFT_LEN} on "
                             "MT-bench (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, nebius's EAGLE-3 model card)"),
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


@dataclass(frozen=True)
class Eagle3HeadModel:
    """The EAGLE-3 head a plan drafts with: a registry head (`name`), or for a target without one the published
    recipe at the target's width (`name` None: an estimate)."""

    name: str | None
    target: str
    arch: Architecture  # the head's decoder layer(s)
    draft_vocab_size: int
    captured: int

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        return (f"estimate: no registered EAGLE-3 head for {self.target}; the published recipe at its width "
                f"(1 layer, draft vocab {self.draft_vocab_size})")

    def cost(self, *, kv: str, tp: int, gpu: GPU) -> Eagle3HeadCost:
        """The head's drafting cost inside a target of KV dtype `kv` at TP `tp`."""
        return Eagle3HeadCost(self.arch, HEAD_PRECISION, kv, tp, gpu, draft_vocab_size=self.draft_vocab_size,
                              captured=self.captured)

    def weight_bytes_per_gpu(self, *, tp: int, gpu: GPU) -> float:
        """16-bit layer and lm_head split by TP, plus the fc every rank holds (its embeddings are the target's)."""
        return self.cost(kv="bf16", tp=tp, gpu=gpu).weight_bytes()

    def kv_bytes_per_token_per_gpu(self, *, kv: str, tp: int) -> int:
        """Its layer(s) in the target's KV pool, at the target's KV dtype (one-model `SpecDecOneEngineForCausalLM`
        copies the target's kv_cache_quant_algo into the head's config)."""
        return kv_bytes_per_token(self.arch, kv, tp=tp)


def registered_head(entry: ModelEntry) -> Eagle3HeadModel:
    """The model of a registry EAGLE-3 head entry."""
    if entry.eagle3 is None:
        raise SpecError(f"model '{entry.name}' is no EAGLE-3 head")
    return Eagle3HeadModel(entry.name, entry.eagle3.target_model, entry.architecture, entry.eagle3.draft_vocab_size,
                           len(entry.eagle3.capture_layers or ()) or EAGLE3_DEFAULT_CAPTURE)


def estimated_head(target: ModelEntry) -> Eagle3HeadModel:
    """An EAGLE-3 head of the published recipe for `target`: one dense decoder layer of its width."""
    arch = target.architecture.model_copy(update={"num_layers": 1, "family": "llama", "num_experts": 0,
                                                  "experts_per_token": 0, "sliding_window": None})
    return Eagle3HeadModel(None, target.name, arch, EAGLE3_RECIPE_DRAFT_VOCAB, EAGLE3_DEFAULT_CAPTURE)


def eagle3_head(spec: BuildSpec) -> Eagle3HeadModel | None:
    """The head an eagle3 spec drafts with (its registry head, else the estimate); None in the other modes."""
    if spec.speculation_mode != EAGLE3:
        return None
    head = spec.draft_model
    return registered_head(head) if head is not None and head.eagle3 is not None else estimated_head(spec.model)
