"""The compile plan: exact `trtllm-build` argv for the target (and draft), the engine values to expect, the outputs.

Pure: reads only the checkpoints' `config.json` (never weights), runs nothing. Mirrors what TensorRT-LLM 1.2.1's
`build()` does to the values it is given, so the plan states the final engine values and verification can compare
them (sources in pipeline/stages/compile/flags.py and the decision table in pipeline/core/trtllm_rules.py):

- `max_num_tokens` is clipped to `max_seq_len × max_batch_size` (`check_max_num_tokens`, before speculation), held
  at least `tokens_per_block` with context FMHA, then raised to `max_batch_size × (K+1)` for speculation
  (`trtllm_rules.engine_max_num_tokens`).
- with `--speculative_decoding_mode` set, `build()` adds `max_draft_len` to `max_seq_len`: the target is given
  `--max_seq_len S` and its engine records `S + K`. The draft is built without speculation, so it is given
  `S + K` explicitly (it drafts K tokens past any sequence the target may hold).
- the draft engine has its own TP (`speculation.draft_tp`, default 1: an all-reduce per draft token at TP 4 buys
  nothing for a 1B model), its own max batch (`draft_max_batch_size`, default the speculation cap) and so its own
  `--workers`, `--max_num_tokens` and rank files; its checkpoint is exported at that TP.
- FP8 context FMHA needs quant_algo in {FP8, W4A8_AWQ, NVFP4}; with paged context FMHA and an FP8 KV cache it is
  forced on, with a non-FP8 KV cache forced off; paged context FMHA is dropped for INT8 KV and for FP8 KV with
  other quant_algos (`pipeline.core.trtllm_rules`, shared with the validator).
- `--reduce_fusion enable` for Llama at TP > 1 and `--user_buffer enable` with it for FP8 (build() drops both
  otherwise), except in a draft-target pair, whose ranks the orchestrator spawns (`trtllm_rules.user_buffer`);
  `--gemm_plugin` per precision (FP8: disabled); the FP8 GEMM/SwiGLU plugins per batch and model size
  (`trtllm_rules.fp8_gemm_plugins`); `--use_fused_mlp enable` stated explicitly.
- trtllm-build always builds a strongly typed network (`strongly_typed: True` in build.py), not only for FP8.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.runtimes import runtime_of
from pipeline.core.errors import CompileError
from pipeline.core.gpus import GPUS
from pipeline.core.registry import ModelEntry
from pipeline.core.spec import BuildSpec
from pipeline.core.trtllm_rules import (
    TRTLLM_VERSION,
    engine_max_num_tokens,
    fp8_context_fmha,
    fp8_gemm_plugins,
    gemm_plugin,
    paged_context_fmha,
    reduce_fusion,
    user_buffer,
)
from pipeline.planning.planner import plan_capacity as plan_memory
from pipeline.stages.compile.checkpoint_config import (
    CheckpointConfig,
    check_matches_spec,
    derived_checkpoint_config,
    read_checkpoint_config,
)
from pipeline.stages.compile.flags import SPECULATIVE_MODE_VALUE, check_argv

TIMING_CACHE = "timing.cache"
OUTPUT_PLACEHOLDER = "{output_dir}"
CHECKPOINT_PLACEHOLDER = "{checkpoint_dir}"


def _ed(flag: bool) -> str:
    return "enable" if flag else "disable"


@dataclass
class EnginePlan:
    """One `trtllm-build` invocation: argv, the build_config values the engine must record, the files it writes."""

    role: str  # "target" | "draft"
    model: str
    precision: str
    kv_cache: str
    checkpoint_dir: str
    output_dir: str
    checkpoint_derived: bool
    tp: int
    pp: int
    world_size: int
    workers: int
    draft_len: int
    options: dict[str, str]  # --flag -> value (output paths as placeholders), in argv order
    expected_build_config: dict[str, Any]  # top-level keys + "plugin_config" sub-dict
    rank_files: list[str] = field(default_factory=list)

    def argv_for(self, output_dir: Path | str) -> list[str]:
        """The argv with the engine written to `output_dir` (the run builds into a temporary sibling)."""
        argv = ["trtllm-build"]
        for flag, value in self.options.items():
            value = value.replace(OUTPUT_PLACEHOLDER, str(output_dir))
            value = value.replace(CHECKPOINT_PLACEHOLDER, self.checkpoint_dir)
            argv += [flag, value]
        return argv

    @property
    def argv(self) -> list[str]:
        return self.argv_for(self.output_dir)

    def key_factors(self) -> dict[str, Any]:
        """Everything of the plan that changes the engine, without machine-specific paths."""
        return {
            "role": self.role,
            "model": self.model,
            "precision": self.precision,
            "kv_cache": self.kv_cache,
            "options": {k: v for k, v in self.options.items() if k not in ("--checkpoint_dir", "--output_dir",
                                                                          "--output_timing_cache", "--workers")},
            "expected_build_config": self.expected_build_config,
            "world_size": self.world_size,
        }

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["argv"] = self.argv
        return d


@dataclass
class CompilePlan:
    """Target (+ draft) engine plans, the estimated GPU memory and the pinned toolchain."""

    spec_summary: str
    trtllm_version: str
    target: EnginePlan
    draft: EnginePlan | None
    memory: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def engines(self) -> list[EnginePlan]:
        """Build order: the draft first, so the target can record the pair."""
        return [p for p in (self.draft, self.target) if p is not None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec_summary,
            "trtllm_version": self.trtllm_version,
            "target": self.target.as_dict(),
            "draft": self.draft.as_dict() if self.draft else None,
            "memory": self.memory,
            "warnings": self.warnings,
        }

    def format(self) -> str:
        """Human-readable plan: one shell-quoted argv per engine, expected outputs, memory estimate."""
        import shlex

        lines = [self.spec_summary, f"toolchain: TensorRT-LLM {self.trtllm_version} (trtllm-build)"]
        for p in self.engines:
            lines.append(f"\n[{p.role}] {p.model} {p.precision} kv={p.kv_cache} tp={p.tp} pp={p.pp} "
                         f"-> {p.output_dir}")
            if p.checkpoint_derived:
                lines.append(f"  (checkpoint {p.checkpoint_dir} not exported yet: config derived from the spec)")
            lines.append("  " + shlex.join(p.argv))
            lines.append(f"  outputs: config.json, {', '.join(p.rank_files)}, {TIMING_CACHE}, manifest.json")
            b = p.expected_build_config
            lines.append(f"  engine: max_seq_len={b['max_seq_len']} max_num_tokens={b['max_num_tokens']} "
                         f"max_draft_len={b['max_draft_len']}")
        m = self.memory
        lines.append(
            f"\nestimated GPU memory per GPU ({m['gpu']}): weights {m['weights_gib_per_gpu']} GiB"
            f" + runtime/activations {m['reserve_gib_per_gpu']} GiB + KV pool {m['kv_pool_gib_per_gpu']} GiB"
            f" ({m['kv_cache_tokens']:,} tokens); fits: {'yes' if m['fits'] else 'NO'}"
        )
        if m.get("draft_tp"):
            gpus = ",".join(map(str, m["draft_gpu_device_ids"]))
            lines.append(
                f"draft on GPU {gpus} (tp={m['draft_tp']}, batch {m['draft_max_batch_size']}): weights "
                f"{m['draft_weights_gib_per_gpu']} GiB + KV pool {m['draft_kv_pool_gib_per_gpu']} GiB "
                f"({m['draft_kv_cache_tokens']:,} tokens)"
            )
        return "\n".join(lines)  # the spec's warnings: on stderr, printed once by the CLI (and in the JSON)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def effective_max_num_tokens(spec: BuildSpec, *, role: str = "target") -> int:
    """What build() ends with for the max_num_tokens the plan gives the target (or the draft) engine."""
    lim = spec.limits
    if role == "draft":
        batch, seq, k = spec.draft_max_batch_size, spec.draft_max_seq_len, 0
    else:
        batch, seq, k = spec.max_batch_size, spec.max_seq_len, spec.draft_len
    return engine_max_num_tokens(spec.base_max_num_tokens, max_batch_size=batch, max_seq_len=seq,
                                 max_input_len=spec.max_input_len, tokens_per_block=lim.tokens_per_block,
                                 context_fmha=lim.context_fmha, draft_len=k)


def _expected_build_config(o: dict[str, str], *, engine_seq: int) -> dict[str, Any]:
    """The `build_config` trtllm-build records for the options `o` (what engine verification compares with)."""

    def on(flag: str) -> bool:
        return o[flag] == "enable"

    def plugin_value(flag: str) -> str | None:
        return None if o[flag] == "disable" else o[flag]  # PluginConfig stores "disable" as None

    draft_len = int(o["--max_draft_len"])
    opt_num_tokens = o.get("--opt_num_tokens")
    return {
        "max_batch_size": int(o["--max_batch_size"]),
        "max_input_len": int(o["--max_input_len"]),
        "max_seq_len": engine_seq,
        "max_num_tokens": int(o["--max_num_tokens"]),
        "opt_num_tokens": int(opt_num_tokens) if opt_num_tokens is not None else None,
        "max_beam_width": int(o["--max_beam_width"]),
        "kv_cache_type": "paged",
        "max_draft_len": draft_len,
        "speculative_decoding_mode": SPECULATIVE_MODE_VALUE["draft_tokens_external" if draft_len else "none"],
        "strongly_typed": True,
        "plugin_config": {
            "gemm_plugin": plugin_value("--gemm_plugin"),
            "gpt_attention_plugin": o["--gpt_attention_plugin"],
            "context_fmha": on("--context_fmha"),
            "use_paged_context_fmha": on("--use_paged_context_fmha"),
            "use_fp8_context_fmha": on("--use_fp8_context_fmha"),
            "remove_input_padding": True,
            "multiple_profiles": on("--multiple_profiles"),
            "tokens_per_block": int(o["--tokens_per_block"]),
            "paged_kv_cache": True,
            "use_fused_mlp": True,
            "gemm_swiglu_plugin": plugin_value("--gemm_swiglu_plugin"),
            "low_latency_gemm_plugin": plugin_value("--low_latency_gemm_plugin"),
            "low_latency_gemm_swiglu_plugin": plugin_value("--low_latency_gemm_swiglu_plugin"),
            "reduce_fusion": on("--reduce_fusion"),
            "user_buffer": on("--user_buffer"),
        },
    }


def _engine_plan(
    spec: BuildSpec, ckpt: CheckpointConfig, model: ModelEntry, *, role: str, precision: str, output_dir: Path,
) -> EnginePlan:
    k = spec.draft_len
    speculative = role == "target" and k > 0
    if role == "target":
        batch, seq = spec.max_batch_size, spec.max_seq_len
        engine_seq = spec.max_seq_len + k  # build() adds max_draft_len
    else:
        batch, seq = spec.draft_max_batch_size, spec.draft_max_seq_len
        engine_seq = seq
    workers = max(1, min(ckpt.world_size, spec.hardware.gpu_count))
    o = {
        **_limit_options(spec, role=role, batch=batch, seq=seq),
        **_kernel_options(spec, ckpt, model, precision=precision, batch=batch),
        "--workers": str(workers),
        "--output_timing_cache": f"{OUTPUT_PLACEHOLDER}/{TIMING_CACHE}",
    }
    if speculative:
        o["--speculative_decoding_mode"] = "draft_tokens_external"
        o["--max_draft_len"] = str(k)
    else:
        o["--max_draft_len"] = "0"

    expected = _expected_build_config(o, engine_seq=engine_seq)
    plan = EnginePlan(
        role=role,
        model=model.name,
        precision=precision,
        kv_cache=spec.quantization.kv,
        checkpoint_dir=str(ckpt.path),
        output_dir=str(output_dir),
        checkpoint_derived=ckpt.derived,
        tp=ckpt.tp,
        pp=ckpt.pp,
        world_size=ckpt.world_size,
        workers=workers,
        draft_len=k if speculative else 0,
        options=o,
        expected_build_config=expected,
        rank_files=[f"rank{i}.engine" for i in range(ckpt.world_size)],
    )
    check_argv(plan.argv)  # every planned flag and value exists in trtllm-build 1.2.1
    return plan


def _limit_options(spec: BuildSpec, *, role: str, batch: int, seq: int) -> dict[str, str]:
    """Placeholders for the directories, and the engine's shape limits."""
    lim = spec.limits
    max_num_tokens = effective_max_num_tokens(spec, role=role)
    o = {
        "--checkpoint_dir": CHECKPOINT_PLACEHOLDER,
        "--output_dir": OUTPUT_PLACEHOLDER,
        "--max_batch_size": str(batch),
        "--max_input_len": str(spec.max_input_len),
        "--max_seq_len": str(seq),
        "--max_num_tokens": str(max_num_tokens),
        "--max_beam_width": str(lim.max_beam_width),
    }
    if not lim.multiple_profiles:
        o["--opt_num_tokens"] = str(min(lim.opt_num_tokens or batch * lim.max_beam_width, max_num_tokens))
    return o


def _kernel_options(spec: BuildSpec, ckpt: CheckpointConfig, model: ModelEntry, *, precision: str,
                    batch: int) -> dict[str, str]:
    """KV cache layout, plugins, attention kernels and fusions for this precision, dtype, architecture and TP."""
    q, lim = spec.quantization, spec.limits
    dtype = ckpt.dtype
    gemm = gemm_plugin(precision)  # 16-bit GEMMs in this model's compute dtype (W4A8-AWQ: float16, as upstream)
    if gemm in ("bfloat16", "float16") and gemm != dtype:
        gemm = dtype  # 16-bit GEMMs run in the checkpoint dtype
    fp8_plugins = fp8_gemm_plugins(precision, max_batch_size=batch, sm=GPUS[spec.hardware.gpu].sm,
                                   total_params=model.architecture.total_params)
    moe = {"--moe_plugin": dtype} if ckpt.num_experts > 1 else {}  # experts run in the MixtureOfExperts plugin
    return {
        **moe,
        "--kv_cache_type": "paged",
        "--tokens_per_block": str(lim.tokens_per_block),
        "--gemm_plugin": gemm,
        "--gpt_attention_plugin": dtype,
        "--context_fmha": _ed(lim.context_fmha),
        "--use_paged_context_fmha": _ed(paged_context_fmha(precision, q.kv, context_fmha=lim.context_fmha)),
        "--use_fp8_context_fmha": _ed(fp8_context_fmha(precision, q.kv, context_fmha=lim.context_fmha)),
        "--remove_input_padding": "enable",
        "--multiple_profiles": _ed(lim.multiple_profiles),
        "--use_fused_mlp": "enable",
        **fp8_plugins,
        "--reduce_fusion": _ed(reduce_fusion(ckpt.architecture, ckpt.tp)),
        # a draft-target repository runs in orchestrator mode: the backend spawns each engine's ranks
        "--user_buffer": _ed(user_buffer(precision, ckpt.architecture, ckpt.tp,
                                         spawned_ranks=spec.draft_model is not None)),
    }


def _checkpoint(spec: BuildSpec, ckpt_dir: Path, model: ModelEntry, *, role: str, precision: str,
                allow_derived: bool) -> CheckpointConfig:
    # The draft engine has its own TP (pp 1); its checkpoint is exported at that mapping.
    tp, pp = (spec.draft_tp, 1) if role == "draft" else (spec.parallelism.tp, spec.parallelism.pp)
    if allow_derived and not (Path(ckpt_dir) / "config.json").exists():
        return derived_checkpoint_config(
            ckpt_dir, model, precision=precision, kv_cache=spec.quantization.kv,
            compute_dtype=spec.compute_dtype_of(role), tp=tp, pp=pp,
            awq_block_size=spec.quantization.awq_block_size,
        )
    ckpt = read_checkpoint_config(ckpt_dir)
    check_matches_spec(ckpt, model, role=role, precision=precision, kv_cache=spec.quantization.kv, tp=tp, pp=pp,
                       compute_dtype=spec.compute_dtype_of(role))
    return ckpt


def plan_compile(
    spec: BuildSpec,
    *,
    checkpoint_dir: Path | str,
    output_dir: Path | str,
    draft_checkpoint_dir: Path | str | None = None,
    draft_output_dir: Path | str | None = None,
    allow_derived: bool = False,
) -> CompilePlan:
    """Plan the engine build(s) of a validated spec from its exported checkpoint(s).

    Args:
        spec: a validated `BuildSpec` (`pipeline.core.spec.resolve_spec`) with `target="trtllm"`.
        checkpoint_dir: the target's TensorRT-LLM checkpoint (`config.json` is read; weights are not).
        output_dir: final engine directory of the target (`engines/<build-id>/engine`).
        draft_checkpoint_dir: the draft's checkpoint; required when the spec has a draft.
        draft_output_dir: final draft engine directory (default: `draft_engine` beside `output_dir`).
        allow_derived: plan from the spec when a checkpoint config does not exist yet (dry runs only).

    Raises:
        CompileError: a checkpoint is missing/mismatched, or a planned flag is not accepted by trtllm-build 1.2.1.
    """

    if not runtime_of(spec).gpu:
        raise CompileError(
            f"target={spec.target} runs the checkpoint with PyTorch and has no TensorRT-LLM engines; "
            "use --target trtllm to compile, or `invoke package --target reference` for the CPU path"
        )
    output_dir = Path(output_dir)
    target_ckpt = _checkpoint(spec, Path(checkpoint_dir), spec.model, role="target",
                              precision=spec.quantization.precision, allow_derived=allow_derived)
    target = _engine_plan(spec, target_ckpt, spec.model, role="target", precision=spec.quantization.precision,
                          output_dir=output_dir)
    draft = None
    if spec.draft_model:
        if draft_checkpoint_dir is None:
            raise CompileError(
                f"the spec has draft {spec.draft_model.name} but no draft checkpoint was given; "
                "run `invoke calibrate` for the draft or pass --draft-checkpoint-dir DIR"
            )
        draft_ckpt = _checkpoint(spec, Path(draft_checkpoint_dir), spec.draft_model, role="draft",
                                 precision=spec.draft_precision, allow_derived=allow_derived)
        draft_out = Path(draft_output_dir) if draft_output_dir else output_dir.parent / "draft_engine"
        draft = _engine_plan(spec, draft_ckpt, spec.draft_model, role="draft", precision=spec.draft_precision,
                             output_dir=draft_out)
    elif draft_checkpoint_dir is not None:
        raise CompileError("--draft-checkpoint-dir was given but the spec has no draft; pass --draft NAME too")
    memory = plan_memory(spec).as_dict()
    return CompilePlan(
        spec_summary=spec.summary(),
        trtllm_version=TRTLLM_VERSION,
        target=target,
        draft=draft,
        memory=memory,
        warnings=list(spec.warnings),
    )
