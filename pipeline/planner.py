"""Memory, capacity, roofline throughput and cost planning. Pure arithmetic, no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .errors import SpecError
from .gpus import GIB, GPU, GPUS
from .placement import capacity, try_place, with_memory
from .registry import Architecture
from .trtllm_rules import engine_max_num_tokens

if TYPE_CHECKING:
    from .spec import BuildSpec

# Bytes per parameter of the quantized linear layers, and bytes of scales per linear parameter.
LINEAR_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8_sq": 1.0, "int4_awq": 0.5, "w4a8_awq": 0.5}
KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
EMBED_BYTES = 2  # embeddings / lm_head / norms stay 16-bit
SCALE_BYTES = 2  # AWQ group scales are stored 16-bit in the engine
RUNTIME_RESERVE_GIB = 2.0  # CUDA context, cuBLAS workspaces, decoder buffers (rough, per GPU)
TP_CHOICES = (1, 2, 4, 8)


def weight_bytes(arch: Architecture, precision: str, *, awq_block: int = 128) -> float:
    """Total weight bytes: quantized linear layers + 16-bit embeddings/norms (+ AWQ group scales)."""
    linear = arch.linear_params * LINEAR_BYTES[precision]
    if precision in ("int4_awq", "w4a8_awq"):
        linear += arch.linear_params / awq_block * SCALE_BYTES
    elif precision == "int8_sq":
        linear += arch.num_layers * 7 * arch.hidden_size * 4  # per-channel fp32 scales, negligible
    return linear + (arch.embedding_params + arch.norm_params) * EMBED_BYTES


def kv_bytes_per_token(arch: Architecture, kv_dtype: str, *, tp: int = 1) -> int:
    """KV bytes per token: 2 (K,V) x layers x kv heads (per TP rank, at least 1) x head_dim x dtype bytes."""
    heads = max(1, arch.num_kv_heads // tp) if tp > 1 else arch.num_kv_heads
    return 2 * arch.num_layers * heads * arch.head_dim * KV_BYTES[kv_dtype]


def activation_bytes(arch: Architecture, *, max_num_tokens: int, max_batch: int, tp: int) -> float:
    """Rough activation workspace per GPU, sized by max_num_tokens (16-bit) plus fp32 logits of a batch."""
    per_token = (4 * arch.hidden_size + 2 * arch.intermediate_size // tp) * 2
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

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def weights_per_gpu(self) -> float:
        return weight_bytes(self.arch, self.precision, awq_block=self.awq_block) / self.world

    def reserve_per_gpu(self) -> float:
        """Runtime reserve plus activations of this engine on each of its GPUs."""
        return RUNTIME_RESERVE_GIB * GIB + activation_bytes(
            self.arch, max_num_tokens=self.max_num_tokens, max_batch=self.max_batch, tp=self.tp)

    def kv_per_token_per_gpu(self) -> float:
        return kv_bytes_per_token(self.arch, self.kv, tp=self.tp) / self.pp

    def sequence_tokens(self, block: int) -> int:
        """KV tokens of one longest sequence, in whole blocks."""
        return math.ceil(self.max_seq_len / block) * block


def engine_shapes(
    spec: BuildSpec, *, tp: int | None = None, max_batch: int | None = None, max_seq_len: int | None = None,
    max_num_tokens: int | None = None, draft_max_batch: int | None = None,
) -> tuple[EngineShape, EngineShape | None]:
    """The target's (and the draft's) shapes for `spec`, with any limit overridden (the fit search varies them).

    `max_num_tokens` is the value given to trtllm-build (spec.base_max_num_tokens); build()'s clipping and the
    speculative floor are applied here exactly as the compile plan applies them.
    """
    q, lim = spec.quantization, spec.limits
    tp = spec.parallelism.tp if tp is None else tp
    batch = spec.max_batch_size if max_batch is None else max_batch
    seq = spec.max_seq_len if max_seq_len is None else max_seq_len
    base = spec.base_max_num_tokens if max_num_tokens is None else max_num_tokens
    k = spec.draft_len
    common = dict(max_input_len=min(spec.max_input_len, seq), tokens_per_block=lim.tokens_per_block,
                  context_fmha=lim.context_fmha)
    target = EngineShape(
        spec.model.architecture, q.precision, q.kv, tp, spec.parallelism.pp, batch, seq + k,
        engine_max_num_tokens(base, max_batch_size=batch, max_seq_len=seq, draft_len=k, **common),
        q.awq_block_size)
    if spec.draft_model is None:
        return target, None
    dbatch = spec.draft_max_batch_size if draft_max_batch is None else draft_max_batch
    draft = EngineShape(
        spec.draft_model.architecture, spec.draft_precision, q.kv, spec.draft_tp, 1, dbatch, seq + k,
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
        if "draft" in engines:
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
            if role in b.engines:
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
    decode_batch: int
    decode_tokens_per_s_bound: float
    gpu_price_per_hour: float
    cost_per_1m_output_tokens_usd: float | None
    draft_tp: int | None = None
    draft_gpu_device_ids: list[int] | None = None
    draft_max_batch_size: int | None = None
    draft_kv_bytes_per_token_per_gpu: int | None = None
    draft_kv_pool_gib_per_gpu: float | None = None
    draft_kv_cache_tokens: int | None = None
    draft_max_concurrent_requests: int | None = None
    nodes: int = 1
    per_node: list[dict] | None = None  # placement.NodeMemory per node (ranks, used and KV pool GiB)

    def as_dict(self) -> dict:
        return asdict(self)


def _capacity(spec: BuildSpec, gpu: GPU, input_len: int, output_len: int, *, tp: int) -> dict:
    target, draft = engine_shapes(spec, tp=tp)
    budgets = gpu_budgets(spec, target, draft, gpu)
    tb = [b for b in budgets if "target" in b.engines]
    tight = min(tb, key=lambda b: b.target_pool)  # every TP rank allocates the smallest rank's block count
    kv_gpu = target.kv_per_token_per_gpu()
    tokens = int(tight.target_pool // kv_gpu)
    block = spec.limits.tokens_per_block
    per_request = math.ceil((input_len + output_len + spec.draft_len) / block) * block
    out = dict(target=target, draft=draft, tight=tight, tokens=tokens, kv_gpu=kv_gpu,
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


def plan_capacity(spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None) -> CapacityPlan:
    """Plan memory fit, KV capacity, concurrency, decode roofline and cost for a resolved spec.

    The decode roofline is the target's alone (the plain ensemble path): what speculation adds depends on the
    acceptance rate, which `invoke bench` measures.
    """
    gpu = GPUS[spec.hardware.gpu]
    tp, pp = spec.parallelism.tp, spec.parallelism.pp
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
    output_len = output_len or min(256, spec.max_seq_len - input_len)
    max_batch = spec.max_batch_size
    r = _capacity(spec, gpu, input_len, output_len, tp=tp)
    target, draft = r["target"], r["draft"]
    min_tp = None
    for cand in TP_CHOICES:
        if cand * pp > capacity(spec.hardware):
            break
        if _capacity(spec, gpu, input_len, output_len, tp=cand)["fits"]:
            min_tp = cand
            break
    batch = min(max_batch, r["concurrent"])
    # Decode is memory bound: each step reads every weight once plus the batch's KV (average context).
    avg_ctx = input_len + output_len / 2
    w_gpu = target.weights_per_gpu()
    step_bytes = w_gpu + batch * avg_ctx * r["kv_gpu"]
    tok_s = batch * gpu.hbm_tb_s * 1e12 / step_bytes if batch > 0 else 0.0
    world = tp * pp
    price = spec.hardware.gpu_price_per_hour
    cost = world * price / 3600 / tok_s * 1e6 if tok_s > 0 else None
    arch, q = spec.model.architecture, spec.quantization
    extra = {}
    if draft is not None:
        extra = dict(
            draft_tp=draft.tp,
            draft_gpu_device_ids=spec.draft_gpu_device_ids,
            draft_max_batch_size=draft.max_batch,
            draft_kv_bytes_per_token_per_gpu=int(r["draft_kv_gpu"]),
            draft_kv_pool_gib_per_gpu=round(r["draft_tight"].draft_pool / GIB, 2),
            draft_kv_cache_tokens=r["draft_tokens"],
            draft_max_concurrent_requests=r["draft_concurrent"],
        )
    return CapacityPlan(
        model=spec.model.name,
        precision=q.precision,
        kv_cache=q.kv,
        gpu=gpu.name,
        tp=tp,
        pp=pp,
        gpus=world,
        input_len=input_len,
        output_len=output_len,
        max_batch_size=max_batch,
        weights_gib_total=round(weight_bytes(arch, q.precision, awq_block=q.awq_block_size) / GIB, 2),
        weights_gib_per_gpu=round(w_gpu / GIB, 2),
        draft_weights_gib_per_gpu=round(draft.weights_per_gpu() / GIB, 2) if draft is not None else 0.0,
        kv_bytes_per_token_total=kv_bytes_per_token(arch, q.kv),
        kv_bytes_per_token_per_gpu=int(r["kv_gpu"]),
        reserve_gib_per_gpu=round(target.reserve_per_gpu() / GIB, 2),
        free_gib_per_gpu=round(r["tight"].free / GIB, 2),
        kv_pool_gib_per_gpu=round(r["tight"].target_pool / GIB, 2),
        kv_cache_tokens=r["tokens"],
        max_concurrent_requests=r["concurrent"],
        fits=r["fits"],
        min_tp=min_tp,
        decode_batch=batch,
        decode_tokens_per_s_bound=round(tok_s, 1),
        gpu_price_per_hour=price,
        cost_per_1m_output_tokens_usd=round(cost, 4) if cost is not None else None,
        nodes=r["placement"].nodes if "placement" in r else 1,
        per_node=[n.model_dump() for n in r["placement"].per_node] if "placement" in r else None,
        **extra,
    )


def format_capacity_plan(p: CapacityPlan) -> str:
    """Human-readable table."""
    rows = [
        ("model / precision / KV", f"{p.model} / {p.precision} / {p.kv_cache}"),
        ("GPUs", f"{p.gpus} x {p.gpu} (tp={p.tp}, pp={p.pp}, {p.nodes} node{'s' if p.nodes > 1 else ''})"),
        ("weights total / per GPU", f"{p.weights_gib_total:.2f} GiB / {p.weights_gib_per_gpu:.2f} GiB"),
    ]
    if p.draft_tp is not None:
        gpus = ",".join(map(str, p.draft_gpu_device_ids or []))
        rows.append((f"draft tp={p.draft_tp} on GPU {gpus}, batch {p.draft_max_batch_size}",
                     f"{p.draft_weights_gib_per_gpu:.2f} GiB weights, KV pool {p.draft_kv_pool_gib_per_gpu:.2f} GiB "
                     f"({p.draft_kv_cache_tokens:,} tokens, {p.draft_max_concurrent_requests} requests)"))
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
        (f"decode bound @ batch {p.decode_batch}", f"{p.decode_tokens_per_s_bound:,.0f} tok/s"),
        (
            f"cost per 1M output tokens @ ${p.gpu_price_per_hour:.2f}/GPU-h",
            f"${p.cost_per_1m_output_tokens_usd:.4f}" if p.cost_per_1m_output_tokens_usd is not None else "n/a",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ---------------------------------------------------------------------------------------------------------------
# Comparing choices (`plan --compare`): precisions x TP x draft on/off for one model and GPU.

COMPARE_PRECISIONS = ("bf16", "fp8", "int4_awq", "w4a8_awq")
# The roofline is an upper bound: decode reads every byte at full HBM bandwidth and prefill runs at the dense
# tensor-core peak. Estimates (tok/s, $ per 1M, prefill ms) scale it by this achieved fraction of peak, which
# well-tuned TensorRT-LLM decode kernels reach at small and medium batch on Hopper; pass --efficiency to change it.
DEFAULT_EFFICIENCY = 0.7
DEFAULT_ACCEPTANCE = 0.7  # draft tokens accepted per proposed (measure yours with `invoke bench`)


def expected_tokens_per_step(acceptance: float, draft_len: int) -> float:
    """Tokens one target step yields with draft-target speculation: (1 - a^(K+1)) / (1 - a) (K + 1 at a = 1)."""
    if acceptance >= 1.0:
        return float(draft_len + 1)
    return (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)


def speculative_speedup(acceptance: float, draft_len: int, *, target_step_s: float, draft_step_s: float) -> float:
    """Decode speed-up of draft-target over target-only: tokens per target step over the step's time, which adds
    the draft's K steps (its weights and KV are read every step) to the target's verify step (memory bound, so it
    costs about one decode step for K + 1 tokens)."""
    return (expected_tokens_per_step(acceptance, draft_len) * target_step_s
            / (target_step_s + draft_len * draft_step_s))


@dataclass
class CompareRow:
    precision: str
    kv_cache: str
    tp: int
    draft: str | None
    gpus: int
    fits: bool
    weights_gib_total: float
    weights_gib_per_gpu: float
    kv_bytes_per_token_total: int
    kv_kib_per_token_total: float
    kv_cache_tokens: int
    max_concurrent_requests: int
    decode_batch: int
    decode_tokens_per_s_bound: float  # target-only roofline at decode_batch (plan_capacity's)
    tokens_per_target_step: float | None  # with a draft: (1 - a^(K+1)) / (1 - a)
    speculative_speedup: float | None  # draft cost included; 1.0 when the batch is above the speculation cap
    decode_tokens_per_s_estimate: float  # roofline x speed-up x efficiency
    prefill_ms_cold: float  # one request's prefill at the compute roofline x efficiency
    prefill_ms_with_reuse: float  # the same with the prefix hit ratio's blocks reused
    prefill_saving: float  # share of prefill compute skipped
    cost_per_1m_output_tokens_usd: float | None  # gpus x $/h / 3600 / estimated tok/s x 1e6
    input_len: int = 0
    output_len: int = 0
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    model: str
    gpu: str
    gpu_price_per_hour: float
    input_len: int
    output_len: int
    acceptance_rate: float
    draft_len: int | None
    prefix_hit_ratio: float
    efficiency: float
    assumption: str
    rows: list[CompareRow]
    skipped: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def _variant(spec: BuildSpec, *, precision: str, tp: int, draft: str | None):
    """`spec` with another precision (its default KV dtype), TP and draft; limits, serving and hardware kept."""
    from .spec import resolve_spec

    overrides: dict = {}
    for section in (spec.quantization, spec.parallelism, spec.limits, spec.speculation, spec.serving, spec.hardware):
        overrides.update(section.model_dump())
    overrides.update(precision=precision, kv_cache=None, tp=tp, draft=draft, draft_precision=None,
                     draft_gpu_device_ids=None, calib_data=None)
    if draft is None:
        overrides.update(draft_len=None, draft_max_batch_size=None)
    return resolve_spec(model=spec.model.name, target=spec.target, models_file=spec.models_file, validate=False,
                        **overrides)


def compare_plans(
    spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None,
    acceptance: float = DEFAULT_ACCEPTANCE, prefix_hit_ratio: float = 0.0, efficiency: float = DEFAULT_EFFICIENCY,
    precisions: tuple[str, ...] = COMPARE_PRECISIONS,
) -> Comparison:
    """`plan_capacity` over precisions x TP sizes (within the host's GPUs) x draft off/on (the spec's draft, else
    the registry default) for the spec's model and GPU, with speculation's gain, prefix reuse's prefill saving and
    estimated cost per row."""
    if not 0.0 <= acceptance <= 1.0 or not 0.0 <= prefix_hit_ratio <= 1.0 or not 0.0 < efficiency <= 1.0:
        raise SpecError("plan --compare: --acceptance and --prefix-hit must be within 0..1, --efficiency within (0, 1]")
    gpu = GPUS[spec.hardware.gpu]
    draft_name = spec.draft_model.name if spec.draft_model is not None else spec.model.default_draft
    rows: list[CompareRow] = []
    skipped: list[str] = []
    k_used = None
    for precision in precisions:
        if precision in ("fp8", "w4a8_awq") and not gpu.has_fp8:
            skipped.append(f"{precision}: {gpu.name} has no FP8")
            continue
        for tp in TP_CHOICES:
            if tp * spec.parallelism.pp > spec.hardware.gpu_count:
                break
            for draft in (None, draft_name) if draft_name else (None,):
                label = f"{precision} tp={tp} draft={draft or 'off'}"
                try:
                    variant = _variant(spec, precision=precision, tp=tp, draft=draft)
                    p = plan_capacity(variant, input_len=input_len, output_len=output_len)
                except SpecError as exc:
                    skipped.append(f"{label}: {exc}")
                    continue
                rows.append(_compare_row(variant, p, gpu, acceptance, prefix_hit_ratio, efficiency))
                if draft is not None:
                    k_used = variant.draft_len
    first = rows[0] if rows else None
    assumption = (f"estimates = roofline x {efficiency:.0%} efficiency (decode: every weight and the batch's KV read "
                  f"once per step at {gpu.hbm_tb_s} TB/s HBM; prefill: dense tensor-core peak); speculation at "
                  f"acceptance {acceptance:.0%}; prefill saving at prefix hit ratio {prefix_hit_ratio:.0%}")
    lengths = (first.input_len, first.output_len) if first else (input_len or 0, output_len or 0)
    return Comparison(spec.model.name, gpu.name, spec.hardware.gpu_price_per_hour, *lengths, acceptance, k_used,
                      prefix_hit_ratio, efficiency, assumption, rows, skipped)


def _compare_row(spec: BuildSpec, p: CapacityPlan, gpu: GPU, acceptance: float, hit: float,
                 efficiency: float) -> CompareRow:
    target, draft = engine_shapes(spec)
    bw = gpu.hbm_tb_s * 1e12
    batch = p.decode_batch
    tokens_per_step = speedup = None
    tok_s = p.decode_tokens_per_s_bound
    note = "" if p.fits else "does not fit"
    if draft is not None and batch > 0:
        tokens_per_step = round(expected_tokens_per_step(acceptance, spec.draft_len), 4)
        if batch <= spec.speculation.max_batch_for_speculation:
            avg_ctx = p.input_len + p.output_len / 2
            draft_step_s = (draft.weights_per_gpu() + batch * avg_ctx * draft.kv_per_token_per_gpu()) / bw
            speedup = speculative_speedup(acceptance, spec.draft_len, target_step_s=batch / tok_s,
                                          draft_step_s=draft_step_s)
        else:
            speedup = 1.0
            note = (note + "; " if note else "") + (f"batch {batch} > max_batch_for_speculation "
                                                    f"{spec.speculation.max_batch_for_speculation}: gated off")
        tok_s *= speedup
    estimate = tok_s * efficiency
    # Prefill: 2 FLOPs per linear parameter per prompt token, split over the TP ranks, at the dense peak.
    tflops = gpu.fp8_tflops if spec.quantization.precision in ("fp8", "w4a8_awq") else gpu.bf16_tflops
    flops_s = tflops * 1e12 * efficiency * p.tp
    block = spec.limits.tokens_per_block
    reused = int(hit * p.input_len) // block * block
    cold_ms = 2 * spec.model.architecture.linear_params * p.input_len / flops_s * 1e3
    warm_ms = 2 * spec.model.architecture.linear_params * (p.input_len - reused) / flops_s * 1e3
    cost = p.gpus * p.gpu_price_per_hour / 3600 / estimate * 1e6 if estimate > 0 else None
    return CompareRow(
        precision=p.precision, kv_cache=p.kv_cache, tp=p.tp, draft=spec.draft_model.name if draft else None,
        gpus=p.gpus, fits=p.fits, weights_gib_total=p.weights_gib_total, weights_gib_per_gpu=p.weights_gib_per_gpu,
        kv_bytes_per_token_total=p.kv_bytes_per_token_total,
        kv_kib_per_token_total=round(p.kv_bytes_per_token_total / 1024, 2), kv_cache_tokens=p.kv_cache_tokens,
        max_concurrent_requests=p.max_concurrent_requests, decode_batch=batch,
        decode_tokens_per_s_bound=p.decode_tokens_per_s_bound, tokens_per_target_step=tokens_per_step,
        speculative_speedup=round(speedup, 4) if speedup is not None else None,
        decode_tokens_per_s_estimate=round(estimate, 1), prefill_ms_cold=round(cold_ms, 2),
        prefill_ms_with_reuse=round(warm_ms, 2), prefill_saving=round(reused / p.input_len, 4),
        cost_per_1m_output_tokens_usd=round(cost, 4) if cost is not None else None, input_len=p.input_len,
        output_len=p.output_len, note=note)


def format_comparison(c: Comparison) -> str:
    """Text table: one row per precision x TP x draft."""
    head = ("precision", "KV", "tp", "draft", "fits", "weights GiB", "KV KiB/tok", "KV tokens", "max conc",
            "batch", "bound tok/s", "spec x", "est tok/s", "prefill ms", "$/1M tok", "note")
    out = [head]
    for r in c.rows:
        out.append((r.precision, r.kv_cache, str(r.tp), r.draft or "-", "yes" if r.fits else "NO",
                    f"{r.weights_gib_total:.1f}", f"{r.kv_kib_per_token_total:g}", f"{r.kv_cache_tokens:,}",
                    f"{r.max_concurrent_requests:,}", str(r.decode_batch), f"{r.decode_tokens_per_s_bound:,.0f}",
                    "-" if r.speculative_speedup is None else f"{r.speculative_speedup:.2f}",
                    f"{r.decode_tokens_per_s_estimate:,.0f}",
                    f"{r.prefill_ms_cold:.1f}->{r.prefill_ms_with_reuse:.1f}",
                    "n/a" if r.cost_per_1m_output_tokens_usd is None else f"{r.cost_per_1m_output_tokens_usd:.4f}",
                    r.note))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in out]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", f"{c.model} on {c.gpu} at ${c.gpu_price_per_hour:.2f}/GPU-h, {c.input_len}+{c.output_len} tokens "
                  f"per request; draft K={c.draft_len}", f"assumption: {c.assumption}",
              "$ per 1M output tokens = gpus x $/GPU-h / 3600 / estimated tok/s x 1e6"]
    lines += [f"skipped: {s}" for s in c.skipped]
    return "\n".join(lines)
