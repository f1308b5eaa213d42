"""What TensorRT-LLM 1.2.1 derives from a precision recipe.

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


# --- The PyTorch backend (runtime pytorch) of the same release. -------------------------------------------------
# quant_algos its Linear layers load (`_torch/modules/linear.py` get_quant_method: FP8 QDQ, weight-only and
# INT4/W4A8 AWQ per group, NVFP4, ...; no INT8 SmoothQuant method, so W8A8_SQ_PER_CHANNEL is refused there).
PYTORCH_QUANT_ALGOS = frozenset({None, "FP8", "W4A16_AWQ", "W4A8_AWQ", "NVFP4", "FP8_BLOCK_SCALES"})
# KV-cache dtypes its KvCacheConfig.dtype takes (`_torch/pyexecutor/_util.py` _VALID_KV_CACHE_DTYPES: fp8, nvfp4,
# auto): an unquantized KV is "auto"; there is no INT8 KV cache.
PYTORCH_KV = frozenset({"fp8", "bf16", "fp16"})
# quant_algos with FP8 attention, which an FP8 KV cache needs for paged context FMHA (`_torch/attention_backend/
# trtllm.py` TrtllmAttention.forward: "When FP8 KV cache is being used, paged context FMHA cannot be used without
# FP8 attention", allowing FP8 QDQ, NVFP4 and FP8 block scales; W4A8_AWQ "excluded for now").
PYTORCH_FP8_FMHA_QUANT_ALGOS = frozenset({"FP8", "NVFP4", "FP8_BLOCK_SCALES"})


def paged_context_fmha_blocker(precision: str, kv_cache: str, *, context_fmha: bool = True,
                               pytorch_backend: bool = False) -> str | None:
    """Why paged context FMHA (KV reuse, chunked context, draft-target) is impossible, or None when it is allowed.

    Engine: the trtllm-build plugin rules (an INT8 KV cache, or an FP8 KV cache without FP8 context FMHA).
    PyTorch backend: an FP8 KV cache needs FP8 attention (FP8/NVFP4 weights; not W4A8_AWQ there).
    """
    if pytorch_backend:
        if kv_cache == "fp8" and QUANT_ALGO[precision] not in PYTORCH_FP8_FMHA_QUANT_ALGOS:
            return (f"precision {precision} with an FP8 KV cache has no FP8 attention on the PyTorch backend, "
                    "so no paged context FMHA")
        return None
    if not context_fmha:
        return "context_fmha is disabled"
    if kv_cache == "int8":
        return "an INT8 KV cache disables paged context FMHA"
    if kv_cache == "fp8" and QUANT_ALGO[precision] not in FP8_FMHA_QUANT_ALGOS:
        return f"precision {precision} with an FP8 KV cache disables FP8 and so paged context FMHA"
    return None


# --- Added for the compile stage (pipeline/stages/compile): values trtllm-build 1.2.1 is given explicitly. -------------
# Read from NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py, tensorrt_llm/builder.py (build(), BuildConfig) and
# tensorrt_llm/plugin/plugin.py (PluginConfig); see pipeline/stages/compile/flags.py for commits. build()'s reduce_fusion /
# user_buffer overrides were read at builder.py @ 008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc (the newest stored
# snapshot), plugin.py defaults and help texts @ c20322ffd3dc0740ca530c9fad989b22e64f6e06, the docs at
# docs/source/performance/fp8-quantization.md @ 8cc5c0b2 and perf-best-practices.md @ 06255cb7.

TRTLLM_VERSION = "1.2.1"  # the pinned release: the last one with trtllm-build

# compute dtype of the spec -> TensorRT-LLM dtype string written in the checkpoint config.json ("dtype").
TRTLLM_DTYPE: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16"}

# precision -> compute dtype (the 16-bit activations: calibration/export dtype, the checkpoint's `dtype`, the
# 16-bit GEMM and attention plugins, an unquantized KV cache). One compute dtype per precision, for both runtimes:
# - bf16 for every quantized precision but W4A8-AWQ, and for bf16 itself; fp16 for fp16.
# - W4A8-AWQ: fp16, as upstream builds it. Every W4A8-AWQ engine recipe of NVIDIA/TensorRT-LLM's model READMEs
#   (read with the code-search tools: EXAONE, HyperCLOVAX, Falcon-180B, Qwen1.5-72B "AWQ W4A8(FP8)") quantizes with
#   `examples/quantization/quantize.py --dtype float16 --qformat w4a8_awq`, then builds with
#   `--gemm_plugin float16`/`auto`; none uses bf16 activations. The PyTorch runtime's W4A8-AWQ uses fp16 too
#   (one compute dtype per precision: the Hugging Face export's `dtype` is float16; upstream's PyTorch-backend
#   W4A8 linear test, `test_w4a8_linear`, parametrizes `dtype` with torch.float16 only), so a W4A8-AWQ checkpoint
#   has the same activations on either runtime (a rule of ours: only proven combinations).
COMPUTE_DTYPE: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "bf16",
    "int4_awq": "bf16",
    "w4a8_awq": "fp16",
    "int8_sq": "bf16",
}


def compute_dtype(precision: str) -> str:
    """The compute (activation) dtype of a precision: "fp16" for fp16 and w4a8_awq, else "bf16" (`COMPUTE_DTYPE`)."""
    return COMPUTE_DTYPE[precision]


# precision -> --gemm_plugin. The GEMM plugin covers non-quantized GEMMs only (except FP8, which has its own FP8
# GEMM plugin); INT4/W4A8-AWQ and INT8-SQ GEMMs get their quantized plugins automatically from the checkpoint's
# quant_algo (builder.py build(): weight_only_groupwise_quant_matmul_plugin / smooth-quant plugins), so those
# recipes pass the compute dtype for the remaining 16-bit GEMMs (lm_head). FP8: disabled at every batch size —
# docs/source/performance/fp8-quantization.md ("we recommend disabling the gemm plugin for fp8 ... if you are
# passing --gemm_plugin=fp8 to trtllm-build we recommend removing that"); small batches get the low-latency FP8
# GEMM plugin instead (`fp8_gemm_plugins`). That supersedes perf-best-practices.md's older experimental
# "--gemm_plugin fp8 for BS<=4".
GEMM_PLUGIN: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "disable",
    "int4_awq": "bfloat16",
    "w4a8_awq": "float16",  # its compute dtype (COMPUTE_DTYPE): upstream's `--gemm_plugin float16`/`auto`
    "int8_sq": "bfloat16",
}


def gemm_plugin(precision: str, dtype: str | None = None) -> str:
    """`--gemm_plugin` value for a precision (16-bit recipes follow the compute dtype, by default the precision's
    own `compute_dtype`; FP8: disabled)."""
    value = GEMM_PLUGIN[precision]
    return TRTLLM_DTYPE[dtype or compute_dtype(precision)] if value in TRTLLM_DTYPE.values() else value


def paged_context_fmha(precision: str, kv_cache: str, *, context_fmha: bool = True) -> bool:
    """Whether `--use_paged_context_fmha enable` survives build(): allowed unless a blocker applies."""
    return paged_context_fmha_blocker(precision, kv_cache, context_fmha=context_fmha) is None


# --- Flags whose 1.2.1 default is not what H100 FP8 serving wants: each decided here, with its source. ------------
# PluginConfig defaults (tensorrt_llm/plugin/plugin.py): reduce_fusion False, user_buffer False, use_fused_mlp True,
# multiple_profiles False, gemm_swiglu_plugin / low_latency_gemm_plugin / low_latency_gemm_swiglu_plugin None.
#
# | flag                              | we pass                                   | source                          |
# |-----------------------------------|-------------------------------------------|---------------------------------|
# | --reduce_fusion                   | enable iff Llama and TP > 1               | builder.py build(): overridden   |
# |                                   |                                           | to False at tp_size == 1 or for  |
# |                                   |                                           | other architectures; fp8-quant.  |
# |                                   |                                           | md: 70B TP4 H100 +12.9 % tok/s,  |
# |                                   |                                           | TTFT 97 -> 82 ms (with UB)       |
# | --user_buffer                     | enable iff reduce_fusion and quant FP8,   | build(): off without             |
# |                                   | except for spawned ranks (draft-target    | reduce_fusion; plugin.py help:   |
# |                                   | runs in orchestrator mode)                | "only supported for the FP8      |
# |                                   |                                           | LLAMA model"; see user_buffer()  |
# | --use_fused_mlp                   | enable (the default, stated explicitly)   | perf-best-practices.md           |
# |                                   |                                           | "Horizontal fusion in Gated-MLP" |
# | --gemm_swiglu_plugin              | fp8 for FP8 models >= 30B on SM 90 at     | perf-best-practices.md "GEMM +   |
# |                                   | batch > 4, else disable                   | SwiGLU": recommended "if model   |
# |                                   |                                           | is large" on Hopper FP8, not for |
# |                                   |                                           | very small workloads; needs      |
# |                                   |                                           | use_fused_mlp (build.py          |
# |                                   |                                           | optimize_model_with_config)      |
# | --low_latency_gemm_plugin         | fp8 for FP8 on SM 90 at max batch <= 4    | fp8-quantization.md "Low Latency |
# | --low_latency_gemm_swiglu_plugin  | fp8 with it (same condition)              | GEMM Plugin": for low-latency;   |
# |                                   |                                           | alone it was slower, with the    |
# |                                   |                                           | SwiGLU fusion faster; BS <= 4 is |
# |                                   |                                           | perf-best-practices.md's small-  |
# |                                   |                                           | batch bound                      |
# | --multiple_profiles               | limits.multiple_profiles (default enable) | perf-best-practices.md "Multiple |
# |                                   |                                           | profiles": helps when the GEMM   |
# |                                   |                                           | plugin is disabled               |
# | --gather_generation_logits        | not passed                                | deprecated in 1.2; the BLS       |
# |                                   |                                           | compares tokens (use_draft_logits|
# |                                   |                                           | false), so no logits are needed  |
# Accuracy: the fused gate/up GEMM (use_fused_mlp, and the SwiGLU plugins built on it) drops one FP8 scaling factor
# (perf-best-practices.md); it is the 1.2.1 default already, so the SwiGLU plugins add no new loss of that kind.

# build() keeps reduce_fusion only for these architectures (builder.py build()).
REDUCE_FUSION_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Gemma2ForCausalLM", "MedusaForCausalLM"})
LOW_LATENCY_MAX_BATCH = 4  # perf-best-practices.md: small-batch FP8 GEMM tuning "(e.g. BS<=4)"
LARGE_MODEL_PARAMS = 30e9  # our reading of "if model is large" (the docs' case study is Llama-3.3-70B)
HOPPER_SM = 90  # GEMM + SwiGLU fusion: "only supported for FP8 precision on Hopper" (fp8-quantization.md)


def reduce_fusion(architecture: str, tp: int) -> bool:
    """`--reduce_fusion enable` exactly where build() keeps it: a supported architecture at TP > 1."""
    return tp > 1 and architecture in REDUCE_FUSION_ARCHITECTURES


def user_buffer(precision: str, architecture: str, tp: int, *, spawned_ranks: bool = False) -> bool:
    """`--user_buffer enable`: needs reduce_fusion (build()) and is supported for FP8 Llama only (plugin.py).

    Off when the engine's ranks are spawned by the Triton backend's orchestrator (`spawned_ranks`: draft-target,
    whose launch is `--multi-model`, FACTS §11) — a combination upstream never shows. The user-buffer communicator
    is built on MPI_COMM_WORLD with the rank and size of the engine's WorldConfig
    (cpp/tensorrt_llm/kernels/userbuffers/userbuffers-host.cpp `create_communicator_grouped2` @ 2a9abd95:
    `MPI_Comm_dup(MPI_COMM_WORLD, ...)`, multicast handles broadcast over it), i.e. it assumes the engine's ranks are
    the whole MPI world, as under mpirun; upstream measures it only that way (fp8-quantization.md, 70B TP4). Our
    rule (only proven combinations): the orchestrator `MPI_Comm_spawn`s each model's ranks, so keep it off there.
    """
    return (not spawned_ranks and reduce_fusion(architecture, tp) and QUANT_ALGO[precision] == "FP8"
            and architecture == "LlamaForCausalLM")


def fp8_gemm_plugins(precision: str, *, max_batch_size: int, sm: int, total_params: float) -> dict[str, str]:
    """The FP8 GEMM plugin choices: `--gemm_swiglu_plugin`, `--low_latency_gemm_plugin`,
    `--low_latency_gemm_swiglu_plugin` (all "disable" unless the table above applies)."""
    out = {"--gemm_swiglu_plugin": "disable", "--low_latency_gemm_plugin": "disable",
           "--low_latency_gemm_swiglu_plugin": "disable"}
    if QUANT_ALGO[precision] != "FP8" or sm != HOPPER_SM:
        return out
    if max_batch_size <= LOW_LATENCY_MAX_BATCH:
        out["--low_latency_gemm_plugin"] = "fp8"
        out["--low_latency_gemm_swiglu_plugin"] = "fp8"
    elif total_params >= LARGE_MODEL_PARAMS:
        out["--gemm_swiglu_plugin"] = "fp8"
    return out


# TensorRT-LLM's trtllm-build warns above this max_num_tokens (tensorrt_llm/_common.py check_max_num_tokens()).
MAX_NUM_TOKENS_WARN = 16384


def engine_max_num_tokens(
    max_num_tokens: int, *, max_batch_size: int, max_seq_len: int, max_input_len: int, tokens_per_block: int,
    context_fmha: bool = True, draft_len: int = 0,
) -> int:
    """The max_num_tokens an engine ends with for the value given to trtllm-build.

    tensorrt_llm/_common.py check_max_num_tokens() (run by builder.py _init_max_seq_len(), before build() adds the
    draft length to max_seq_len): clipped to max_seq_len × max_batch_size; at least max_input_len without context
    FMHA, else at least tokens_per_block. Then build() raises it to max_batch_size × (max_draft_len + 1) for a
    speculative engine (`draft_len` > 0).
    """
    tokens = min(max_num_tokens, max_seq_len * max_batch_size)
    if not context_fmha:
        tokens = max(tokens, max_input_len)
    else:
        tokens = max(tokens, tokens_per_block)
    if draft_len:
        tokens = max(tokens, max_batch_size * (draft_len + 1))
    return tokens
