"""Comparing choices (`plan --compare`): precisions x TP x draft on/off for one model and GPU, each planned by
`planner.plan_capacity` at limits `limits_choice` chooses again."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPU, GPUS, gpu_price
from pipeline.core.spec import BuildSpec, resolve_spec
from pipeline.core.table import format_table
from pipeline.planning.limits_choice import choose_limits
from pipeline.planning.perf_model import expected_tokens_per_step
from pipeline.planning.planner import DEFAULT_ACCEPTANCE, TP_CHOICES, CapacityPlan, plan_capacity, serving_estimate

COMPARE_PRECISIONS = ("bf16", "fp8", "int4_awq", "w4a8_awq")


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
    decode_tokens_per_s_bound: float  # plan_capacity's HBM roofline at decode_batch: an upper bound
    tokens_per_target_step: float | None  # with a draft: (1 - a^(K+1)) / (1 - a)
    speculative_speedup: float | None  # estimate with the draft over without; 1.0 when gated off at this batch
    ttft_ms_estimate: float
    tpot_ms_estimate: float
    output_tokens_per_s_estimate: float  # plan_capacity's calibrated estimate
    prefill_ms_cold: float  # one request's prefill step (perf_model), no prefix reuse
    prefill_ms_with_reuse: float  # the same with the prefix hit ratio's blocks reused
    prefill_saving: float  # share of prompt tokens skipped
    cost_per_1m_output_tokens_usd: float | None  # gpus x $/h / 3600 / estimated tok/s x 1e6
    input_len: int = 0
    output_len: int = 0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    model: str
    gpu: str
    gpu_price_per_hour: float
    gpu_price_source: str
    input_len: int
    output_len: int
    acceptance_rate: float
    draft_len: int | None
    prefix_hit_ratio: float
    assumption: str
    rows: list[CompareRow]
    skipped: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _variant(spec: BuildSpec, *, precision: str, tp: int, draft: str | None) -> BuildSpec:
    """`spec` with another precision (its default KV dtype), TP and draft; limits, serving and hardware kept."""
    overrides: dict[str, Any] = {}
    for section in (spec.quantization, spec.parallelism, spec.limits, spec.speculation, spec.serving, spec.hardware):
        overrides.update(section.model_dump())
    overrides.update(precision=precision, kv_cache=None, tp=tp, draft=draft, draft_precision=None,
                     draft_gpu_device_ids=None, calib_data=None)
    overrides.update(dict.fromkeys(spec.limit_reasons))  # limits the memory model chose are chosen again
    if draft is None:
        overrides.update(draft_len=None, draft_max_batch_size=None)
    variant = resolve_spec(model=spec.model.name, target=spec.target, models_file=spec.models_file, validate=False,
                           **overrides)
    return choose_limits(variant, validate=False) if spec.limit_reasons else variant


def compare_plans(
    spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None,
    acceptance: float = DEFAULT_ACCEPTANCE, prefix_hit_ratio: float = 0.0,
    precisions: tuple[str, ...] = COMPARE_PRECISIONS,
) -> Comparison:
    """`plan_capacity` over precisions x TP sizes (within the host's GPUs) x draft off/on (the spec's draft, else
    the registry default) for the spec's model and GPU, with speculation's gain, prefix reuse's prefill saving and
    estimated cost per row."""
    if not 0.0 <= acceptance <= 1.0 or not 0.0 <= prefix_hit_ratio <= 1.0:
        raise SpecError("plan --compare: --acceptance and --prefix-hit must be within 0..1")
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
                    p = plan_capacity(variant, input_len=input_len, output_len=output_len, acceptance=acceptance,
                                      prefix_hit_ratio=prefix_hit_ratio)
                except SpecError as exc:
                    skipped.append(f"{label}: {exc}")
                    continue
                rows.append(_compare_row(variant, p, gpu, acceptance))
                if draft is not None:
                    k_used = variant.draft_len
    first = rows[0] if rows else None
    assumption = (f"estimates: continuous batching at each row's batch, constants calibrated against AIConfigurator "
                  f"0.12 (H100 SXM, TensorRT-LLM); speculation at acceptance {acceptance:.0%}; prefix hit ratio "
                  f"{prefix_hit_ratio:.0%}; bound: pure-decode HBM roofline at {gpu.hbm_tb_s} TB/s")
    lengths = (first.input_len, first.output_len) if first else (input_len or 0, output_len or 0)
    price = gpu_price(gpu.name, spec.hardware.gpu_price_per_hour)
    return Comparison(spec.model.name, gpu.name, price.usd_per_hour, price.source, *lengths, acceptance, k_used,
                      prefix_hit_ratio, assumption, rows, skipped)


def _compare_row(spec: BuildSpec, p: CapacityPlan, gpu: GPU, acceptance: float) -> CompareRow:
    plain = dict(tp=p.tp, batch=p.decode_batch, input_len=p.input_len, output_len=p.output_len)
    no_draft = spec.model_copy(update={"draft_model": None}) if spec.draft_model is not None else spec
    cold, _ = serving_estimate(no_draft, gpu, acceptance=acceptance, prefix_hit_ratio=0.0, **plain)
    warm, _ = serving_estimate(no_draft, gpu, acceptance=acceptance, prefix_hit_ratio=p.prefix_hit_ratio, **plain)
    tokens_per_step = speedup = None
    note = "" if p.fits else "does not fit"
    if spec.draft_model is not None and p.decode_batch > 0:
        tokens_per_step = round(expected_tokens_per_step(acceptance, spec.draft_len), 4)
        speedup = p.output_tokens_per_s_estimate / warm.output_tokens_per_s if p.speculation_active else 1.0
        if not p.speculation_active:
            note = (note + "; " if note else "") + (f"batch {p.decode_batch} > max_batch_for_speculation "
                                                    f"{spec.speculation.max_batch_for_speculation}: gated off")
    return CompareRow(
        precision=p.precision, kv_cache=p.kv_cache, tp=p.tp, draft=spec.draft_model.name if spec.draft_model else None,
        gpus=p.gpus, fits=p.fits, weights_gib_total=p.weights_gib_total, weights_gib_per_gpu=p.weights_gib_per_gpu,
        kv_bytes_per_token_total=p.kv_bytes_per_token_total,
        kv_kib_per_token_total=round(p.kv_bytes_per_token_total / 1024, 2), kv_cache_tokens=p.kv_cache_tokens,
        max_concurrent_requests=p.max_concurrent_requests, decode_batch=p.decode_batch,
        decode_tokens_per_s_bound=p.decode_tokens_per_s_bound, tokens_per_target_step=tokens_per_step,
        speculative_speedup=round(speedup, 4) if speedup is not None else None,
        ttft_ms_estimate=p.ttft_ms_estimate, tpot_ms_estimate=p.tpot_ms_estimate,
        output_tokens_per_s_estimate=p.output_tokens_per_s_estimate, prefill_ms_cold=round(cold.prefill_ms, 2),
        prefill_ms_with_reuse=round(warm.prefill_ms, 2),
        prefill_saving=round(1 - _new_prompt_tokens(spec, p) / p.input_len, 4) if p.input_len else 0.0,
        cost_per_1m_output_tokens_usd=p.cost_per_1m_output_tokens_usd, input_len=p.input_len,
        output_len=p.output_len, note=note)


def _new_prompt_tokens(spec: BuildSpec, p: CapacityPlan) -> int:
    """Prompt tokens prefilled after the prefix hit ratio's whole blocks are reused."""
    block = spec.limits.tokens_per_block
    return p.input_len - int(p.prefix_hit_ratio * p.input_len) // block * block


def format_comparison(c: Comparison) -> str:
    """Text table: one row per precision x TP x draft."""
    head = ("precision", "KV", "tp", "draft", "fits", "weights GiB", "KV KiB/tok", "KV tokens", "max conc",
            "batch", "bound tok/s", "spec x", "est tok/s", "TTFT ms", "TPOT ms", "prefill ms", "$/1M tok", "note")
    out = [head]
    for r in c.rows:
        out.append((r.precision, r.kv_cache, str(r.tp), r.draft or "-", "yes" if r.fits else "NO",
                    f"{r.weights_gib_total:.1f}", f"{r.kv_kib_per_token_total:g}", f"{r.kv_cache_tokens:,}",
                    f"{r.max_concurrent_requests:,}", str(r.decode_batch), f"{r.decode_tokens_per_s_bound:,.0f}",
                    "-" if r.speculative_speedup is None else f"{r.speculative_speedup:.2f}",
                    f"{r.output_tokens_per_s_estimate:,.0f}", f"{r.ttft_ms_estimate:,.0f}",
                    f"{r.tpot_ms_estimate:.1f}", f"{r.prefill_ms_cold:.1f}->{r.prefill_ms_with_reuse:.1f}",
                    "n/a" if r.cost_per_1m_output_tokens_usd is None else f"{r.cost_per_1m_output_tokens_usd:.4f}",
                    r.note))
    lines = [format_table(out, header=True)]
    lines += ["", f"{c.model} on {c.gpu} at ${c.gpu_price_per_hour:.2f}/GPU-h, {c.input_len}+{c.output_len} tokens "
                  f"per request; draft K={c.draft_len}", f"assumption: {c.assumption}",
              "$ per 1M output tokens = gpus x $/GPU-h / 3600 / estimated tok/s x 1e6",
              f"GPU price: {c.gpu_price_source}"]
    lines += [f"skipped: {s}" for s in c.skipped]
    return "\n".join(lines)
