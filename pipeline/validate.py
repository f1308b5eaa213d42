"""Coherence rules of a build spec (FACTS §3 plus the support matrix). Pure, instant, run before any download.

Each rule raises `SpecError` with one line: the field, the value, and what to do instead. Soft problems are
returned as warnings.
"""

from __future__ import annotations

from .errors import SpecError
from .gpus import GPUS, SUPPORTED_SM
from .registry import ModelEntry
from .spec import BuildSpec
from .trtllm_rules import needs_fp8_hardware, paged_context_fmha_blocker

AWQ_PRECISIONS = ("int4_awq", "w4a8_awq")
MAX_DRAFT_LEN = 8


def _check_hardware(spec: BuildSpec, warnings: list[str]) -> None:
    gpu = GPUS[spec.hardware.gpu]
    q = spec.quantization
    for role, precision in (("target", q.precision), ("draft", spec.draft_precision if spec.draft_model else None)):
        if precision and needs_fp8_hardware(precision, q.kv) and not gpu.has_fp8:
            raise SpecError(
                f"hardware.gpu={gpu.name}: SM {gpu.sm / 10:.1f} has no FP8, but the {role} uses precision={precision} "
                f"kv_cache={q.kv}; use an H100/H200 (--gpu h100-sxm) or --precision int4_awq/bf16 --kv-cache bf16"
            )
    if gpu.sm != SUPPORTED_SM and spec.target == "trtllm":
        warnings.append(
            f"hardware.gpu={gpu.name} is SM {gpu.sm / 10:.1f}; this pipeline is tuned and tested for SM 9.0 "
            "(H100/H200) and engines only run on the architecture they were built on"
        )


def _check_kv(spec: BuildSpec) -> None:
    q = spec.quantization
    if q.kv in ("bf16", "fp16") and q.kv != q.compute_dtype:
        raise SpecError(
            f"quantization.kv_cache={q.kv}: an unquantized KV cache uses the compute dtype {q.compute_dtype}; "
            f"use --kv-cache {q.compute_dtype}, fp8 or int8"
        )


def _paged_needs(spec: BuildSpec) -> list[str]:
    s = spec.serving
    needs = []
    if s.enable_kv_cache_reuse:
        needs.append("KV reuse (--no-kv-reuse to drop it)")
    if s.enable_chunked_context:
        needs.append("chunked context (--no-chunked-context to drop it)")
    if spec.draft_model:
        needs.append("draft-target speculation")
    return needs


def _check_paged_context(spec: BuildSpec) -> None:
    q = spec.quantization
    needs = _paged_needs(spec)
    if not needs:
        return
    precisions = [("target", q.precision)]
    if spec.draft_model:
        precisions.append(("draft", spec.draft_precision))
    for role, precision in precisions:
        why = paged_context_fmha_blocker(precision, q.kv, context_fmha=spec.limits.context_fmha)
        if why:
            raise SpecError(
                f"quantization: {role} {why} (TensorRT-LLM 1.2.1), but {', '.join(needs)} need(s) it; "
                f"use --kv-cache {q.compute_dtype} or an FP8 precision, or drop those features"
            )


def _check_parallel(spec: BuildSpec, model: ModelEntry, role: str, precision: str) -> None:
    a, p = model.architecture, spec.parallelism
    if a.num_heads % p.tp:
        raise SpecError(
            f"parallelism.tp={p.tp}: {role} {model.name} has {a.num_heads} attention heads, not divisible by tp; "
            f"use a tp that divides {a.num_heads}"
        )
    if a.num_kv_heads % p.tp and p.tp % a.num_kv_heads:
        raise SpecError(
            f"parallelism.tp={p.tp}: {role} {model.name} has {a.num_kv_heads} KV heads; tp must divide them "
            "or be a multiple of them"
        )
    if p.pp > a.num_layers:
        raise SpecError(f"parallelism.pp={p.pp}: {role} {model.name} has only {a.num_layers} layers")
    if precision in AWQ_PRECISIONS:
        block = spec.quantization.awq_block_size
        for dim_name, dim in (("hidden_size", a.hidden_size), ("intermediate_size", a.intermediate_size)):
            if dim % p.tp or (dim // p.tp) % block:
                raise SpecError(
                    f"parallelism.tp={p.tp}: {role} {precision} needs {dim_name}/tp divisible by the AWQ block "
                    f"size {block}, but {model.name} has {dim_name}={dim}; use a smaller tp or "
                    "--precision fp8"
                )


def _check_limits(spec: BuildSpec, warnings: list[str]) -> None:
    lim, a = spec.limits, spec.model.architecture
    positions = a.max_position_embeddings
    if spec.max_seq_len + spec.draft_len > positions:
        extra = f" + draft_len {spec.draft_len}" if spec.draft_len else ""
        raise SpecError(
            f"limits.max_seq_len={spec.max_seq_len}{extra} exceeds {spec.model.name}'s "
            f"max_position_embeddings={positions}; use --max-seq-len <= {positions - spec.draft_len}"
        )
    if spec.max_input_len >= spec.max_seq_len:
        raise SpecError(
            f"limits.max_input_len={spec.max_input_len} must be below max_seq_len={spec.max_seq_len} "
            "(leave room for output tokens); lower --max-input-len or raise --max-seq-len"
        )
    if lim.multiple_profiles and lim.opt_num_tokens:
        raise SpecError(
            f"limits.opt_num_tokens={lim.opt_num_tokens} cannot be combined with multiple_profiles; "
            "drop limits.opt_num_tokens from the spec file or pass --no-multiple-profiles"
        )
    if lim.max_num_tokens and lim.max_num_tokens < spec.max_input_len and not spec.serving.enable_chunked_context:
        raise SpecError(
            f"limits.max_num_tokens={lim.max_num_tokens} is below max_input_len={spec.max_input_len} without "
            "chunked context; raise --max-num-tokens or keep chunked context on"
        )
    if lim.max_num_tokens and lim.max_num_tokens < spec.max_num_tokens:
        warnings.append(
            f"limits.max_num_tokens={lim.max_num_tokens} raised to {spec.max_num_tokens} "
            f"(max_batch_size x (draft_len+1))"
        )


def _check_draft(spec: BuildSpec, warnings: list[str]) -> None:
    draft, target = spec.draft_model, spec.model
    if draft is None:
        if spec.speculation.draft_len is not None:
            raise SpecError("speculation.draft_len is set but no draft model; pass --draft NAME (or --draft auto)")
        return
    k = spec.draft_len
    if not 1 <= k <= MAX_DRAFT_LEN:
        raise SpecError(f"speculation.draft_len={k}: must be within 1..{MAX_DRAFT_LEN}; K=4-5 is typical")
    if draft.name == target.name:
        raise SpecError(f"speculation.draft={draft.name} is the target itself; choose a smaller model of its family")
    if draft.tokenizer_family != target.tokenizer_family or draft.architecture.vocab_size != target.architecture.vocab_size:
        raise SpecError(
            f"speculation.draft={draft.name}: its tokenizer ({draft.tokenizer_family}, vocab "
            f"{draft.architecture.vocab_size}) differs from {target.name}'s ({target.tokenizer_family}, vocab "
            f"{target.architecture.vocab_size}); draft and target must share one tokenizer"
        )
    if spec.limits.max_beam_width != 1:
        raise SpecError(f"limits.max_beam_width={spec.limits.max_beam_width}: draft-target speculation needs 1")
    if draft.architecture.total_params >= target.architecture.total_params:
        warnings.append(f"speculation.draft={draft.name} is not smaller than {target.name}; it cannot pay off")
    if spec.max_batch_size > spec.speculation.max_batch_for_speculation:
        warnings.append(
            f"speculation with max_batch_size={spec.max_batch_size}: draft-target pays at batch 1-8 and costs "
            "throughput at high load (seeds: slower at 64); route heavy traffic through the plain ensemble"
        )
    s = spec.serving
    total = s.target_fraction(True) + s.draft_kv_cache_free_gpu_mem_fraction
    if total > 0.95:
        raise SpecError(
            f"serving: target ({s.target_fraction(True)}) + draft ({s.draft_kv_cache_free_gpu_mem_fraction}) "
            f"KV memory fractions sum to {total:.2f} > 0.95; lower --mem-fraction (or "
            "serving.draft_kv_cache_free_gpu_mem_fraction in the spec file)"
        )


def validate_spec(spec: BuildSpec) -> list[str]:
    """Apply every rule; return warnings, raise `SpecError` on the first violation."""
    warnings: list[str] = []
    _check_kv(spec)
    _check_hardware(spec, warnings)
    _check_draft(spec, warnings)
    _check_paged_context(spec)
    _check_parallel(spec, spec.model, "target", spec.quantization.precision)
    if spec.draft_model:
        _check_parallel(spec, spec.draft_model, "draft", spec.draft_precision)
    p = spec.parallelism
    if p.world_size > spec.hardware.gpu_count:
        raise SpecError(
            f"parallelism: tp×pp={p.world_size} exceeds hardware.gpu_count={spec.hardware.gpu_count}; "
            "lower --tp/--pp or raise --gpu-count"
        )
    _check_limits(spec, warnings)
    return warnings
