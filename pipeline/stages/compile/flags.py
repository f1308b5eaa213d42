"""The `trtllm-build` command line of TensorRT-LLM 1.2.1, as data, and a checker for planned argv against it.

Sources (NVIDIA/TensorRT-LLM, read with the repository search tools; the stored snapshots are the post-1.0
code line that 1.2.1 ships: pydantic `PluginConfig`, no auto-parallel flags, `lora_helper` import):
- tensorrt_llm/commands/build.py, `parse_arguments()` @ 65f1d1536e18aea3380e6e270e00895a709333eb — every
  non-plugin flag below, with its type / choices / action.
- tensorrt_llm/plugin/plugin.py, `PluginConfig` fields + `cli_plugin_args` + `add_plugin_argument()`
  @ c20322ffd3dc0740ca530c9fad989b22e64f6e06 — the plugin flags: `bool` fields become `enable|disable` flags,
  `Optional[Literal[...]]` fields become dtype choices where `None` is spelled `disable`, `tokens_per_block` is an int.
- tensorrt_llm/builder.py `build()` / `BuildConfig` / `EngineConfig.to_dict()` and tensorrt_llm/_common.py
  `check_max_num_tokens()` — the rules the planner mirrors (see pipeline/stages/compile/engine_plan.py); which value each
  performance flag gets, and why, is the decision table in pipeline/core/trtllm_rules.py.

Not accepted by 1.2.1 (removed in earlier releases): --max_output_len, --use_custom_all_reduce, --multi_block_mode,
--context_fmha_fp32_acc, --auto_parallel/--gpus_per_node/--cluster_key (auto-parallel was dropped after 0.21).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import CompileError

ENABLE_DISABLE = ("enable", "disable")
_PLUGIN_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "disable")  # DefaultPluginDtype + None


@dataclass(frozen=True)
class FlagSpec:
    """One accepted option: `kind` is int | str | choice | store_true | nargs+ (one or more strings)."""

    name: str
    kind: str
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()


def _f(name: str, kind: str, choices: tuple[str, ...] = (), aliases: tuple[str, ...] = ()) -> FlagSpec:
    return FlagSpec(name, kind, choices, aliases)


def _choices(choices: tuple[str, ...], *names: str) -> tuple[FlagSpec, ...]:
    """Several consecutive choice flags that accept the same values."""
    return tuple(FlagSpec(name, "choice", choices) for name in names)


# tensorrt_llm/commands/build.py parse_arguments() (1.2.1 code line), in source order.
BUILD_FLAGS: tuple[FlagSpec, ...] = (
    _f("checkpoint_dir", "str"),
    _f("model_config", "str"),
    _f("build_config", "str"),
    _f("model_cls_file", "str"),
    _f("model_cls_name", "str"),
    _f("output_dir", "str"),
    _f("max_batch_size", "int"),
    _f("max_input_len", "int"),
    _f("max_seq_len", "int", aliases=("max_decoder_seq_len",)),
    _f("max_beam_width", "int"),
    _f("max_num_tokens", "int"),
    _f("opt_num_tokens", "int"),
    _f("max_encoder_input_len", "int"),
    _f("max_prompt_embedding_table_size", "int", aliases=("max_multimodal_len",)),
    _f("kv_cache_type", "choice", ("continuous", "paged", "disabled")),  # KVCacheType.from_string
    _f("paged_kv_cache", "str"),  # deprecated: use --kv_cache_type
    _f("input_timing_cache", "str"),
    _f("output_timing_cache", "str"),
    _f("profiling_verbosity", "choice", ("layer_names_only", "detailed", "none")),
    _f("strip_plan", "store_true"),
    _f("weight_sparsity", "store_true"),
    _f("weight_streaming", "store_true"),
    _f("fast_build", "store_true"),
    _f("workers", "int"),
    _f("log_level", "choice", ("internal_error", "error", "warning", "info", "verbose", "debug", "trace")),
    _f("enable_debug_output", "store_true"),
    _f("visualize_network", "str"),
    _f("dry_run", "store_true"),
    _f("monitor_memory", "store_true"),
    _f("logits_dtype", "choice", ("float16", "float32")),
    _f("gather_context_logits", "store_true"),
    _f("gather_generation_logits", "store_true"),  # deprecated in 1.2 (warns on every build)
    _f("gather_all_token_logits", "store_true"),
    _f("lora_dir", "nargs+"),
    _f("lora_ckpt_source", "choice", ("hf", "nemo")),
    _f("lora_target_modules", "nargs+"),
    _f("max_lora_rank", "int"),
    _f("speculative_decoding_mode", "choice",
       ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle")),
    _f("max_draft_len", "int"),
)

# tensorrt_llm/plugin/plugin.py cli_plugin_args, in source order: plugins (dtype choices), then features.
PLUGIN_FLAGS: tuple[FlagSpec, ...] = (
    *_choices(_PLUGIN_DTYPES, "bert_attention_plugin", "gpt_attention_plugin"),
    _f("gemm_plugin", "choice", ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable")),
    _f("gemm_swiglu_plugin", "choice", ("fp8", "disable")),
    *_choices(_PLUGIN_DTYPES, "fp8_rowwise_gemm_plugin", "lora_plugin"),
    _f("dora_plugin", "choice", ENABLE_DISABLE),
    *_choices(_PLUGIN_DTYPES, "moe_plugin", "mamba_conv1d_plugin", "nccl_plugin"),
    *_choices(("fp8", "disable"), "low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin"),
    _f("gemm_allreduce_plugin", "choice", ("float16", "bfloat16", "disable")),
    *_choices(ENABLE_DISABLE, "context_fmha", "bert_context_fmha_fp32_acc", "remove_input_padding"),
    _f("tokens_per_block", "int"),
    *_choices(ENABLE_DISABLE, "use_paged_context_fmha", "use_fp8_context_fmha", "fuse_fp4_quant", "multiple_profiles",
              "paged_state", "streamingllm", "norm_quant_fusion", "reduce_fusion", "user_buffer", "use_fused_mlp",
              "pp_reduce_scatter"),
)

ACCEPTED: dict[str, FlagSpec] = {}
for _spec in (*BUILD_FLAGS, *PLUGIN_FLAGS):
    for _name in (_spec.name, *_spec.aliases):
        ACCEPTED["--" + _name] = _spec

# The enable/disable-valued flags (PluginConfig bool fields).
ENABLE_DISABLE_FLAGS = frozenset("--" + s.name for s in PLUGIN_FLAGS if s.choices == ENABLE_DISABLE)

# speculative_decoding_mode as serialized in an engine's config.json: SpeculativeDecodingMode is an IntFlag
# (NONE=1, DRAFT_TOKENS_EXTERNAL=2, MEDUSA=4, LOOKAHEAD_DECODING=8, EXPLICIT_DRAFT_TOKENS=16, EAGLE=32, ...),
# which json writes as its integer value.
SPECULATIVE_MODE_VALUE = {
    "none": 1, "draft_tokens_external": 2, "medusa": 4, "lookahead_decoding": 8, "explicit_draft_tokens": 16,
    "eagle": 32,
}


def check_argv(argv: list[str]) -> None:
    """Raise `CompileError` unless `argv` is `trtllm-build` followed only by accepted flags with valid values.

    Each flag may appear once; values are checked against the flag's type or choices.
    """
    if not argv or argv[0] != "trtllm-build":
        raise CompileError(f"planned command must start with trtllm-build, got {argv[:1]}")
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        flag = argv[i]
        spec = ACCEPTED.get(flag)
        if spec is None:
            raise CompileError(f"trtllm-build 1.2.1 has no option {flag!r} (planned argv: {' '.join(argv)})")
        if spec.name in seen:
            raise CompileError(f"trtllm-build option {flag} given twice")
        seen.add(spec.name)
        i += 1
        if spec.kind == "store_true":
            continue
        values = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
            if spec.kind != "nargs+":
                break
        if not values:
            raise CompileError(f"trtllm-build option {flag} needs a value")
        for value in values:
            if spec.kind == "int":
                try:
                    int(value)
                except ValueError:
                    raise CompileError(f"trtllm-build option {flag} needs an integer, got {value!r}") from None
            elif spec.kind == "choice" and value not in spec.choices:
                raise CompileError(
                    f"trtllm-build option {flag}={value!r} is not one of {', '.join(spec.choices)}"
                )

