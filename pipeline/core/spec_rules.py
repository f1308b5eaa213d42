"""Coherence rules of a build spec (TensorRT-LLM 1.2.1 rules and the support matrix), applied by the model validator
of `pipeline.core.spec.BuildSpec` to every spec validated. Pure, instant.

Each rule raises `SpecError` with one line: the field, the value, and what to do instead. Soft problems are
returned as warnings. Where a rule mirrors TensorRT-LLM 1.2.1 (NVIDIA/TensorRT-LLM), the function says which
upstream code it comes from; rules of ours (no upstream failure) say so.
"""

from __future__ import annotations

from typing import Any, Protocol

from pipeline.core.architectures import SOURCES, support_blocker
from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPUS, SUPPORTED_SM
from pipeline.core.hub_entry import PREFIX as HUB_PREFIX
from pipeline.core.model_entry import ModelEntry
from pipeline.core.runtimes import runtime_of
from pipeline.core.trtllm_rules import (
    MAX_NUM_TOKENS_WARN,
    PYTORCH_KV,
    PYTORCH_QUANT_ALGOS,
    QUANT_ALGO,
    needs_fp8_hardware,
    paged_context_fmha_blocker,
)

DRAFT_TARGET, EAGLE3 = "draft-target", "eagle3"  # the spec's modes (pipeline.core.spec imports these rules)



class BuildSpec(Protocol):
    """What the rules read of a spec: `pipeline.core.spec.BuildSpec` (whose module calls them) matches it."""

    @property
    def model(self) -> ModelEntry: ...
    @property
    def draft_model(self) -> ModelEntry | None: ...
    @property
    def quantized_draft(self) -> ModelEntry | None: ...
    @property
    def runtime(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def limit_reasons(self) -> dict[str, str]: ...
    @property
    def quantization(self) -> Any: ...
    @property
    def parallelism(self) -> Any: ...
    @property
    def limits(self) -> Any: ...
    @property
    def speculation(self) -> Any: ...
    @property
    def serving(self) -> Any: ...
    @property
    def hardware(self) -> Any: ...
    @property
    def serving_target(self) -> Any: ...

    @property
    def draft_len(self) -> int: ...
    @property
    def speculation_mode(self) -> str | None: ...
    @property
    def draft_precision(self) -> str: ...
    @property
    def draft_tp(self) -> int: ...
    @property
    def draft_max_batch_size(self) -> int: ...
    @property
    def draft_gpu_device_ids(self) -> list[int]: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_input_len(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def max_num_tokens(self) -> int: ...
    def compute_dtype_of(self, role: str) -> str: ...

AWQ_PRECISIONS = ("int4_awq", "w4a8_awq")
# Draft length: upstream sets no upper bound for draft_tokens_external (builder.py build() bounds only EAGLE) and
# its examples/draft_target_model README uses "from 4 to 10 in common usage"; the seeds measured 4-6 as the sweet
# spot. Above this we warn, never refuse.
DRAFT_LEN_WARN = 8


def _check_hardware(spec: BuildSpec, warnings: list[str]) -> None:
    gpu = GPUS[spec.hardware.gpu]
    q = spec.quantization
    for role, precision in (("target", q.precision), ("draft", spec.draft_precision if spec.quantized_draft else None)):
        if precision and needs_fp8_hardware(precision, q.kv) and not gpu.has_fp8:
            raise SpecError(
                f"hardware.gpu={gpu.name}: SM {gpu.sm / 10:.1f} has no FP8, but the {role} uses precision={precision} "
                f"kv_cache={q.kv}; use an H100/H200 (--gpu h100-sxm) or --precision int4_awq/bf16 --kv-cache bf16"
            )
    if gpu.sm != SUPPORTED_SM and runtime_of(spec).compiles:
        warnings.append(
            f"hardware.gpu={gpu.name} is SM {gpu.sm / 10:.1f}; this pipeline is tuned and tested for SM 9.0 "
            "(H100/H200) and engines only run on the architecture they were built on"
        )


def _check_kv(spec: BuildSpec) -> None:
    """An unquantized (16-bit) KV cache is stored in the compute dtype of each model that uses it (the target's and
    the draft's: fp16 for fp16 and w4a8_awq, else bf16, `trtllm_rules.COMPUTE_DTYPE`)."""
    q = spec.quantization
    if q.kv not in ("bf16", "fp16"):
        return
    target = spec.compute_dtype_of("target")
    draft = spec.compute_dtype_of("draft") if spec.quantized_draft else target
    if draft != target:
        raise SpecError(
            f"quantization.kv_cache={q.kv}: an unquantized KV cache uses each model's compute dtype, here {target} "
            f"for the target (precision={q.precision}) and {draft} for the draft (precision={spec.draft_precision}); "
            "use --kv-cache fp8 or int8, or a draft precision with the target's compute dtype"
        )
    if q.kv != target:
        raise SpecError(
            f"quantization.kv_cache={q.kv}: an unquantized KV cache uses the compute dtype {target}; "
            f"use --kv-cache {target}, fp8 or int8"
        )


def _paged_needs(spec: BuildSpec) -> list[str]:
    s = spec.serving
    needs = []
    if s.enable_kv_cache_reuse:
        needs.append("KV reuse (--no-kv-reuse to drop it)")
    if s.enable_chunked_context:
        needs.append("chunked context (--no-chunked-context to drop it)")
    if spec.quantized_draft:
        needs.append("draft-target speculation")
    return needs


def _check_paged_context(spec: BuildSpec) -> None:
    q = spec.quantization
    needs = _paged_needs(spec)
    if not needs:
        return
    precisions = [("target", q.precision)]
    if spec.quantized_draft:
        precisions.append(("draft", spec.draft_precision))
    for role, precision in precisions:
        why = paged_context_fmha_blocker(precision, q.kv, context_fmha=spec.limits.context_fmha,
                                         pytorch_backend=runtime_of(spec).llmapi)
        if why:
            raise SpecError(
                f"quantization: {role} {why} (TensorRT-LLM 1.2.1, runtime {spec.runtime}), "
                f"but {', '.join(needs)} need(s) it; "
                f"use --kv-cache {q.compute_dtype} or an FP8 precision, or drop those features"
            )


def _check_parallel(spec: BuildSpec, model: ModelEntry, role: str, precision: str, *, tp: int, pp: int) -> None:
    """TP must split heads (and divide or cover KV heads), PP at most the layers, AWQ blocks whole per rank
    (TensorRT-LLM's checkpoint mapping / ModelOpt export)."""
    a = model.architecture
    flag, field = {"draft": ("--draft-tp", "speculation.draft_tp"),
                   "prefill": ("prefill_tp", "serving_target.disagg.prefill_tp")}.get(role, ("--tp", "parallelism.tp"))
    if a.num_heads % tp:
        raise SpecError(
            f"{field}={tp}: {role} {model.name} has {a.num_heads} attention heads, not divisible by tp; "
            f"use a {flag} that divides {a.num_heads}"
        )
    if a.num_kv_heads % tp and tp % a.num_kv_heads:
        raise SpecError(
            f"{field}={tp}: {role} {model.name} has {a.num_kv_heads} KV heads; tp must divide them "
            f"or be a multiple of them (fix {flag})"
        )
    if pp > a.num_layers:
        raise SpecError(f"parallelism.pp={pp}: {role} {model.name} has only {a.num_layers} layers")
    if precision in AWQ_PRECISIONS:
        block = spec.quantization.awq_block_size
        for dim_name, dim in (("hidden_size", a.hidden_size), ("intermediate_size", a.intermediate_size)):
            if dim % tp or (dim // tp) % block:
                raise SpecError(
                    f"{field}={tp}: {role} {precision} needs {dim_name}/tp divisible by the AWQ block "
                    f"size {block}, but {model.name} has {dim_name}={dim}; use a smaller {flag} or "
                    "--precision fp8"
                )


def _check_limits(spec: BuildSpec, warnings: list[str]) -> None:
    lim, a = spec.limits, spec.model.architecture
    positions = a.max_position_embeddings
    # Ours: builder.py _init_max_seq_len() only warns past max_position_embeddings ("accuracy might be affected");
    # positions the model never saw make garbage, so we refuse.
    if spec.max_seq_len + spec.draft_len > positions:
        extra = f" + draft_len {spec.draft_len}" if spec.draft_len else ""
        raise SpecError(
            f"limits.max_seq_len={spec.max_seq_len}{extra} exceeds {spec.model.name}'s "
            f"max_position_embeddings={positions}; use --max-seq-len <= {positions - spec.draft_len}"
        )
    # builder.py _init_max_seq_len() clips max_input_len to max_seq_len (equal is fine); we refuse what it would
    # silently change.
    if spec.max_input_len > spec.max_seq_len:
        raise SpecError(
            f"limits.max_input_len={spec.max_input_len} exceeds max_seq_len={spec.max_seq_len} (trtllm-build would "
            "clip it); lower --max-input-len or raise --max-seq-len"
        )
    if lim.multiple_profiles and lim.opt_num_tokens:
        raise SpecError(
            f"limits.opt_num_tokens={lim.opt_num_tokens} cannot be combined with multiple_profiles; "
            "drop limits.opt_num_tokens from the spec file or pass --no-multiple-profiles"
        )
    # cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp (constructor): without chunked context the
    # runtime's max input length is min(max_seq_len - 1, max_num_tokens), so longer prompts are rejected.
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
    if spec.max_num_tokens > MAX_NUM_TOKENS_WARN:  # tensorrt_llm/_common.py check_max_num_tokens() warns too
        warnings.append(
            f"limits.max_num_tokens={spec.max_num_tokens} > {MAX_NUM_TOKENS_WARN}: TensorRT-LLM expects no gain "
            "from it and large values can exceed TensorRT's tensor volume"
        )


def _tokens(entry: ModelEntry) -> int:
    """The tokenizer's size: `tokenizer_size` where the embedding is padded past it, else vocab_size."""
    return entry.tokenizer_size or entry.architecture.vocab_size


def _check_family(spec: BuildSpec) -> None:
    """Each model's family runs its precision on this runtime in TensorRT-LLM 1.2.1 (`pipeline/core/architectures.py`
    cites the support matrix read for each cell)."""
    roles = [("target", spec.model, spec.quantization.precision)]
    if spec.quantized_draft:
        roles.append(("draft", spec.quantized_draft, spec.draft_precision))
    backend = runtime_of(spec)
    for role, model, precision in roles:
        why = support_blocker(model.architecture.family, pytorch_backend=backend.llmapi, precision=precision)
        if why:
            other = "engine" if backend.llmapi else "pytorch"
            raise SpecError(f"quantization: {role} {model.name}: {why}; choose one of those, or --runtime {other}")


def _check_sliding_window(spec: BuildSpec, warnings: list[str]) -> None:
    """Mistral's sliding window (where the config has one, e.g. v0.1's 4096): TensorRT-LLM 1.2.1's LLaMAConfig
    (models/llama/config.py) has no sliding-window field, so past the window the engine attends further back than
    the model was trained to, unless the runtime caps the attention window."""
    window = spec.model.architecture.sliding_window
    if window and spec.max_seq_len > window:
        warnings.append(
            f"limits.max_seq_len={spec.max_seq_len} exceeds {spec.model.name}'s sliding window {window}: the 1.2.1 "
            f"checkpoint config carries no window, so cap it at serving (kv_cache_config.max_attention_window "
            f"[{window}] / max_attention_window_size {window}) or keep --max-seq-len <= {window}"
        )


def _check_moe(spec: BuildSpec) -> None:
    """Expert parallelism as TensorRT-LLM 1.2.1 maps it (tensorrt_llm/mapping.py: moe_tp_size x moe_ep_size ==
    tp_size; layers/moe.py MixtureOfExperts: experts divisible by moe_ep_size, the expert FFN by moe_tp_size).
    Engines take EP 1: ModelOpt 0.37 exports experts TP-sharded (tensorrt_llm_utils.py writes moe_ep_size 1)."""
    p, a = spec.parallelism, spec.model.architecture
    if not a.is_moe:
        if p.moe_ep is not None:
            raise SpecError(f"parallelism.moe_ep={p.moe_ep}: {spec.model.name} is not a mixture-of-experts model; "
                            "drop --moe-ep")
        return
    ep = p.moe_ep_size
    if p.tp % ep:
        raise SpecError(f"parallelism.moe_ep={ep}: moe_tp x moe_ep must equal tp={p.tp} "
                        f"(tensorrt_llm/mapping.py); use a --moe-ep that divides {p.tp}")
    if a.num_experts % ep:
        raise SpecError(f"parallelism.moe_ep={ep}: {spec.model.name}'s {a.num_experts} experts are not a multiple "
                        "of the EP size (tensorrt_llm/layers/moe.py); use a --moe-ep that divides them")
    if a.intermediate_size % p.moe_tp_size:
        raise SpecError(f"parallelism: moe_tp={p.moe_tp_size} does not divide {spec.model.name}'s expert FFN size "
                        f"{a.intermediate_size} (tensorrt_llm/layers/moe.py); change --tp or --moe-ep")
    if not runtime_of(spec).llmapi and ep != 1:
        raise SpecError(f"parallelism.moe_ep={ep}: engine checkpoints are exported with experts TP-sharded "
                        f"(moe_ep_size 1; source: {SOURCES['modelopt_trtllm']}); drop --moe-ep or use "
                        "--runtime pytorch (moe_expert_parallel_size)")


def _check_same_tokenizer(target: ModelEntry, draft: ModelEntry) -> None:
    """Draft and target share one tokenizer by declared `tokenizer_family` and size. Where one is an `hf:` model (no
    family declared) the Hub decides, after the rules (`hub_entry.check_hub_tokenizers`, called by `resolve_spec`)."""
    if HUB_PREFIX in (target.tokenizer_family[:3], draft.tokenizer_family[:3]):
        return
    if draft.tokenizer_family == target.tokenizer_family and _tokens(draft) == _tokens(target):
        return
    raise SpecError(f"speculation.draft={draft.name}: its tokenizer ({draft.tokenizer_family}, vocab {_tokens(draft)}) "
                    f"differs from {target.name}'s ({target.tokenizer_family}, vocab {_tokens(target)}); draft and "
                    "target must share one tokenizer")


def _check_draft(spec: BuildSpec, warnings: list[str]) -> None:
    draft, target = spec.draft_model, spec.model
    sp = spec.speculation
    if spec.speculation_mode == EAGLE3:
        return  # `_check_eagle3`
    if draft is None:
        names = ("draft_tp", "draft_max_batch_size", "draft_gpu_device_ids")
        for name in names if spec.speculation_mode == "ngram" else ("draft_len", *names):
            if name in sp.model_fields_set and getattr(sp, name) not in (None, type(sp).model_fields[name].default):
                raise SpecError(f"speculation.{name} is set but no draft model; pass --draft NAME (or --draft auto)")
        return
    k = spec.draft_len
    if k < 1:
        raise SpecError(f"speculation.draft_len={k}: must be >= 1 (K=4-6 is typical); raise --draft-len")
    if k > DRAFT_LEN_WARN:
        warnings.append(
            f"speculation.draft_len={k}: above {DRAFT_LEN_WARN} acceptance falls off and each step costs more draft "
            "passes (sweet spot 4-6; upstream's examples use 4-10); measure with `invoke bench`"
        )
    if draft.name == target.name:
        raise SpecError(f"speculation.draft={draft.name} is the target itself; choose a smaller model of its family")
    _check_same_tokenizer(target, draft)
    if spec.limits.max_beam_width != 1:
        raise SpecError(f"limits.max_beam_width={spec.limits.max_beam_width}: draft-target speculation needs 1")
    if draft.architecture.total_params >= target.architecture.total_params:
        warnings.append(f"speculation.draft={draft.name} is not smaller than {target.name}; it cannot pay off")
    if spec.max_batch_size > sp.max_batch_for_speculation and "max_batch_size" not in spec.limit_reasons:
        warnings.append(
            f"speculation with max_batch_size={spec.max_batch_size}: draft-target pays at batch 1-8 and costs "
            "throughput at high load (seeds: slower at 64); route heavy traffic through the plain ensemble"
        )
    if spec.draft_max_batch_size > spec.max_batch_size:
        warnings.append(
            f"speculation.draft_max_batch_size={spec.draft_max_batch_size} exceeds max_batch_size="
            f"{spec.max_batch_size}: the draft never serves more requests than the target"
        )
    s = spec.serving
    total = s.target_fraction(True) + s.draft_kv_cache_free_gpu_mem_fraction
    if total > 0.95:
        raise SpecError(
            f"serving: target ({s.target_fraction(True)}) + draft ({s.draft_kv_cache_free_gpu_mem_fraction}) "
            f"KV memory fractions sum to {total:.2f} > 0.95; lower --mem-fraction (or "
            "serving.draft_kv_cache_free_gpu_mem_fraction in the spec file)"
        )


def _check_speculation_mode(spec: BuildSpec, warnings: list[str]) -> None:
    """The speculation mode against the rest of the spec. N-gram (prompt lookup) is TensorRT-LLM's PyTorch backend
    only: 1.2.0 llmapi/llm_args.py `NGramDecodingConfig.supports_backend` is `backend == "pytorch"`, and
    `TorchLlmArgs.validate_speculative_config` asserts `max_draft_len > 0 and max_matching_ngram_size > 0`. Its
    rejected drafts are rewound out of the KV cache, which the C++ KV cache manager refuses under beam search
    (kvCacheManager.cpp: "Remove token is not supported with beam search")."""
    sp, mode = spec.speculation, spec.speculation_mode
    if spec.model.is_eagle3_head:
        raise SpecError(f"model={spec.model.name} is an EAGLE-3 head, not a model to serve; pass --model "
                        f"{spec.model.eagle3.target_model if spec.model.eagle3 else 'TARGET'} --draft {spec.model.name}")
    if sp.speculative_decoding == "draft-target" and spec.draft_model is None:
        raise SpecError("speculation.speculative_decoding=draft-target needs a draft model; pass --draft NAME "
                        "(or --draft auto)")
    if mode == DRAFT_TARGET and spec.draft_model is not None and spec.draft_model.is_eagle3_head:
        raise SpecError(f"speculation.draft={spec.draft_model.name} is an EAGLE-3 head, which drafts from the "
                        "target's hidden states, not as a draft model; pass --speculative-decoding eagle3")
    if mode == EAGLE3:
        _check_eagle3(spec, warnings)
    if mode != "ngram":
        if sp.max_matching_ngram_size is not None:
            raise SpecError(f"speculation.max_matching_ngram_size={sp.max_matching_ngram_size} is an ngram setting; "
                            "pass --speculative-decoding ngram or drop it")
        return
    if spec.draft_model is not None:
        raise SpecError(f"speculation.draft={spec.draft_model.name} with speculative_decoding=ngram: n-gram drafts "
                        "come from the request's own tokens, no model; drop --draft or use draft-target")
    _check_pytorch_mode(spec, "ngram", "n-gram speculation", "1.2.1 llm_args.py NGramDecodingConfig.supports_backend: backend == "
                        "'pytorch'", "--draft NAME for draft-target engines")
    k = spec.draft_len
    if k < 1:
        raise SpecError(f"speculation.draft_len={k}: must be >= 1 (upstream's n-gram examples use 3-5)")
    if k > DRAFT_LEN_WARN:
        warnings.append(f"speculation.draft_len={k}: n-gram drafts past {DRAFT_LEN_WARN} tokens are rarely accepted "
                        "outside highly repetitive text; measure with `invoke bench`")
    if spec.max_batch_size > sp.max_batch_for_speculation and "max_batch_size" not in spec.limit_reasons:
        warnings.append(
            f"speculation with max_batch_size={spec.max_batch_size}: n-gram pays at low concurrency (upstream's "
            f"AUTO mode turns it off at batch 32); it runs up to batch {sp.max_batch_for_speculation} "
            "(max_concurrency), plain decoding above"
        )


def _check_pytorch_mode(spec: BuildSpec, mode: str, label: str, source: str, engine_fix: str) -> None:
    """`mode` (`label` in words) runs on TensorRT-LLM's PyTorch backend only (`source` says why); its rejected
    drafts are rewound out of the KV cache, which the C++ KV cache manager refuses under beam search
    (kvCacheManager.cpp: "Remove token is not supported with beam search")."""
    if not runtime_of(spec).llmapi:
        raise SpecError(f"speculation.speculative_decoding={mode} runs on TensorRT-LLM's PyTorch backend only "
                        f"({source}); pass --runtime pytorch, or {engine_fix}")
    if spec.limits.max_beam_width != 1:
        raise SpecError(f"limits.max_beam_width={spec.limits.max_beam_width}: {label} rewinds rejected drafts out "
                        "of the KV cache, which beam search does not allow; use 1")


def _check_eagle3(spec: BuildSpec, warnings: list[str]) -> None:
    """EAGLE-3 in TensorRT-LLM 1.2.1: PyTorch backend only (the engine path's EAGLE is EAGLE-1/2: examples/eagle/
    README.md builds `--speculative_decoding_mode eagle` from EAGLE-1 heads, and `TrtLlmArgs` maps
    EagleDecodingConfig to that `_EagleConfig`); no pipeline parallelism (docs feature-combination-matrix.md:
    EAGLE-3 x Pipeline Parallelism "No"); a head trained for this target (its hidden states, its tokenizer; d2t maps
    into this vocabulary); the default capture `(1, L/2 - 1, L - 4)` needs more than 5 target layers
    (`Eagle3SpecMetadata.__post_init__`); the head keeps its own dtype (one-model `SpecDecOneEngineForCausalLM`
    takes the draft's weight quantization from the head's own checkpoint); rejected drafts are rewound out of the KV
    cache, which beam search does not allow (kvCacheManager.cpp)."""
    head, target, sp = spec.draft_model, spec.model, spec.speculation
    heads_hint = f"an EAGLE-3 head trained for {target.name} (--draft auto picks the registry's)"
    if head is None or head.eagle3 is None:
        given = "no --draft" if head is None else f"speculation.draft={head.name} is a model, not an EAGLE-3 head"
        raise SpecError(f"speculation.speculative_decoding=eagle3 with {given}; pass --draft with {heads_hint}")
    if head.eagle3.target_model != target.name:
        raise SpecError(f"speculation.draft={head.name} is the EAGLE-3 head of {head.eagle3.target_model}, trained on its "
                        f"hidden states; it cannot draft for {target.name}: use --model {head.eagle3.target_model}, or "
                        f"{heads_hint}")
    if _tokens(head) != _tokens(target) or head.tokenizer_family != target.tokenizer_family:
        raise SpecError(f"speculation.draft={head.name}: its vocabulary ({head.tokenizer_family}, "
                        f"{_tokens(head)}) is not {target.name}'s ({target.tokenizer_family}, {_tokens(target)}); "
                        "fix the head's registry entry")
    _check_pytorch_mode(spec, "eagle3", "EAGLE-3", "1.2.1's engine path builds EAGLE-1/2: examples/eagle/README.md, "
                        "trtllm-build --speculative_decoding_mode eagle", "--speculative-decoding draft-target for "
                        "engines")
    if spec.parallelism.pp != 1:
        raise SpecError(f"parallelism.pp={spec.parallelism.pp} with eagle3: TensorRT-LLM 1.2.1 runs EAGLE-3 without "
                        "pipeline parallelism (docs/source/features/feature-combination-matrix.md); use --tp")
    if sp.draft_precision is not None:
        raise SpecError(f"speculation.draft_precision={sp.draft_precision}: an EAGLE-3 head is served in its own "
                        "dtype (TensorRT-LLM 1.2.1 loads its weight quantization from the head's checkpoint, the "
                        "KV-cache dtype from the target's); drop --draft-precision")
    layers, capture = target.architecture.num_layers, head.eagle3.capture_layers
    if capture is None and layers <= 5:
        raise SpecError(f"speculation.draft={head.name}: {target.name} has {layers} layers, too few for TensorRT-LLM's "
                        "default EAGLE-3 capture (1, L/2-1, L-4): 'Not enough hidden layers for default EAGLE3 "
                        "capture'; the head's registry entry must name its eagle3.capture_layers")
    if capture is not None and max(capture) >= layers:
        raise SpecError(f"speculation.draft={head.name}: eagle3.capture_layers {capture} name a layer past "
                        f"{target.name}'s {layers}; fix the head's registry entry")
    k = spec.draft_len
    if k < 1:
        raise SpecError(f"speculation.draft_len={k}: must be >= 1 (upstream's EAGLE-3 examples use 3-4)")
    if k > DRAFT_LEN_WARN:
        warnings.append(f"speculation.draft_len={k}: an EAGLE-3 chain past {DRAFT_LEN_WARN} tokens adds little "
                        "(published chain acceptance flattens after 4-5); measure with `invoke bench`")
    trained = head.architecture.max_position_embeddings
    if spec.max_seq_len > trained:
        warnings.append(f"limits.max_seq_len={spec.max_seq_len} exceeds the {trained} positions {head.name} was "
                        "trained on: it still runs, but acceptance falls on longer contexts; measure with `invoke bench`")
    if spec.max_batch_size > sp.max_batch_for_speculation and "max_batch_size" not in spec.limit_reasons:
        warnings.append(f"speculation with max_batch_size={spec.max_batch_size}: EAGLE-3 pays at low concurrency; "
                        f"it runs up to batch {sp.max_batch_for_speculation} (max_concurrency), plain decoding above")


def _check_draft_placement(spec: BuildSpec) -> None:
    """The draft's GPUs: one per draft TP rank (upstream examples/draft_target_model README:
    `draft_model_device_list` "must be the same as the TP size of the draft model engine"), on this host."""
    ids, tp, count = spec.draft_gpu_device_ids, spec.draft_tp, spec.hardware.gpu_count
    if tp > count:
        raise SpecError(
            f"speculation.draft_tp={tp} exceeds hardware.gpu_count={count}; lower --draft-tp (1 is usual)"
        )
    if len(ids) != tp:
        raise SpecError(
            f"speculation.draft_gpu_device_ids={ids}: the draft engine has draft_tp={tp} rank(s), so it needs "
            f"exactly {tp} GPU id(s); list one GPU per rank or change --draft-tp"
        )
    if len(set(ids)) != len(ids) or any(i < 0 or i >= count for i in ids):
        raise SpecError(
            f"speculation.draft_gpu_device_ids={ids}: ids must be distinct GPUs within 0..{count - 1} "
            "(hardware.gpu_count); fix the list or raise --gpu-count"
        )


def _check_speculation_kv_reuse(spec: BuildSpec) -> None:
    """Runtime engine: a draft-target target engine aborts at load without KV-cache block reuse.

    Upstream: triton_backend/inflight_batcher_llm/src/model_instance_state.cc getKvCacheConfigFromParams() passes
    `enable_kv_cache_reuse` into the executor's KvCacheConfig; cpp/tensorrt_llm/batch_manager/
    trtGptModelInflightBatching.cpp (TrtGptModelInflightBatching constructor) then checks it for an engine built
    with speculative_decoding_mode draft_tokens_external: "KV cache block reuse must be enabled for speculative
    decoding target model".
    """
    if not runtime_of(spec).llmapi and spec.draft_model is not None and not spec.serving.enable_kv_cache_reuse:
        raise SpecError(
            f"serving.enable_kv_cache_reuse=false with draft {spec.draft_model.name}: the draft-target target aborts "
            "at load in TensorRT-LLM 1.2.1 ('KV cache block reuse must be enabled for speculative decoding target "
            "model'); drop --no-kv-reuse or --draft"
        )


# Draft-engine settings with no meaning on the PyTorch backend (its draft shares the target's executor and mapping).
_ENGINE_ONLY_DRAFT_FIELDS = ("draft_tp", "draft_max_batch_size", "draft_gpu_device_ids")


def _check_pytorch_runtime(spec: BuildSpec) -> None:
    """Runtime pytorch (TensorRT-LLM 1.2.1 PyTorch backend): the precisions its Linear layers load, its KV-cache
    dtypes, and no separate draft engine (`PYTORCH_*` in pipeline/core/trtllm_rules.py cite the upstream code)."""
    q = spec.quantization
    roles = [("target", q.precision)] + ([("draft", spec.draft_precision)] if spec.quantized_draft else [])
    for role, precision in roles:
        if QUANT_ALGO[precision] not in PYTORCH_QUANT_ALGOS:
            raise SpecError(
                f"quantization: {role} precision={precision} has no PyTorch-backend kernels in TensorRT-LLM 1.2.1 "
                "(no INT8 SmoothQuant linear there); use --precision fp8 or int4_awq, or --runtime engine"
            )
    if q.kv not in PYTORCH_KV:
        raise SpecError(
            f"quantization.kv_cache={q.kv}: the PyTorch backend's KV cache is fp8 or the compute dtype "
            f"(kv_cache_config.dtype fp8|auto); use --kv-cache fp8 or {q.compute_dtype}, or --runtime engine"
        )
    sp = spec.speculation
    for name in _ENGINE_ONLY_DRAFT_FIELDS:
        if spec.draft_model and name in sp.model_fields_set:
            raise SpecError(
                f"speculation.{name} is an engine-runtime setting: the PyTorch backend runs the draft inside the "
                "target's executor, on its GPUs and batch; drop it or use --runtime engine"
            )


def validate_spec(spec: BuildSpec) -> list[str]:
    """Apply every intrinsic rule (the spec alone, no planner, no files); return warnings, raise `SpecError` on the
    first violation. `pipeline.stages.check` adds the rules that need the planner or the input files."""
    warnings: list[str] = []
    _check_kv(spec)
    backend = runtime_of(spec)
    if backend.llmapi:
        _check_pytorch_runtime(spec)
    _check_family(spec)
    _check_moe(spec)
    _check_sliding_window(spec, warnings)
    _check_hardware(spec, warnings)
    _check_draft(spec, warnings)
    _check_speculation_mode(spec, warnings)
    _check_paged_context(spec)
    _check_speculation_kv_reuse(spec)
    p = spec.parallelism
    _check_parallel(spec, spec.model, "target", spec.quantization.precision, tp=p.tp, pp=p.pp)
    if spec.draft_model:
        # the PyTorch backend runs the draft inside the target's executor, on the target's TP mapping
        draft_tp = p.tp if backend.llmapi else spec.draft_tp
        _check_parallel(spec, spec.draft_model, "draft", spec.draft_precision if spec.quantized_draft else "bf16",
                        tp=draft_tp, pp=1)
    if spec.draft_model and not backend.llmapi:
        _check_draft_placement(spec)
    _check_limits(spec, warnings)
    _check_disagg_target(spec)
    return warnings


def _check_disagg_target(spec: BuildSpec) -> None:
    """A planned disaggregated unit (`serving_target.disagg`) runs on Dynamo's TensorRT-LLM workers: the PyTorch
    runtime, no speculation (the planner sized the workers without it), a prefill TP this model and hardware take."""
    target = spec.serving_target
    disagg = target.disagg if target is not None else None
    if disagg is None:
        return
    fix = "or drop serving_target.disagg (re-plan with `plan --slo --serving-mode agg`)"
    if not runtime_of(spec).llmapi:
        raise SpecError(f"serving_target.disagg: Dynamo's TensorRT-LLM workers run the PyTorch runtime; build with "
                        f"--runtime pytorch, {fix}")
    if spec.speculation_mode is not None:
        raise SpecError(f"serving_target.disagg: the unit was planned without speculation, and this spec drafts "
                        f"({spec.speculation_mode}); drop --draft/--speculative-decoding, {fix}")
    _check_parallel(spec, spec.model, "prefill", spec.quantization.precision, tp=disagg.prefill_tp, pp=1)
