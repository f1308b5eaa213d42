"""Comparing choices (`plan --compare`): precisions x TP x speculation mode (none, draft-target with the spec's or the
registry's default draft, ngram and eagle3 where the spec's runtime runs them) for one model and GPU, each planned by
`planner.plan_capacity` at limits `limits_choice` chooses again; then the four modes side by side at the spec's
precision and TP (`mode_rows`), each on a runtime that runs it, with $ per 1M at low and high load and its
break-even. EAGLE-3 drafts with the registry's head for the target, else with the planner's estimate of one
(`speculation_modes.estimated_head`), labelled as such."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPU, GPUS, gpu_price
from pipeline.core.registry import eagle3_heads
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import DRAFT_TARGET, EAGLE3, NGRAM, BuildSpec, resolve_spec
from pipeline.core.spec_rules import validate_spec
from pipeline.core.table import format_table
from pipeline.planning.break_even import break_even_batch, speculation_break_even
from pipeline.planning.limits_choice import choose_limits
from pipeline.planning.perf_model import expected_tokens_per_step
from pipeline.planning.planner import TP_CHOICES, CapacityPlan, cost_per_1m, plan_capacity, serving_estimate
from pipeline.planning.speculation_modes import (
    EAGLE3_RECIPE_DRAFT_LEN, EAGLE3_RECIPE_DRAFT_VOCAB, acceptances, eagle3_head, without_speculation,
)

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
    tokens_per_target_step: float | None  # with speculation: (1 - a^(K+1)) / (1 - a)
    speculative_speedup: float | None  # estimate with speculation over without; 1.0 when gated off at this batch
    ttft_ms_estimate: float
    tpot_ms_estimate: float
    output_tokens_per_s_estimate: float  # plan_capacity's calibrated estimate
    low_load_tokens_per_s: float  # the same at batch 1 (one request: where speculation gains most)
    prefill_ms_cold: float  # one request's prefill step (perf_model), no prefix reuse
    prefill_ms_with_reuse: float  # the same with the prefix hit ratio's blocks reused
    prefill_saving: float  # share of prompt tokens skipped
    cost_per_1m_output_tokens_usd: float | None  # gpus x $/h / 3600 / estimated tok/s x 1e6
    input_len: int = 0
    output_len: int = 0
    note: str = ""
    mode: str | None = None  # the speculation mode: draft-target, eagle3, ngram or None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ModeRow:
    """One speculation mode at the spec's precision and TP: its drafter, acceptance, break-even and cost at low
    load (batch 1) and high load (the batch ceiling)."""

    mode: str | None
    precision: str
    tp: int
    runtime: str  # the spec's, or pytorch where only the LLM API runs the mode
    drafter: str  # the draft model, the EAGLE-3 head (or its estimate's label), "prompt lookup" or "-"
    draft_len: int
    acceptance: float | None  # per drafted token
    tokens_per_target_step: float | None
    break_even_acceptance: float | None  # at batch 1: below it the mode is slower than none
    break_even_batch: int | None  # the largest batch it pays at, at its acceptance (the gate lifted)
    gate: int | None  # max_batch_for_speculation: above it the mode is off
    low_batch: int
    low_tokens_per_s: float
    low_cost_per_1m_usd: float | None
    high_batch: int
    high_tokens_per_s: float
    high_cost_per_1m_usd: float | None
    estimate: bool = False  # an EAGLE-3 head the registry does not have: the planner's estimate of one


@dataclass
class Comparison:
    model: str
    gpu: str
    gpu_price_per_hour: float
    gpu_price_source: str
    input_len: int
    output_len: int
    acceptance_rate: float  # draft-target's (the spec's mode's when it has one: `acceptances`)
    draft_len: int | None
    prefix_hit_ratio: float
    assumption: str
    rows: list[CompareRow]
    skipped: list[str]
    acceptances: dict[str, float] | None = None  # per speculation mode
    modes: list[ModeRow] | None = None  # the four modes at the spec's precision and TP (`mode_rows`)
    modes_skipped: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _variant(spec: BuildSpec, *, precision: str, tp: int, mode: str | None, draft: str | None,
             runtime: str | None = None) -> BuildSpec:
    """`spec` with another precision (its default KV dtype), TP, speculation mode (`draft`: draft-target's model or
    eagle3's head; eagle3 without one: the estimated head at K=3) and runtime (None: the spec's); limits, serving and
    hardware kept."""
    overrides: dict[str, Any] = {}
    for section in (spec.quantization, spec.parallelism, spec.limits, spec.speculation, spec.serving, spec.hardware):
        overrides.update(section.model_dump())
    overrides.update(precision=precision, kv_cache=None, tp=tp,
                     draft=draft if mode in (DRAFT_TARGET, EAGLE3) else None,
                     speculative_decoding=mode if mode in (NGRAM, EAGLE3) else None, draft_precision=None,
                     draft_gpu_device_ids=None, calib_data=None)
    overrides.update(dict.fromkeys(spec.limit_reasons))  # limits the memory model chose are chosen again
    if mode is None:
        overrides.update(draft_len=None)
    if mode == EAGLE3 and draft is None and overrides.get("draft_len") is None:
        overrides.update(draft_len=EAGLE3_RECIPE_DRAFT_LEN)
    if mode != DRAFT_TARGET or runtime_of(spec).llmapi:  # the LLM API runs a draft inside the target
        overrides.update(draft_tp=None, draft_max_batch_size=None)
    if mode != NGRAM:
        overrides.update(max_matching_ngram_size=None)
    variant = resolve_spec(model=spec.model.name, target=spec.target, runtime=runtime or spec.runtime,
                           models_file=spec.models_file, validate=False, **overrides)
    return choose_limits(variant, validate=False) if spec.limit_reasons else variant


def head_name(spec: BuildSpec) -> str | None:
    """The EAGLE-3 head eagle3 drafts with for `spec`'s model: the spec's, else the registry's first for the target;
    None: none is registered (the planner estimates one)."""
    if spec.speculation_mode == EAGLE3 and spec.draft_model is not None:
        return spec.draft_model.name
    heads = eagle3_heads(spec.model.name, models_file=spec.models_file)
    return heads[0].name if heads else None


def _refusal(spec: BuildSpec, mode: str | None, draft: str | None, runtime: str | None = None) -> str | None:
    """Why the rules refuse `spec` with speculation `mode` (at its own precision and TP) on `runtime`, else None.
    eagle3 without a registered head: the rules of an estimate (the PyTorch backend, no pipeline parallelism), since
    the spec's rules refuse any eagle3 spec without a head."""
    variant = _variant(spec, precision=spec.quantization.precision, tp=spec.parallelism.tp, mode=mode, draft=draft,
                       runtime=runtime)
    if mode == EAGLE3 and draft is None:
        if not runtime_of(variant).llmapi:
            return ("speculation.speculative_decoding=eagle3 runs on TensorRT-LLM's PyTorch backend only; pass "
                    "--runtime pytorch")
        if variant.parallelism.pp != 1:
            return f"parallelism.pp={variant.parallelism.pp} with eagle3: EAGLE-3 runs without pipeline parallelism"
        mode, draft = None, None  # the rest as without speculation
    try:
        validate_spec(_variant(spec, precision=spec.quantization.precision, tp=spec.parallelism.tp, mode=mode,
                               draft=draft, runtime=runtime))
    except SpecError as exc:
        return str(exc)
    return None


def compare_modes(spec: BuildSpec) -> tuple[list[tuple[str | None, str | None]], list[str]]:
    """The speculation modes `plan --compare` weighs for `spec` as (mode, draft model or head): none, draft-target
    (the spec's draft, else the registry default), ngram, eagle3 (`head_name`, None: the estimated head); each mode
    the spec's rules refuse on its runtime (tried at the spec's own precision and TP, where they accept no
    speculation) is left out with the rule's line."""
    drafting = spec.quantized_draft
    draft_name = drafting.name if drafting is not None else spec.model.default_draft
    modes: list[tuple[str | None, str | None]] = [(None, None)]
    skipped = []
    if draft_name is None:
        skipped.append(f"{DRAFT_TARGET}: {spec.model.name} has no default draft model (pass --draft NAME)")
    plain = _refusal(spec, None, None)
    for mode, draft in ((DRAFT_TARGET, draft_name), (NGRAM, None), (EAGLE3, head_name(spec))):
        if mode == DRAFT_TARGET and draft is None:
            continue
        why = _refusal(spec, mode, draft)
        if why is not None and why != plain:
            skipped.append(f"{mode}: {why}")
            continue
        modes.append((mode, draft))
    return modes, skipped


def mode_rows(spec: BuildSpec, *, input_len: int | None, output_len: int | None, rates: dict[str, float],
              prefix_hit_ratio: float) -> tuple[list[ModeRow], list[str]]:
    """none / draft-target / ngram / eagle3 at the spec's precision and TP, each on the spec's runtime where its
    rules accept the mode there, else on pytorch (the LLM API runs every mode); the modes no runtime accepts are
    left out with why."""
    drafting = spec.quantized_draft
    draft_name = drafting.name if drafting is not None else spec.model.default_draft
    rows, skipped = [], []
    for mode, draft in ((None, None), (DRAFT_TARGET, draft_name), (NGRAM, None), (EAGLE3, head_name(spec))):
        if mode == DRAFT_TARGET and draft is None:
            skipped.append(f"{DRAFT_TARGET}: {spec.model.name} has no default draft model (pass --draft NAME)")
            continue
        runtimes = (spec.runtime,) if runtime_of(spec).llmapi else (spec.runtime, "pytorch")
        why = ""
        for runtime in runtimes:
            refusal = _refusal(spec, mode, draft, runtime)
            if refusal is None:
                variant = _variant(spec, precision=spec.quantization.precision, tp=spec.parallelism.tp, mode=mode,
                                   draft=draft, runtime=runtime)
                try:
                    rows.append(_mode_row(variant, input_len=input_len, output_len=output_len,
                                          acceptance=rates[mode] if mode else None, prefix_hit_ratio=prefix_hit_ratio))
                except SpecError as exc:
                    why = str(exc)
                    continue
                break
            why = why or refusal
        else:
            skipped.append(f"{mode or 'none'}: {why}")
    return rows, skipped


def _mode_row(spec: BuildSpec, *, input_len: int | None, output_len: int | None, acceptance: float | None,
              prefix_hit_ratio: float) -> ModeRow:
    p = plan_capacity(spec, input_len=input_len, output_len=output_len, acceptance=acceptance,
                      prefix_hit_ratio=prefix_hit_ratio, tpot_target_ms=None)
    gpu = GPUS[spec.hardware.gpu]
    terms: dict[str, Any] = dict(tp=p.tp, input_len=p.input_len, output_len=p.output_len, acceptance=acceptance,
                                 prefix_hit_ratio=prefix_hit_ratio)
    low, _ = serving_estimate(spec, gpu, batch=min(1, p.batch_ceiling), **terms)
    high, _ = serving_estimate(spec, gpu, batch=p.batch_ceiling, **terms)
    mode, head = spec.speculation_mode, eagle3_head(spec)
    even = speculation_break_even(spec, input_len=p.input_len, output_len=p.output_len,
                                  prefix_hit_ratio=prefix_hit_ratio, batch=1)
    drafter = "-" if mode is None else "prompt lookup" if mode == NGRAM else \
        (head.name or "estimated head") if head is not None else spec.draft_model.name if spec.draft_model else "-"
    return ModeRow(
        mode=mode, precision=p.precision, tp=p.tp, runtime=spec.runtime, drafter=drafter, draft_len=spec.draft_len, acceptance=acceptance,
        tokens_per_target_step=round(expected_tokens_per_step(acceptance, spec.draft_len), 4)
        if mode is not None and acceptance is not None else None,
        break_even_acceptance=even.acceptance if even is not None else None,
        break_even_batch=break_even_batch(spec, acceptance=acceptance, ceiling=p.batch_ceiling,
                                          input_len=p.input_len, output_len=p.output_len,
                                          prefix_hit_ratio=prefix_hit_ratio) if mode is not None else None,
        gate=spec.speculation.max_batch_for_speculation if mode is not None else None,
        low_batch=min(1, p.batch_ceiling), low_tokens_per_s=round(low.output_tokens_per_s, 1),
        low_cost_per_1m_usd=cost_per_1m(p.gpus, p.gpu_price_per_hour, low.output_tokens_per_s),
        high_batch=p.batch_ceiling, high_tokens_per_s=round(high.output_tokens_per_s, 1),
        high_cost_per_1m_usd=cost_per_1m(p.gpus, p.gpu_price_per_hour, high.output_tokens_per_s),
        estimate=head is not None and head.name is None)


def compare_plans(
    spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None,
    acceptance: float | None = None, prefix_hit_ratio: float = 0.0,
    precisions: tuple[str, ...] = COMPARE_PRECISIONS,
) -> Comparison:
    """`plan_capacity` over precisions x TP sizes (within the host's GPUs) x speculation modes (`compare_modes`)
    for the spec's model and GPU, with speculation's gain, prefix reuse's prefill saving and estimated cost per row.
    `acceptance` is the spec's mode's (draft-target's without one); each other mode takes its default."""
    if not 0.0 <= (acceptance or 0.0) <= 1.0 or not 0.0 <= prefix_hit_ratio <= 1.0:
        raise SpecError("plan --compare: --acceptance and --prefix-hit must be within 0..1")
    gpu = GPUS[spec.hardware.gpu]
    rates = acceptances(spec, acceptance)
    modes, skipped = compare_modes(spec)
    rows: list[CompareRow] = []
    k_used = None
    for precision in precisions:
        if precision in ("fp8", "w4a8_awq") and not gpu.has_fp8:
            skipped.append(f"{precision}: {gpu.name} has no FP8")
            continue
        for tp in TP_CHOICES:
            if tp * spec.parallelism.pp > spec.hardware.gpu_count:
                break
            for mode, draft in modes:
                label = f"{precision} tp={tp} " + (f"draft={draft}" if draft else f"speculation={mode or 'off'}")
                rate = rates[mode] if mode is not None else None
                try:
                    variant = _variant(spec, precision=precision, tp=tp, mode=mode, draft=draft)
                    p = plan_capacity(variant, input_len=input_len, output_len=output_len, acceptance=rate,
                                      prefix_hit_ratio=prefix_hit_ratio)
                except SpecError as exc:
                    skipped.append(f"{label}: {exc}")
                    continue
                rows.append(_compare_row(variant, p, gpu, rate))
                if mode is not None:
                    k_used = variant.draft_len
    first = rows[0] if rows else None
    assumption = (f"estimates: continuous batching at each row's batch, constants calibrated against AIConfigurator "
                  f"0.12 (H100 SXM, TensorRT-LLM); speculation at acceptance "
                  f"{', '.join(f'{m} {rates[m]:.0%}' for m, _ in modes if m is not None) or 'n/a'}; prefix hit ratio "
                  f"{prefix_hit_ratio:.0%}; bound: pure-decode HBM roofline at {gpu.hbm_tb_s} TB/s")
    lengths = (first.input_len, first.output_len) if first else (input_len or 0, output_len or 0)
    price = gpu_price(gpu.name, spec.hardware.gpu_price_per_hour)
    by_mode, modes_skipped = mode_rows(spec, input_len=input_len, output_len=output_len, rates=rates,
                                       prefix_hit_ratio=prefix_hit_ratio)
    return Comparison(spec.model.name, gpu.name, price.usd_per_hour, price.source, *lengths, rates[DRAFT_TARGET],
                      k_used, prefix_hit_ratio, assumption, rows, skipped,
                      acceptances={m: rates[m] for m, _ in modes if m is not None}, modes=by_mode,
                      modes_skipped=modes_skipped)


def _compare_row(spec: BuildSpec, p: CapacityPlan, gpu: GPU, acceptance: float | None) -> CompareRow:
    plain = dict(tp=p.tp, batch=p.decode_batch, input_len=p.input_len, output_len=p.output_len)
    no_draft = without_speculation(spec)
    cold, _ = serving_estimate(no_draft, gpu, acceptance=acceptance, prefix_hit_ratio=0.0, **plain)
    warm, _ = serving_estimate(no_draft, gpu, acceptance=acceptance, prefix_hit_ratio=p.prefix_hit_ratio, **plain)
    single, _ = serving_estimate(spec, gpu, acceptance=acceptance, prefix_hit_ratio=p.prefix_hit_ratio,
                                 **(plain | {"batch": min(1, p.batch_ceiling)}))
    tokens_per_step = speedup = None
    note = "" if p.fits else "does not fit"
    if spec.speculation_mode is not None and acceptance is not None and p.decode_batch > 0:
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
        output_tokens_per_s_estimate=p.output_tokens_per_s_estimate,
        low_load_tokens_per_s=round(single.output_tokens_per_s, 1), prefill_ms_cold=round(cold.prefill_ms, 2),
        prefill_ms_with_reuse=round(warm.prefill_ms, 2),
        prefill_saving=round(1 - _new_prompt_tokens(spec, p) / p.input_len, 4) if p.input_len else 0.0,
        cost_per_1m_output_tokens_usd=p.cost_per_1m_output_tokens_usd, input_len=p.input_len,
        output_len=p.output_len, note=note, mode=spec.speculation_mode)


def _new_prompt_tokens(spec: BuildSpec, p: CapacityPlan) -> int:
    """Prompt tokens prefilled after the prefix hit ratio's whole blocks are reused."""
    block = spec.limits.tokens_per_block
    return p.input_len - int(p.prefix_hit_ratio * p.input_len) // block * block


def format_comparison(c: Comparison) -> str:
    """Text table: one row per precision x TP x speculation mode."""
    head = ("precision", "KV", "tp", "speculation", "fits", "weights GiB", "KV KiB/tok", "KV tokens", "max conc",
            "batch", "bound tok/s", "spec x", "est tok/s", "tok/s @1", "TTFT ms", "TPOT ms", "prefill ms", "$/1M tok", "note")
    out = [head]
    for r in c.rows:
        out.append((r.precision, r.kv_cache, str(r.tp), _mode_cell(r), "yes" if r.fits else "NO",
                    f"{r.weights_gib_total:.1f}", f"{r.kv_kib_per_token_total:g}", f"{r.kv_cache_tokens:,}",
                    f"{r.max_concurrent_requests:,}", str(r.decode_batch), f"{r.decode_tokens_per_s_bound:,.0f}",
                    "-" if r.speculative_speedup is None else f"{r.speculative_speedup:.2f}",
                    f"{r.output_tokens_per_s_estimate:,.0f}", f"{r.low_load_tokens_per_s:,.0f}",
                    f"{r.ttft_ms_estimate:,.0f}",
                    f"{r.tpot_ms_estimate:.1f}", f"{r.prefill_ms_cold:.1f}->{r.prefill_ms_with_reuse:.1f}",
                    "n/a" if r.cost_per_1m_output_tokens_usd is None else f"{r.cost_per_1m_output_tokens_usd:.4f}",
                    r.note))
    lines = [format_table(out, header=True)]
    lines += ["", f"{c.model} on {c.gpu} at ${c.gpu_price_per_hour:.2f}/GPU-h, {c.input_len}+{c.output_len} tokens "
                  f"per request; speculation K={c.draft_len}", f"assumption: {c.assumption}",
              "$ per 1M output tokens = gpus x $/GPU-h / 3600 / estimated tok/s x 1e6",
              f"GPU price: {c.gpu_price_source}"]
    lines += [f"skipped: {s}" for s in c.skipped]
    if c.modes:
        lines += ["", format_modes(c)]
    return "\n".join(lines)


def format_modes(c: Comparison) -> str:
    """The speculation modes side by side: $ per 1M at low and high load, acceptance and break-even."""
    first = (c.modes or [])[0]
    head = ("mode", "runtime", "drafter", "K", "acceptance", "tokens/step", "break-even acc @1",
            "pays up to batch", "gate", "$/1M @1", "tok/s @1", "high batch", "$/1M high", "tok/s high")
    out = [head]
    for m in c.modes or []:
        out.append((m.mode or "none", m.runtime, m.drafter, str(m.draft_len) if m.mode else "-",
                    "-" if m.acceptance is None else f"{m.acceptance:.0%}",
                    "-" if m.tokens_per_target_step is None else f"{m.tokens_per_target_step:.2f}",
                    "-" if m.break_even_acceptance is None else f"{m.break_even_acceptance:.0%}",
                    "-" if m.break_even_batch is None else str(m.break_even_batch),
                    "-" if m.gate is None else str(m.gate), _cost(m.low_cost_per_1m_usd), f"{m.low_tokens_per_s:,.0f}",
                    str(m.high_batch), _cost(m.high_cost_per_1m_usd), f"{m.high_tokens_per_s:,.0f}"))
    lines = [f"speculation modes side by side at {first.precision} tp={first.tp}: low load = batch 1, high load = the batch ceiling (speculation "
             "off above its gate, max_batch_for_speculation); break-even: the acceptance per drafted token below "
             "which the mode is slower than none at batch 1; pays up to batch: the largest batch it beats none at "
             "at its acceptance", format_table(out, header=True)]
    lines += [f"eagle3's estimated head: no registered EAGLE-3 head for {c.model}; the published recipe at its "
              f"width (1 layer, draft vocab {EAGLE3_RECIPE_DRAFT_VOCAB}, 16-bit, K={m.draft_len})"
              for m in c.modes or [] if m.estimate]
    lines += [f"modes skipped: {s}" for s in c.modes_skipped or []]
    return "\n".join(lines)


def _cost(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _mode_cell(r: CompareRow) -> str:
    if r.mode is None:
        return "-"
    if r.mode == EAGLE3:
        return f"eagle3 {r.draft}" if r.draft else "eagle3 (estimate)"
    return f"draft {r.draft}" if r.draft else r.mode
