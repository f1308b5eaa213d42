"""Memory, capacity, roofline throughput and cost planning (FACTS §7). Pure arithmetic, no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import SpecError
from .gpus import GIB, GPU, GPUS
from .registry import Architecture
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


@dataclass
class Plan:
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
    draft_weights_gib_per_gpu: float
    kv_bytes_per_token_total: int
    kv_bytes_per_token_per_gpu: int
    reserve_gib_per_gpu: float
    free_gib_per_gpu: float
    kv_pool_gib_per_gpu: float
    kv_cache_tokens: int
    max_concurrent_requests: int
    fits: bool
    min_tp: int | None
    decode_batch: int
    decode_tokens_per_s_bound: float
    gpu_price_per_hour: float
    cost_per_1m_output_tokens_usd: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def _per_gpu(spec: BuildSpec, tp: int, pp: int, gpu: GPU, input_len: int, output_len: int, max_batch: int) -> dict:
    q = spec.quantization
    arch = spec.model.architecture
    world = tp * pp
    w_total = weight_bytes(arch, q.precision, awq_block=q.awq_block_size)
    w_gpu = w_total / world
    kv_total = kv_bytes_per_token(arch, q.kv)
    kv_gpu = kv_bytes_per_token(arch, q.kv, tp=tp) / pp
    draft_w_gpu = draft_kv_gpu = 0.0
    if spec.draft_model:
        darch = spec.draft_model.architecture
        draft_w_gpu = weight_bytes(darch, spec.draft_precision, awq_block=q.awq_block_size) / world
        draft_kv_gpu = kv_bytes_per_token(darch, q.kv, tp=tp) / pp
    reserve = RUNTIME_RESERVE_GIB * GIB + activation_bytes(
        arch, max_num_tokens=spec.max_num_tokens, max_batch=max_batch, tp=tp
    )
    free = gpu.memory_gib * GIB - w_gpu - draft_w_gpu - reserve
    fraction = spec.serving.target_fraction(bool(spec.draft_model))
    pool = max(0.0, free) * fraction
    if spec.serving.max_tokens_in_paged_kv_cache:
        pool = min(pool, spec.serving.max_tokens_in_paged_kv_cache * kv_gpu)
    # A speculative request keeps KV in both engines; count tokens as target+draft bytes.
    tokens = int(pool // (kv_gpu + draft_kv_gpu))
    block = spec.limits.tokens_per_block
    per_request = math.ceil((input_len + output_len + spec.draft_len) / block) * block
    concurrent = tokens // per_request
    return dict(
        w_total=w_total, w_gpu=w_gpu, draft_w_gpu=draft_w_gpu, kv_total=kv_total, kv_gpu=kv_gpu,
        draft_kv_gpu=draft_kv_gpu, reserve=reserve, free=free, pool=pool, tokens=tokens, concurrent=concurrent,
    )


def plan(spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None) -> Plan:
    """Plan memory fit, KV capacity, concurrency, decode roofline and cost for a resolved spec."""
    gpu = GPUS[spec.hardware.gpu]
    tp, pp = spec.parallelism.tp, spec.parallelism.pp
    if input_len is not None and not 0 < input_len <= spec.max_input_len:
        raise SpecError(
            f"plan: --input-len={input_len} must be within 1..max_input_len={spec.max_input_len}; "
            "lower it or raise --max-input-len"
        )
    input_len = input_len or min(1024, spec.max_input_len)
    if output_len is not None and not 0 < output_len <= spec.max_seq_len - input_len:
        raise SpecError(
            f"plan: --output-len={output_len} must be within 1..{spec.max_seq_len - input_len} "
            f"(max_seq_len={spec.max_seq_len} - input {input_len}); lower it or raise --max-seq-len"
        )
    output_len = output_len or min(256, spec.max_seq_len - input_len)
    max_batch = spec.max_batch_size
    r = _per_gpu(spec, tp, pp, gpu, input_len, output_len, max_batch)
    fits = r["free"] > 0 and r["concurrent"] >= 1
    min_tp = None
    for cand in TP_CHOICES:
        if cand * pp > spec.hardware.gpu_count:
            break
        c = _per_gpu(spec, cand, pp, gpu, input_len, output_len, max_batch)
        if c["free"] > 0 and c["concurrent"] >= 1:
            min_tp = cand
            break
    batch = min(max_batch, r["concurrent"])
    # Decode is memory bound: each step reads every weight once plus the batch's KV (average context).
    avg_ctx = input_len + output_len / 2
    step_bytes = r["w_gpu"] + r["draft_w_gpu"] + batch * avg_ctx * (r["kv_gpu"] + r["draft_kv_gpu"])
    tok_s = batch * gpu.hbm_tb_s * 1e12 / step_bytes if batch > 0 else 0.0
    world = tp * pp
    price = spec.hardware.gpu_price_per_hour
    cost = world * price / 3600 / tok_s * 1e6 if tok_s > 0 else None
    return Plan(
        model=spec.model.name,
        precision=spec.quantization.precision,
        kv_cache=spec.quantization.kv,
        gpu=gpu.name,
        tp=tp,
        pp=pp,
        gpus=world,
        input_len=input_len,
        output_len=output_len,
        max_batch_size=max_batch,
        weights_gib_total=round(r["w_total"] / GIB, 2),
        weights_gib_per_gpu=round(r["w_gpu"] / GIB, 2),
        draft_weights_gib_per_gpu=round(r["draft_w_gpu"] / GIB, 2),
        kv_bytes_per_token_total=r["kv_total"],
        kv_bytes_per_token_per_gpu=int(r["kv_gpu"]),
        reserve_gib_per_gpu=round(r["reserve"] / GIB, 2),
        free_gib_per_gpu=round(r["free"] / GIB, 2),
        kv_pool_gib_per_gpu=round(r["pool"] / GIB, 2),
        kv_cache_tokens=r["tokens"],
        max_concurrent_requests=r["concurrent"],
        fits=fits,
        min_tp=min_tp,
        decode_batch=batch,
        decode_tokens_per_s_bound=round(tok_s, 1),
        gpu_price_per_hour=price,
        cost_per_1m_output_tokens_usd=round(cost, 4) if cost is not None else None,
    )


def format_plan(p: Plan) -> str:
    """Human-readable table."""
    rows = [
        ("model / precision / KV", f"{p.model} / {p.precision} / {p.kv_cache}"),
        ("GPUs", f"{p.gpus} x {p.gpu} (tp={p.tp}, pp={p.pp})"),
        ("weights total / per GPU", f"{p.weights_gib_total:.2f} GiB / {p.weights_gib_per_gpu:.2f} GiB"),
    ]
    if p.draft_weights_gib_per_gpu:
        rows.append(("draft weights per GPU", f"{p.draft_weights_gib_per_gpu:.2f} GiB"))
    rows += [
        ("KV bytes/token total / per GPU", f"{p.kv_bytes_per_token_total} / {p.kv_bytes_per_token_per_gpu}"),
        ("runtime reserve per GPU", f"{p.reserve_gib_per_gpu:.2f} GiB"),
        ("KV pool per GPU", f"{p.kv_pool_gib_per_gpu:.2f} GiB"),
        ("KV capacity", f"{p.kv_cache_tokens:,} tokens"),
        (f"concurrent requests @ {p.input_len}+{p.output_len}", f"{p.max_concurrent_requests:,}"),
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
