"""Memory, capacity, throughput (calibrated estimate and roofline bound) and cost planning. Pure arithmetic, no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pipeline.core.runtimes import runtime_of
from pipeline.core.errors import SpecError
from pipeline.core.gpus import GIB, GPU, GPUS, gpu_price
from pipeline.core.registry import Architecture
from pipeline.core.table import format_table
from pipeline.core.trtllm_rules import engine_max_num_tokens
from pipeline.planning.fleet import ROUTINGS, FleetCache, Routing, fleet_hit_ratio
from pipeline.planning.fleet_plan import FleetPrefix, fleet_cache, replicas_of
from pipeline.planning.perf_model import (
    LINEAR_BYTES,
    EngineCost,
    Estimate,
    Speculation,
    estimate,
    expected_tokens_per_step,
    kv_bytes_per_token,
)
from pipeline.planning.placement import capacity, try_place, with_memory
from pipeline.planning.speculation_modes import (
    Eagle3HeadModel, acceptances, eagle3_head, mode_model, without_speculation,
)

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

EMBED_BYTES = 2  # embeddings / lm_head / norms stay 16-bit
SCALE_BYTES = 2  # AWQ group scales are stored 16-bit in the engine
# Per GPU, besides weights, activations and KV: CUDA context, cuBLAS workspaces, decoder and runtime buffers, and
# NCCL's buffers at TP > 1. Sized as AIConfigurator 0.12 sizes them for TensorRT-LLM on H100 (3.5 GiB "other",
# 342/392 MiB NCCL), so a batch it reports out of memory is not planned as fitting.
RUNTIME_RESERVE_GIB = 3.5
NCCL_RESERVE_GIB = {1: 0.0, 2: 0.334, 4: 0.383}  # 8 and more: the TP 4 figure
TP_CHOICES = (1, 2, 4, 8)
# The default operating point: the batch with the lowest $ per 1M output tokens whose TPOT stays within this
# (an interactive target: 20 tokens/s per user). `max_batch_size` is only the engine's ceiling.
DEFAULT_TPOT_TARGET_MS = 50.0
OPERATING_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def weight_bytes(arch: Architecture, precision: str, *, awq_block: int = 128) -> float:
    """Total weight bytes: quantized linear layers + 16-bit embeddings/norms (+ AWQ group scales)."""
    linear = arch.linear_params * LINEAR_BYTES[precision]
    if precision in ("int4_awq", "w4a8_awq"):
        linear += arch.linear_params / awq_block * SCALE_BYTES
    elif precision == "int8_sq":
        linear += arch.num_layers * 7 * arch.hidden_size * 4  # per-channel fp32 scales, negligible
    return linear + (arch.embedding_params + arch.norm_params) * EMBED_BYTES


def activation_bytes(arch: Architecture, *, max_num_tokens: int, max_batch: int, tp: int) -> float:
    """Rough activation workspace per GPU, sized by max_num_tokens (16-bit) plus fp32 logits of a batch."""
    per_token = (4 * arch.hidden_size + 2 * arch.intermediate_size * max(1, arch.experts_per_token) // tp) * 2
    return max_num_tokens * per_token + max_batch * arch.vocab_size * 4


@dataclass(frozen=True)
class EngineShape:
    """The numbers of one engine that decide its GPU memory (target or draft)."""

    arch: Architecture
    precision: str
    kv: str
    tp: int
    pp: int
    max_batch: int
    max_seq_len: int  # as the engine records it (the target: S + K with speculation)
    max_num_tokens: int  # as build() leaves it (trtllm_rules.engine_max_num_tokens)
    awq_block: int = 128
    head_weight_bytes: float = 0.0  # per GPU: an EAGLE-3 head's weights in the target's process
    head_kv_bytes_per_token: float = 0.0  # per GPU: its layer in the target's KV pool

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def weights_per_gpu(self) -> float:
        return weight_bytes(self.arch, self.precision, awq_block=self.awq_block) / self.world + self.head_weight_bytes

    def reserve_per_gpu(self) -> float:
        """Runtime and NCCL reserve plus activations of this engine on each of its GPUs."""
        nccl = NCCL_RESERVE_GIB.get(self.tp, NCCL_RESERVE_GIB[4])
        return (RUNTIME_RESERVE_GIB + nccl) * GIB + activation_bytes(
            self.arch, max_num_tokens=self.max_num_tokens, max_batch=self.max_batch, tp=self.tp)

    def kv_per_token_per_gpu(self) -> float:
        return kv_bytes_per_token(self.arch, self.kv, tp=self.tp) / self.pp + self.head_kv_bytes_per_token

    def sequence_tokens(self, block: int) -> int:
        """KV tokens of one longest sequence, in whole blocks."""
        return math.ceil(self.max_seq_len / block) * block


def engine_shapes(
    spec: BuildSpec, *, tp: int | None = None, max_batch: int | None = None, max_seq_len: int | None = None,
    max_num_tokens: int | None = None, draft_max_batch: int | None = None,
) -> tuple[EngineShape, EngineShape | None]:
    """The target's (and the draft's) shapes for `spec`, with any limit overridden (the fit search varies them).

    `max_num_tokens` is the value given to trtllm-build (spec.base_max_num_tokens); build()'s clipping and the
    speculative floor are applied here exactly as the compile plan applies them. An EAGLE-3 head is no engine of its
    own: its weights and KV layer are the target's (`speculation_modes.eagle3_head`).
    """
    q, lim = spec.quantization, spec.limits
    tp = spec.parallelism.tp if tp is None else tp
    batch = spec.max_batch_size if max_batch is None else max_batch
    seq = spec.max_seq_len if max_seq_len is None else max_seq_len
    base = spec.base_max_num_tokens if max_num_tokens is None else max_num_tokens
    k = spec.draft_len
    common: dict[str, Any] = dict(max_input_len=min(spec.max_input_len, seq), tokens_per_block=lim.tokens_per_block,
                                  context_fmha=lim.context_fmha)
    head = eagle3_head(spec)
    extras: dict[str, float] = {} if head is None else dict(
        head_weight_bytes=head.weight_bytes_per_gpu(tp=tp, gpu=GPUS[spec.hardware.gpu]),
        head_kv_bytes_per_token=head.kv_bytes_per_token_per_gpu(kv=q.kv, tp=tp))
    target = EngineShape(
        spec.model.architecture, q.precision, q.kv, tp, spec.parallelism.pp, batch, seq + k,
        engine_max_num_tokens(base, max_batch_size=batch, max_seq_len=seq, draft_len=k, **common),
        q.awq_block_size, **extras)
    drafting = spec.quantized_draft
    if drafting is None:
        return target, None
    dbatch = spec.draft_max_batch_size if draft_max_batch is None else draft_max_batch
    draft = EngineShape(
        drafting.architecture, spec.draft_precision, q.kv, spec.draft_tp, 1, dbatch, seq + k,
        engine_max_num_tokens(base, max_batch_size=dbatch, max_seq_len=seq + k, **common), q.awq_block_size)
    return target, draft


@dataclass
class GPUBudget:
    """One GPU: what the engines on it take, what is left, and the KV pools carved from it."""

    index: int
    engines: tuple[str, ...]  # "target", "draft"
    used: float  # weights + runtime reserve + activations of every engine on it
    free: float
    target_pool: float = 0.0
    draft_pool: float = 0.0


def gpu_budgets(spec: BuildSpec, target: EngineShape, draft: EngineShape | None, gpu: GPU) -> list[GPUBudget]:
    """Per-GPU memory of the target's GPUs and the draft's GPUs (shared ones carry both engines).

    The target's ranks sit on the host's first tp×pp GPUs; the draft's on `spec.draft_gpu_device_ids` (default:
    co-located on the target's first draft_tp GPUs). Each engine's KV pool on a GPU is its
    `kv_cache_free_gpu_mem_fraction` of that GPU's free memory; the draft's is capped at what its own batch can
    hold (`spec.draft_max_tokens_in_paged_kv_cache`, its max batch × one S + K sequence), not sized by the target's
    batch.
    """
    target_ids = list(range(target.world))
    draft_ids = spec.draft_gpu_device_ids if draft is not None else []
    budgets = []
    for index in sorted(set(target_ids) | set(draft_ids)):
        engines, used = [], 0.0
        for role, shape, ids in (("target", target, target_ids), ("draft", draft, draft_ids)):
            if shape is not None and index in ids:
                engines.append(role)
                used += shape.weights_per_gpu() + shape.reserve_per_gpu()
        free = gpu.memory_gib * GIB - used
        b = GPUBudget(index, tuple(engines), used, free)
        if "target" in engines:
            b.target_pool = max(0.0, free) * spec.serving.target_fraction(draft is not None)
            if spec.serving.max_tokens_in_paged_kv_cache:
                b.target_pool = min(b.target_pool, spec.serving.max_tokens_in_paged_kv_cache
                                    * target.kv_per_token_per_gpu())
        if "draft" in engines and draft is not None:
            need = draft.max_batch * draft.sequence_tokens(spec.limits.tokens_per_block) * draft.kv_per_token_per_gpu()
            b.draft_pool = min(max(0.0, free) * spec.serving.draft_kv_cache_free_gpu_mem_fraction, need)
        budgets.append(b)
    return budgets


def fit_shortfall(spec: BuildSpec, target: EngineShape, draft: EngineShape | None, gpu: GPU) -> float:
    """Bytes of GPU memory missing on the tightest GPU (<= 0: fits) for each engine's KV pool to hold one longest
    sequence after every weight, runtime reserve and activation on that GPU.

    That is the least an engine can serve with: its activations are sized by max_num_tokens and max_batch_size
    and allocated whatever the load, and its pool is its memory fraction of what is left.
    """
    block = spec.limits.tokens_per_block
    fractions = {"target": spec.serving.target_fraction(draft is not None),
                 "draft": spec.serving.draft_kv_cache_free_gpu_mem_fraction}
    worst = -math.inf
    for b in gpu_budgets(spec, target, draft, gpu):
        for role, shape in (("target", target), ("draft", draft)):
            if role in b.engines and shape is not None:
                needed_free = shape.sequence_tokens(block) * shape.kv_per_token_per_gpu() / fractions[role]
                worst = max(worst, needed_free - b.free)
    return worst


@dataclass
class CapacityPlan:
    model: str
    precision: str
    kv_cache: str
    gpu: str
    tp: int
    pp: int
    gpus: int
    input_len: int
    output_len: int
    max_batch_size: int
    weights_gib_total: float
    weights_gib_per_gpu: float
    draft_weights_gib_per_gpu: float  # per draft GPU
    kv_bytes_per_token_total: int
    kv_bytes_per_token_per_gpu: int
    reserve_gib_per_gpu: float
    free_gib_per_gpu: float  # on the target's tightest GPU (a co-located draft's weights/reserve taken out)
    kv_pool_gib_per_gpu: float  # the target's pool on its tightest GPU (TP ranks agree on the smallest)
    kv_cache_tokens: int
    max_concurrent_requests: int
    fits: bool
    min_tp: int | None
    batch_ceiling: int  # min(max_batch_size, max_concurrent_requests): the most requests in flight
    decode_batch: int  # the operating point the estimate is for (see operating_point)
    operating_point: str  # which batch the estimate is at, and why
    tpot_target_ms: float | None  # the TPOT the operating point keeps within (None: the ceiling was asked for)
    decode_tokens_per_s_bound: float  # HBM roofline of pure decode (x tokens per target step): an upper bound
    ttft_ms_estimate: float  # calibrated estimate at decode_batch concurrent requests (perf_model)
    tpot_ms_estimate: float
    output_tokens_per_s_estimate: float  # continuous batching, prefill interleaved, speculation and reuse included
    acceptance_rate: float | None  # the estimate's acceptance per drafted token (None without speculation)
    speculation_active: bool  # speculation is planned and decode_batch is within max_batch_for_speculation
    prefix_hit_ratio: float
    gpu_price_per_hour: float
    gpu_price_source: str  # the flag/spec, $PIPELINE_GPU_PRICE, or pipeline.core.gpus.GPU_PRICES with its source and date
    cost_per_1m_output_tokens_usd: float | None  # from the estimate
    cost_per_1m_output_tokens_usd_at_bound: float | None  # from the roofline: a lower bound on cost
    draft_tp: int | None = None
    draft_gpu_device_ids: list[int] | None = None
    draft_max_batch_size: int | None = None
    draft_kv_bytes_per_token_per_gpu: int | None = None
    draft_kv_pool_gib_per_gpu: float | None = None
    draft_kv_cache_tokens: int | None = None
    draft_max_concurrent_requests: int | None = None
    nodes: int = 1
    per_node: list[dict[str, Any]] | None = None  # placement.NodeMemory per node (ranks, used and KV pool GiB)
    moe: dict[str, Any] | None = None  # MoE models only: `moe_placement` (total/active parameters, expert TP/EP per GPU)
    speculation_mode: str | None = None  # draft-target, ngram or None
    draft_len: int = 0  # K drafted tokens per step (0 without speculation)
    speculation_loads: list[dict[str, Any]] | None = None  # `LoadPoint`s: the mode vs none at low and high load
    eagle3_head: dict[str, Any] | None = None  # eagle3 only: `head_fields` (which head, its memory per GPU)
    fleet: dict[str, Any] | None = None  # serving_target replicas > 1 with prefix reuse: `fleet_plan.FleetPrefix`

    @property
    def estimate_hit_ratio(self) -> float:
        """The prefix-hit ratio the estimate is at: the fleet's under its router, else `prefix_hit_ratio`."""
        return self.fleet["hit_ratio"][self.fleet["router"]] if self.fleet else self.prefix_hit_ratio

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("moe", "eagle3_head", "fleet"):
            if data[key] is None:
                data.pop(key)  # the plan of a dense model without EAGLE-3 is what it was before them
        return data


def _capacity(spec: BuildSpec, gpu: GPU, input_len: int, output_len: int, *, tp: int) -> dict[str, Any]:
    target, draft = engine_shapes(spec, tp=tp)
    budgets = gpu_budgets(spec, target, draft, gpu)
    tb = [b for b in budgets if "target" in b.engines]
    tight = min(tb, key=lambda b: b.target_pool)  # every TP rank allocates the smallest rank's block count
    kv_gpu = target.kv_per_token_per_gpu()
    tokens = int(tight.target_pool // kv_gpu)
    block = spec.limits.tokens_per_block
    per_request = math.ceil((input_len + output_len + spec.draft_len) / block) * block
    out: dict[str, Any] = dict(target=target, draft=draft, tight=tight, tokens=tokens, kv_gpu=kv_gpu,
                               concurrent=tokens // per_request, fits=tight.free > 0 and tokens >= per_request)
    if draft is not None:
        db = [b for b in budgets if "draft" in b.engines]
        dtight = min(db, key=lambda b: b.draft_pool)
        dkv = draft.kv_per_token_per_gpu()
        dtokens = int(dtight.draft_pool // dkv)
        out.update(draft_tight=dtight, draft_tokens=dtokens, draft_kv_gpu=dkv,
                   draft_concurrent=min(draft.max_batch, dtokens // per_request))
        out["fits"] = out["fits"] and dtight.free > 0 and dtokens >= per_request
    placed = try_place(tp, spec.parallelism.pp, spec.hardware)
    if placed is not None:
        out["placement"] = with_memory(placed, {b.index: b.used for b in budgets},
                                       {b.index: b.target_pool + b.draft_pool for b in budgets}, gpu)
    return out


def kv_concurrency(spec: BuildSpec, gpu: GPU, input_len: int, output_len: int) -> tuple[bool, int]:
    """Whether the spec fits at its TP, and how many requests of `input_len` + `output_len` its KV pool holds."""
    r = _capacity(spec, gpu, input_len, output_len, tp=spec.parallelism.tp)
    return r["fits"], r["concurrent"]


def kv_cache_tokens(spec: BuildSpec, gpu: GPU, input_len: int, output_len: int) -> int:
    """The tokens the spec's target KV pool holds (per replica, at its TP)."""
    return int(_capacity(spec, gpu, input_len, output_len, tp=spec.parallelism.tp)["tokens"])


def moe_placement(spec: BuildSpec) -> dict[str, Any] | None:
    """Total vs active parameters and where the experts go, as TensorRT-LLM 1.2.1 maps them
    (tensorrt_llm/mapping.py: moe_tp_size x moe_ep_size = tp_size; layers/moe.py: each EP rank holds
    num_experts / moe_ep_size experts, each expert's FFN split moe_tp_size ways). None for a dense model."""
    a, p, q = spec.model.architecture, spec.parallelism, spec.quantization
    if not a.is_moe:
        return None
    expert_bytes = (a.linear_params - a.attention_params) * LINEAR_BYTES[q.precision]
    options = ({"moe_expert_parallel_size": p.moe_ep_size, "moe_tensor_parallel_size": p.moe_tp_size}
               if runtime_of(spec).llmapi else {"mapping.moe_tp_size": p.moe_tp_size, "mapping.moe_ep_size": 1})
    return dict(
        total_params=a.total_params, active_params=a.active_params, num_experts=a.num_experts,
        experts_per_token=a.experts_per_token, moe_tp_size=p.moe_tp_size, moe_ep_size=p.moe_ep_size,
        experts_per_gpu=a.num_experts // p.moe_ep_size, expert_ffn_per_gpu=a.intermediate_size // p.moe_tp_size,
        expert_weights_gib_per_gpu=round(expert_bytes / (p.tp * p.pp) / GIB, 2), runtime_options=options,
    )


def request_lengths(spec: BuildSpec, input_len: int | None, output_len: int | None) -> tuple[int, int]:
    """Tokens in and out per request: checked against the engine limits, defaulting to 1024 in / 256 out."""
    if input_len is not None and not 0 < input_len <= spec.max_input_len:
        raise SpecError(
            f"plan: --input-len={input_len} must be within 1..max_input_len={spec.max_input_len}; "
            "lower it or raise --max-input-len"
        )
    input_len = input_len or min(1024, spec.max_input_len, spec.max_seq_len - 1)
    if output_len is not None and not 0 < output_len <= spec.max_seq_len - input_len:
        raise SpecError(
            f"plan: --output-len={output_len} must be within 1..{spec.max_seq_len - input_len} "
            f"(max_seq_len={spec.max_seq_len} - input {input_len}); lower it or raise --max-seq-len"
        )
    return input_len, output_len or min(256, spec.max_seq_len - input_len)


def minimum_tp(spec: BuildSpec, gpu: GPU, input_len: int, output_len: int) -> int | None:
    """The smallest TP size within the host's GPUs at which the spec fits, or None."""
    for cand in TP_CHOICES:
        if cand * spec.parallelism.pp > capacity(spec.hardware):
            break
        if _capacity(spec, gpu, input_len, output_len, tp=cand)["fits"]:
            return cand
    return None


def decode_bound(target: EngineShape, gpu: GPU, *, batch: int, input_len: int, output_len: int) -> float:
    """Pure-decode HBM roofline (tok/s): each step reads every weight once plus the batch's KV at mean context."""
    if batch <= 0:
        return 0.0
    weights = target.weights_per_gpu()
    if target.arch.is_moe:  # a decode step reads only the experts its batch routes to
        a = target.arch
        weights -= (a.linear_params - a.expert_linear_params_touched(batch)) * LINEAR_BYTES[target.precision] / target.world
    step_bytes = weights + batch * (input_len + output_len / 2) * target.kv_per_token_per_gpu()
    return batch * gpu.hbm_tb_s * 1e12 / step_bytes


def serving_estimate(spec: BuildSpec, gpu: GPU, *, tp: int, batch: int, input_len: int, output_len: int,
                     acceptance: float | None, prefix_hit_ratio: float) -> tuple[Estimate, bool]:
    """perf_model's estimate for the spec's target, with its speculation mode when on at this batch (the load
    gate `max_batch_for_speculation`, every mode): K + 1 tokens verified per target step, a draft model's K steps
    where the mode runs one (`speculation_modes.MODES`). `acceptance`: per drafted token (None: the mode's
    default)."""
    q = spec.quantization
    target = EngineCost(spec.model.architecture, q.precision, q.kv, tp, gpu)
    mode = spec.speculation_mode
    active = mode is not None and 0 < batch <= spec.speculation.max_batch_for_speculation
    speculation = None
    if active and mode is not None:
        model = mode_model(mode)
        draft: EngineCost | None = None
        head = eagle3_head(spec)
        if model.draft_model and spec.draft_model is not None:
            draft = EngineCost(spec.draft_model.architecture, spec.draft_precision, q.kv, spec.draft_tp, gpu)
        elif model.head and head is not None:
            draft = head.cost(kv=q.kv, tp=tp, gpu=gpu)
        speculation = Speculation(draft, spec.draft_len, model.acceptance if acceptance is None else acceptance)
    block = spec.limits.tokens_per_block
    reused = int(prefix_hit_ratio * input_len) // block * block if spec.serving.enable_kv_cache_reuse else 0
    est = estimate(target, input_len=input_len, output_len=output_len, batch=batch, prefix_reused=reused,
                   speculation=speculation)
    return est, active


def cost_per_1m(gpus: int, price_per_hour: float, tokens_per_s: float) -> float | None:
    """$ per 1M output tokens: GPUs x $/GPU-hour / 3600 / tok/s x 1e6."""
    return round(gpus * price_per_hour / 3600 / tokens_per_s * 1e6, 4) if tokens_per_s > 0 else None


def head_fields(head: Eagle3HeadModel | None, target: EngineShape) -> dict[str, Any] | None:
    """The plan's `eagle3_head`: which head (or that it is an estimate) and what it adds to each target GPU."""
    if head is None:
        return None
    return dict(name=head.name, estimate=head.name is None, label=head.label, draft_vocab_size=head.draft_vocab_size,
                weights_gib_per_gpu=round(target.head_weight_bytes / GIB, 3),
                kv_bytes_per_token_per_gpu=int(target.head_kv_bytes_per_token))


def _draft_fields(spec: BuildSpec, r: dict[str, Any]) -> dict[str, Any]:
    draft = r["draft"]
    if draft is None:
        return {}
    return dict(
        draft_tp=draft.tp,
        draft_gpu_device_ids=spec.draft_gpu_device_ids,
        draft_max_batch_size=draft.max_batch,
        draft_kv_bytes_per_token_per_gpu=int(r["draft_kv_gpu"]),
        draft_kv_pool_gib_per_gpu=round(r["draft_tight"].draft_pool / GIB, 2),
        draft_kv_cache_tokens=r["draft_tokens"],
        draft_max_concurrent_requests=r["draft_concurrent"],
    )


def operating_point(spec: BuildSpec, gpu: GPU, *, ceiling: int, tpot_target_ms: float | None, **terms: Any
                    ) -> tuple[int, str]:
    """The batch to estimate at, and why: the highest output tok/s (so the lowest $ per 1M) with TPOT within
    `tpot_target_ms` among OPERATING_BATCHES up to `ceiling` and the ceiling itself; the ceiling when the target is
    None or no batch meets it. `terms`: serving_estimate's tp, lengths, acceptance and prefix hit ratio."""
    if ceiling < 1:
        return 0, "no request fits"
    if tpot_target_ms is None:
        return ceiling, f"batch {ceiling}: the ceiling (max_batch_size or what the KV pool holds)"
    best = None
    for batch in sorted({b for b in OPERATING_BATCHES if b < ceiling} | {ceiling}):
        est, _ = serving_estimate(spec, gpu, batch=batch, **terms)
        if est.tpot_ms <= tpot_target_ms and (best is None or est.output_tokens_per_s > best[1]):
            best = (batch, est.output_tokens_per_s)
    if best is None:
        return ceiling, (f"batch {ceiling}: the ceiling; no batch keeps TPOT <= {tpot_target_ms:g} ms, so the "
                         "cheapest is the fullest")
    return best[0], (f"batch {best[0]}: the lowest $ per 1M with TPOT <= {tpot_target_ms:g} ms (of a ceiling of "
                     f"{ceiling})")


@dataclass(frozen=True)
class LoadPoint:
    """The speculation mode against no speculation at one batch, on the same GPUs."""

    load: str  # "low" (one request) or "high" (the batch ceiling)
    batch: int
    speculation_active: bool  # within max_batch_for_speculation
    output_tokens_per_s: float
    output_tokens_per_s_without: float
    cost_per_1m_output_tokens_usd: float | None
    cost_per_1m_output_tokens_usd_without: float | None


def speculation_loads(spec: BuildSpec, gpu: GPU, *, ceiling: int, price: float, **terms: Any) -> list[LoadPoint]:
    """The spec's speculation mode vs none at low load (batch 1) and high load (the batch ceiling); empty
    without speculation or when no request fits. `terms`: serving_estimate's tp, lengths, acceptance and prefix."""
    if spec.speculation_mode is None or ceiling < 1:
        return []
    plain = without_speculation(spec)
    gpus = spec.parallelism.tp * spec.parallelism.pp
    points = []
    for load, batch in (("low", 1), ("high", ceiling)):
        est, active = serving_estimate(spec, gpu, batch=batch, **terms)
        base, _ = serving_estimate(plain, gpu, batch=batch, **terms)
        points.append(LoadPoint(load, batch, active, round(est.output_tokens_per_s, 1),
                                round(base.output_tokens_per_s, 1), cost_per_1m(gpus, price, est.output_tokens_per_s),
                                cost_per_1m(gpus, price, base.output_tokens_per_s)))
    return points


def plan_capacity(spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None,
                  acceptance: float | None = None, prefix_hit_ratio: float = 0.0,
                  tpot_target_ms: float | None = DEFAULT_TPOT_TARGET_MS, routing: Routing | None = None
                  ) -> CapacityPlan:
    """Plan memory fit, KV capacity, concurrency, throughput (estimate and roofline bound) and cost for a spec.

    The batch ceiling is the most concurrent requests the KV pool holds (at most max_batch_size); the estimate is
    at the operating point (`operating_point`: the cheapest batch within `tpot_target_ms`; None: the ceiling),
    continuous batching with speculation at `acceptance` per drafted token (None: the spec's mode's default,
    `speculation_modes.MODES`) and prefix reuse at `prefix_hit_ratio`: one server's; with the spec's
    `serving_target` of N > 1 replicas, the fleet's under `routing` (default round-robin, bench's one shared prefix;
    `pipeline.planning.fleet`), and the plan's `fleet` compares round-robin with KV routing.
    """
    if not 0.0 <= (acceptance or 0.0) <= 1.0 or not 0.0 <= prefix_hit_ratio <= 1.0:
        raise SpecError("plan: --acceptance and --prefix-hit must be within 0..1")
    gpu = GPUS[spec.hardware.gpu]
    tp, pp = spec.parallelism.tp, spec.parallelism.pp
    input_len, output_len = request_lengths(spec, input_len, output_len)
    r = _capacity(spec, gpu, input_len, output_len, tp=tp)
    target, draft = r["target"], r["draft"]
    ceiling = min(spec.max_batch_size, r["concurrent"])
    mode = spec.speculation_mode
    rate = acceptances(spec, acceptance)[mode] if mode is not None else None
    routing = routing or Routing()
    cache = fleet_cache(spec, replicas=replicas_of(spec), kv_tokens=r["tokens"], ceiling=ceiling, input_len=input_len, output_len=output_len,
                        prefix_hit_ratio=prefix_hit_ratio)
    hit = fleet_hit_ratio(prefix_hit_ratio, cache, routing) if cache is not None else prefix_hit_ratio
    terms: dict[str, Any] = dict(tp=tp, input_len=input_len, output_len=output_len, acceptance=rate,
                                 prefix_hit_ratio=hit)
    batch, why = operating_point(spec, gpu, ceiling=ceiling, tpot_target_ms=tpot_target_ms, **terms)
    est, active = serving_estimate(spec, gpu, batch=batch, **terms)
    fleet = None if cache is None else fleet_prefix(
        spec, gpu, cache, routing, h1=prefix_hit_ratio, batch=batch,
        **{k: v for k, v in terms.items() if k != "prefix_hit_ratio"}).as_dict()
    # with speculation the bound counts every expected token of a target step and the drafting as free
    bound = decode_bound(target, gpu, batch=batch, input_len=input_len, output_len=output_len)
    bound *= est.tokens_per_target_step
    arch, q = spec.model.architecture, spec.quantization
    chosen = gpu_price(gpu.name, spec.hardware.gpu_price_per_hour)
    price = chosen.usd_per_hour
    return CapacityPlan(
        model=spec.model.name, precision=q.precision, kv_cache=q.kv, gpu=gpu.name, tp=tp, pp=pp, gpus=tp * pp,
        input_len=input_len, output_len=output_len, max_batch_size=spec.max_batch_size,
        weights_gib_total=round(weight_bytes(arch, q.precision, awq_block=q.awq_block_size) / GIB, 2),
        weights_gib_per_gpu=round(target.weights_per_gpu() / GIB, 2),
        draft_weights_gib_per_gpu=round(draft.weights_per_gpu() / GIB, 2) if draft is not None else 0.0,
        kv_bytes_per_token_total=kv_bytes_per_token(arch, q.kv), kv_bytes_per_token_per_gpu=int(r["kv_gpu"]),
        reserve_gib_per_gpu=round(target.reserve_per_gpu() / GIB, 2), free_gib_per_gpu=round(r["tight"].free / GIB, 2),
        kv_pool_gib_per_gpu=round(r["tight"].target_pool / GIB, 2), kv_cache_tokens=r["tokens"],
        max_concurrent_requests=r["concurrent"], fits=r["fits"],
        min_tp=minimum_tp(spec, gpu, input_len, output_len), batch_ceiling=ceiling, decode_batch=batch,
        operating_point=why, tpot_target_ms=tpot_target_ms,
        decode_tokens_per_s_bound=round(bound, 1), ttft_ms_estimate=round(est.ttft_ms, 1),
        tpot_ms_estimate=round(est.tpot_ms, 2), output_tokens_per_s_estimate=round(est.output_tokens_per_s, 1),
        acceptance_rate=rate, speculation_active=active,
        prefix_hit_ratio=prefix_hit_ratio, gpu_price_per_hour=price, gpu_price_source=chosen.source,
        cost_per_1m_output_tokens_usd=cost_per_1m(tp * pp, price, est.output_tokens_per_s),
        cost_per_1m_output_tokens_usd_at_bound=cost_per_1m(tp * pp, price, bound),
        nodes=r["placement"].nodes if "placement" in r else 1,
        per_node=[n.model_dump() for n in r["placement"].per_node] if "placement" in r else None,
        moe=moe_placement(spec), speculation_mode=mode, draft_len=spec.draft_len,
        speculation_loads=[asdict(x) for x in speculation_loads(spec, gpu, ceiling=ceiling, price=price, **terms)]
        or None, eagle3_head=head_fields(eagle3_head(spec), target), fleet=fleet, **_draft_fields(spec, r),
    )


def format_capacity_plan(p: CapacityPlan) -> str:
    """Human-readable table."""
    rows = [
        ("model / precision / KV", f"{p.model} / {p.precision} / {p.kv_cache}"),
        ("GPUs", f"{p.gpus} x {p.gpu} (tp={p.tp}, pp={p.pp}, {p.nodes} node{'s' if p.nodes > 1 else ''})"),
        ("weights total / per GPU", f"{p.weights_gib_total:.2f} GiB / {p.weights_gib_per_gpu:.2f} GiB"),
        *_moe_rows(p.moe),
    ]
    if p.draft_tp is not None:
        gpus = ",".join(map(str, p.draft_gpu_device_ids or []))
        rows.append((f"draft tp={p.draft_tp} on GPU {gpus}, batch {p.draft_max_batch_size}",
                     f"{p.draft_weights_gib_per_gpu:.2f} GiB weights, KV pool {p.draft_kv_pool_gib_per_gpu:.2f} GiB "
                     f"({p.draft_kv_cache_tokens:,} tokens, {p.draft_max_concurrent_requests} requests)"))
    if p.eagle3_head is not None:
        h = p.eagle3_head
        rows.append((f"EAGLE-3 head ({h['label']})",
                     f"{h['weights_gib_per_gpu']:.2f} GiB 16-bit weights per GPU in the target's process (included "
                     f"above), +{h['kv_bytes_per_token_per_gpu']} KV bytes/token per GPU (one layer in its pool)"))
    rows += [
        ("KV bytes/token total / per GPU", f"{p.kv_bytes_per_token_total} / {p.kv_bytes_per_token_per_gpu}"),
        ("runtime reserve per GPU", f"{p.reserve_gib_per_gpu:.2f} GiB"),
        ("KV pool per GPU", f"{p.kv_pool_gib_per_gpu:.2f} GiB"),
        ("KV capacity", f"{p.kv_cache_tokens:,} tokens"),
        (f"concurrent requests @ {p.input_len}+{p.output_len}", f"{p.max_concurrent_requests:,}"),
        *((f"node {n['node']}: ranks {n['ranks'][0]}-{n['ranks'][-1]}",
           f"{n['used_gib']:.1f} GiB used + {n['kv_pool_gib']:.1f} GiB KV of {n['capacity_gib']:.1f} GiB")
          for n in (p.per_node or []) if p.nodes > 1),
        ("fits", "yes" if p.fits else "NO"),
        ("minimum TP that fits", str(p.min_tp) if p.min_tp else "none within the host's GPUs"),
        *estimate_rows(p),
    ]
    return format_table(rows)


def _moe_rows(moe: dict[str, Any] | None) -> list[tuple[str, str]]:
    if moe is None:
        return []
    opts = ", ".join(f"{k}={v}" for k, v in moe["runtime_options"].items())
    return [
        ("parameters total / active", f"{moe['total_params'] / 1e9:.2f} B / {moe['active_params'] / 1e9:.2f} B "
                                      f"(top-{moe['experts_per_token']} of {moe['num_experts']} experts; memory holds "
                                      "all, each token reads the active ones)"),
        ("experts per GPU (EP) / FFN slice (TP)",
         f"{moe['experts_per_gpu']} of {moe['num_experts']} (moe_ep={moe['moe_ep_size']}) / "
         f"{moe['expert_ffn_per_gpu']} (moe_tp={moe['moe_tp_size']}); {moe['expert_weights_gib_per_gpu']:.2f} GiB "
         f"expert weights per GPU; {opts}"),
    ]


def _usd(value: float | None) -> str:
    return f"${value:.4f}" if value is not None else "n/a"


def estimate_rows(p: CapacityPlan) -> list[tuple[str, str]]:
    """The throughput and cost rows of the plan table."""
    terms = [f"prefix hit {p.estimate_hit_ratio:.0%}" + (f" over {p.fleet['replicas']} replicas, {p.fleet['router']}"
                                                          if p.fleet else "")]
    if p.acceptance_rate is not None:
        mode = "" if p.speculation_mode in (None, "draft-target") else f"{p.speculation_mode} "
        length = expected_tokens_per_step(p.acceptance_rate, p.draft_len)
        terms.insert(0, f"{mode}speculation {'on' if p.speculation_active else 'gated off'}, acceptance "
                        f"{p.acceptance_rate:.0%} ({length:.2f} tokens/step at K={p.draft_len})")
    return [
        ("operating point", p.operating_point),
        (f"estimate @ batch {p.decode_batch} ({', '.join(terms)})",
         f"TTFT {p.ttft_ms_estimate:,.0f} ms, TPOT {p.tpot_ms_estimate:.1f} ms, "
         f"{p.output_tokens_per_s_estimate:,.0f} output tok/s"),
        ("decode roofline (upper bound)", f"{p.decode_tokens_per_s_bound:,.0f} tok/s"),
        (f"cost per 1M output tokens @ ${p.gpu_price_per_hour:.2f}/GPU-h",
         f"{_usd(p.cost_per_1m_output_tokens_usd)} (at the bound: {_usd(p.cost_per_1m_output_tokens_usd_at_bound)})"),
        *_load_rows(p),
        *([("KV routing vs round-robin", FleetPrefix(**_fleet_fields(p.fleet)).line())] if p.fleet else []),
        ("GPU price source", p.gpu_price_source),
    ]


def _fleet_fields(fleet: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fleet.items() if k not in ("kv_saves_usd_per_1m", "kv_saves_ttft_ms")}


def _load_rows(p: CapacityPlan) -> list[tuple[str, str]]:
    """The speculation mode's estimate at low and high load beside no speculation."""
    rows = []
    for x in p.speculation_loads or []:
        state = "on" if x["speculation_active"] else "gated off: above max_batch_for_speculation"
        gain = x["output_tokens_per_s"] / x["output_tokens_per_s_without"] if x["output_tokens_per_s_without"] else 1.0
        rows.append((f"{p.speculation_mode} K={p.draft_len} @ batch {x['batch']} ({x['load']} load, {state})",
                     f"{x['output_tokens_per_s']:,.0f} tok/s, {_usd(x['cost_per_1m_output_tokens_usd'])} per 1M; "
                     f"without speculation {x['output_tokens_per_s_without']:,.0f} tok/s, "
                     f"{_usd(x['cost_per_1m_output_tokens_usd_without'])} (x{gain:.2f})"))
    return rows


def fleet_prefix(spec: BuildSpec, gpu: GPU, cache: FleetCache, routing: Routing, *, h1: float,
                 **terms: Any) -> FleetPrefix:
    """Both routings' fleet ratio, TTFT and $ per 1M at `terms` (serving_estimate's tp, batch, lengths and
    acceptance)."""
    from pipeline.core.gpus import gpu_price

    price = gpu_price(gpu.name, spec.hardware.gpu_price_per_hour).usd_per_hour
    gpus = spec.parallelism.tp * spec.parallelism.pp
    hits, ttft, cost = {}, {}, {}
    for router in ROUTINGS:
        hit = fleet_hit_ratio(h1, cache, Routing(router, routing.shape, routing.spill))
        est, _ = serving_estimate(spec, gpu, prefix_hit_ratio=hit, **terms)
        hits[router], ttft[router] = round(hit, 4), round(est.ttft_ms, 1)
        cost[router] = cost_per_1m(gpus, price, est.output_tokens_per_s)
    return FleetPrefix(cache.replicas, routing.router, routing.shape.prefixes, routing.shape.requests_per_prefix,
                       routing.spill, hits, ttft, cost)
