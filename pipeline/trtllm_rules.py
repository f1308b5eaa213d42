"""What TensorRT-LLM 1.2.1 derives from a precision recipe (FACTS §3).

Shared by the validator (fail before any GPU time) and the compile planner (exact trtllm-build flags), so the
two can never disagree.
"""

from __future__ import annotations

# precision -> quant_algo written by ModelOpt's TensorRT-LLM export (checkpoint config.json).
QUANT_ALGO: dict[str, str | None] = {
    "bf16": None,
    "fp16": None,
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
}

# kv cache dtype -> kv_cache_quant_algo (None: KV stored in the compute dtype).
KV_QUANT_ALGO: dict[str, str | None] = {"fp8": "FP8", "int8": "INT8", "bf16": None, "fp16": None}

# quant_algos whose engines may use FP8 context FMHA (and so keep paged context FMHA with an FP8 KV cache).
FP8_FMHA_QUANT_ALGOS = frozenset({"FP8", "W4A8_AWQ", "NVFP4"})


def needs_fp8_hardware(precision: str, kv_cache: str) -> bool:
    """FP8 weights/activations or an FP8 KV cache need SM >= 89."""
    return precision in ("fp8", "w4a8_awq") or kv_cache == "fp8"


def fp8_context_fmha(precision: str, kv_cache: str, *, context_fmha: bool = True) -> bool:
    """Whether `--use_fp8_context_fmha enable` is allowed (and chosen): FP8-family quant with an FP8 KV cache."""
    return context_fmha and QUANT_ALGO[precision] in FP8_FMHA_QUANT_ALGOS and kv_cache == "fp8"


def paged_context_fmha_blocker(precision: str, kv_cache: str, *, context_fmha: bool = True) -> str | None:
    """Why paged context FMHA (KV reuse, chunked context, draft-target) is impossible, or None when it is allowed."""
    if not context_fmha:
        return "context_fmha is disabled"
    if kv_cache == "int8":
        return "an INT8 KV cache disables paged context FMHA"
    if kv_cache == "fp8" and QUANT_ALGO[precision] not in FP8_FMHA_QUANT_ALGOS:
        return f"precision {precision} with an FP8 KV cache disables FP8 and so paged context FMHA"
    return None


# --- Added for the compile stage (pipeline/compile): values trtllm-build 1.2.1 is given explicitly. -------------
# Read from NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py, tensorrt_llm/builder.py (build(), BuildConfig) and
# tensorrt_llm/plugin/plugin.py (PluginConfig); see pipeline/compile/flags.py for commits.

TRTLLM_VERSION = "1.2.1"  # the pinned release: the last one with trtllm-build (FACTS §1)

# compute dtype of the spec -> TensorRT-LLM dtype string written in the checkpoint config.json ("dtype").
TRTLLM_DTYPE: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16"}

# precision -> --gemm_plugin. The GEMM plugin covers non-quantized GEMMs only (except FP8, which has its own FP8
# GEMM plugin); INT4/W4A8-AWQ and INT8-SQ GEMMs get their quantized plugins automatically from the checkpoint's
# quant_algo, so those recipes pass the compute dtype for the remaining 16-bit GEMMs (lm_head). FP8: NVIDIA's
# performance guide recommends the GEMM plugin disabled, and `--gemm_plugin fp8` only for small batches (<= 4),
# which is also what TensorRT-LLM's own benchmark build helper does.
FP8_GEMM_PLUGIN_MAX_BATCH = 4
GEMM_PLUGIN: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "disable",
    "int4_awq": "bfloat16",
    "w4a8_awq": "bfloat16",
    "int8_sq": "bfloat16",
}


def gemm_plugin(precision: str, compute_dtype: str = "bf16", *, max_batch_size: int | None = None) -> str:
    """`--gemm_plugin` value for a precision (16-bit recipes follow the compute dtype; FP8 at batch <= 4: fp8)."""
    if precision == "fp8" and max_batch_size is not None and max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH:
        return "fp8"
    value = GEMM_PLUGIN[precision]
    return TRTLLM_DTYPE[compute_dtype] if value in TRTLLM_DTYPE.values() else value


def paged_context_fmha(precision: str, kv_cache: str, *, context_fmha: bool = True) -> bool:
    """Whether `--use_paged_context_fmha enable` survives build(): allowed unless a blocker applies."""
    return paged_context_fmha_blocker(precision, kv_cache, context_fmha=context_fmha) is None
