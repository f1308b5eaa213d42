"""The typed build spec: one pydantic model per concern, resolved from the registry, a YAML file and CLI flags.

`resolve_spec(...)` is the way in. Like TensorRT-LLM's `llm_args.py`, the classes validate themselves: field types and
bounds on each section, and `BuildSpec`'s model validator applies every coherence rule (`pipeline.core.spec_rules`)
to each spec validated, raising `SpecError` with one line naming the field, the value and the fix. A changed spec is
validated again (`BuildSpec.revised`); `model_copy` makes unchecked what-if variants (the planner's candidates).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPUS
from pipeline.core.hub_entry import check_hub_tokenizers
from pipeline.core.registry import MAX_BATCH, MAX_DRAFT_LEN, MAX_POSITIONS, ModelEntry, eagle3_heads, get_model
from pipeline.core.untrusted import load_yaml_mapping
from pipeline.core.spec_rules import validate_spec
from pipeline.core.trtllm_rules import compute_dtype as precision_compute_dtype

Precision = Literal["bf16", "fp16", "fp8", "int4_awq", "w4a8_awq", "int8_sq"]
KVCache = Literal["fp8", "int8", "bf16", "fp16"]
GPUName = Literal["h100-sxm", "h100-pcie", "h100-nvl", "h200", "l40s", "a100"]
Target = Literal["trtllm", "reference"]
Runtime = Literal["engine", "pytorch"]
# Speculative decoding: a draft model proposes (draft-target), an EAGLE-3 head on the target's hidden states does
# (eagle3), or the request's own tokens do (ngram: prompt lookup)
SpeculativeMode = Literal["draft-target", "eagle3", "ngram"]
DRAFT_TARGET, EAGLE3, NGRAM = "draft-target", "eagle3", "ngram"
# ngram's longest matched suffix: NGramDecodingConfig.max_matching_ngram_size is a PositiveInt defaulting to 2 on
# TensorRT-LLM's main branch and in upstream's Llama-3.1-8B n-gram accuracy test; 1.2.0 declares 0 and its
# TorchLlmArgs.validate_speculative_config asserts > 0, so it is always written out.
NGRAM_MATCH_DEFAULT = 2
MAX_NGRAM_MATCH = 32
AUTO = "auto"  # `precision: auto`: `build` calibrates the AutoPrecision candidates and keeps the cheapest passing

# No infinities or NaNs anywhere (`--gpu-price 1e309` is refused, never printed as Infinity).
_Strict = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
# Finite upper bounds, each far beyond any real use (the CLI's own options share them).
MAX_REQUEST_TOKENS = 1_048_576  # prompt or output tokens of one request
MAX_SLO_MS = 3_600_000.0  # a TTFT/TPOT target: an hour
MAX_RATE = 1_000_000.0  # requests per second
MAX_NODES = 256
MAX_REPLICAS = 10_000
MAX_TP = 64
MAX_UNIT_WORKERS = 32  # workers of one role in a disaggregated unit (the planner searches up to it)


def _sha256(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class _Section(BaseModel):
    """A spec section that states its hash factors (vLLM's `compute_hash`): every field changes an artifact except
    those in `IGNORED`, each with the reason it never does."""

    IGNORED: ClassVar[dict[str, str]] = {}

    def hash_factors(self) -> dict[str, Any]:
        """The fields that change an artifact, as JSON values."""
        return self.model_dump(mode="json", exclude=set(self.IGNORED))

    def compute_hash(self) -> str:
        return _sha256(self.hash_factors())


class QuantizationSpec(_Section):
    model_config = _Strict
    IGNORED: ClassVar[dict[str, str]] = {
        "calib_data": "the file's location: the calibrate key hashes its tokenized samples, which `build` checks",
        "max_ppl_delta_pct": "the quality gate's threshold passes or refuses a checkpoint, never changes it",
        "quality_gate": "whether the gate is enforced passes or refuses a checkpoint, never changes it",
    }

    precision: Precision = Field(
        "fp8", description="weight/activation precision; 'auto' (build): calibrate FP8 (INT8-SQ without FP8), then "
        "INT4-AWQ while the quality gate holds, keep the cheapest that passes")
    kv_cache: KVCache | None = Field(
        None, description="KV-cache dtype (default: fp8 for fp8/w4a8_awq, else the compute dtype)"
    )
    calib_data: str | None = Field(None, description="calibration text: .jsonl with {'text': ...} or plain text")
    calib_size: int | None = Field(None, gt=0, le=1_000_000,
                                   description="calibration samples (default: per model, 512)")
    calib_seq_len: int | None = Field(None, gt=0, le=1_048_576, description="calibration max sequence length")
    calib_batch_size: int = Field(1, gt=0, le=4096, description="calibration batch size")
    calib_seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of the calibration sample selection")
    awq_block_size: Literal[64, 128] = Field(128, description="INT4/W4A8 AWQ group size")
    max_ppl_delta_pct: float | None = Field(None, gt=0, le=1000, description="quality gate: max perplexity increase, %")
    quality_gate: bool = Field(True, description="fail calibration when the quality gate trips")

    @property
    def compute_dtype(self) -> str:
        """The target's 16-bit activation dtype: fp16 for fp16 and w4a8_awq (upstream's W4A8-AWQ recipes), else bf16
        (`pipeline.core.trtllm_rules.COMPUTE_DTYPE`, which cites the sources)."""
        return precision_compute_dtype(self.precision)

    @property
    def kv(self) -> str:
        """The resolved KV-cache dtype."""
        if self.kv_cache:
            return self.kv_cache
        return "fp8" if self.precision in ("fp8", "w4a8_awq") else self.compute_dtype


class ParallelSpec(_Section):
    model_config = _Strict

    tp: int = Field(1, ge=1, le=MAX_TP, description="tensor-parallel size")
    pp: int = Field(1, ge=1, le=64, description="pipeline-parallel size")
    moe_ep: int | None = Field(
        None, ge=1, le=64, description="MoE models: expert-parallel size within the TP group (moe_tp = tp / moe_ep; "
        "default 1, TensorRT-LLM's Mapping default: experts TP-sharded); the PyTorch backend's "
        "moe_expert_parallel_size")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("moe_ep") is None:
            data.pop("moe_ep", None)  # unset: specs that predate it dump (and hash) as before
        return data

    @property
    def moe_ep_size(self) -> int:
        return self.moe_ep or 1

    @property
    def moe_tp_size(self) -> int:
        """tensorrt_llm/mapping.py Mapping: moe_tp_size = tp_size // moe_ep_size when only EP is given."""
        return self.tp // self.moe_ep_size

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


class EngineLimits(_Section):
    model_config = _Strict

    max_batch_size: int | None = Field(
        None, gt=0, le=MAX_BATCH,
        description="engine max batch size (default: what the memory model fits, at most 2048; "
        "`check` says why)")
    max_input_len: int | None = Field(None, gt=0, le=MAX_POSITIONS,
                                      description="max prompt tokens (default: per model)")
    max_seq_len: int | None = Field(
        None, gt=0, le=MAX_POSITIONS, description="max prompt+output tokens, >= max_input_len (default: per model)"
    )
    max_num_tokens: int | None = Field(None, gt=0, le=MAX_POSITIONS,
                                       description="max tokens per engine step (default: derived)")
    opt_num_tokens: int | None = Field(None, gt=0, le=MAX_POSITIONS,
                                       description="optimal tokens per step (no multiple_profiles)")
    tokens_per_block: Literal[8, 16, 32, 64, 128] = Field(32, description="paged KV-cache tokens per block")
    multiple_profiles: bool = Field(True, description="build several TensorRT optimization profiles")
    context_fmha: bool = Field(True, description="fused attention in the context phase")
    max_beam_width: int = Field(1, ge=1, le=8, description="max beam width")


class SpeculationSpec(_Section):
    """Draft-target speculation. The draft engine is built and placed on its own: its TP, max batch and GPUs.

    Upstream: examples/draft_target_model/README.md (draft_len "from 4 to 10 in common usage";
    `draft_model_device_list` whose length is the draft engine's TP; draft and target on one GPU "appears better
    performance than placing on two separate GPUs"; `gpu_device_ids` per Triton model).
    """

    model_config = _Strict

    draft: str | None = Field(None, description="draft model (draft-target) or EAGLE-3 head (eagle3); 'auto': the "
                              "registry's default draft, or with eagle3 the registry's head for the target")
    speculative_decoding: SpeculativeMode | None = Field(
        None, description="speculation mode: draft-target (a draft model; the default with --draft), eagle3 (--draft "
        "names an EAGLE-3 head trained for the target; the default when it does; runtime pytorch) or ngram (prompt "
        "lookup: drafts copied from the request's own earlier tokens, no model; runtime pytorch)")
    max_matching_ngram_size: int | None = Field(
        None, ge=1, le=MAX_NGRAM_MATCH,
        description=f"ngram: the longest suffix matched against earlier tokens (default {NGRAM_MATCH_DEFAULT})")
    draft_len: int | None = Field(
        None, le=MAX_DRAFT_LEN, description="draft tokens per step K >= 1 (default: registry's; 4-6 typical, > 8 warns)"
    )
    draft_precision: Precision | None = Field(None, description="draft precision (default: the target's)")
    max_batch_for_speculation: int = Field(
        8, gt=0, le=MAX_BATCH,
        description="batch up to which speculation pays: warn above it; the draft engine's default max batch"
    )
    draft_tp: int = Field(1, ge=1, le=MAX_TP, description="tensor-parallel size of the draft engine (pp is 1)")
    draft_max_batch_size: int | None = Field(
        None, gt=0, le=MAX_BATCH,
        description="draft engine max batch (default: min(max_batch_for_speculation, max_batch_size))"
    )
    draft_gpu_device_ids: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(
        None, description="GPUs of the draft engine, one per draft TP rank (default: the target's first draft_tp)"
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("speculative_decoding", "max_matching_ngram_size"):
            if data.get(name) is None:
                data.pop(name, None)  # unset: specs that predate the modes dump (and hash) as before
        return data


class ServingSpec(_Section):
    model_config = _Strict
    IGNORED: ClassVar[dict[str, str]] = {
        "kv_cache_free_gpu_mem_fraction": "a runtime memory share (rendered into the repository, never its name)",
        "draft_kv_cache_free_gpu_mem_fraction": "a runtime memory share (rendered into the repository, never its name)",
        "max_tokens_in_paged_kv_cache": "a runtime memory cap (rendered into the repository, never its name)",
    }

    kv_cache_free_gpu_mem_fraction: float | None = Field(
        None, gt=0, le=1, description="KV pool share of free GPU memory (default 0.9; 0.7 with a draft)"
    )
    draft_kv_cache_free_gpu_mem_fraction: float = Field(0.2, gt=0, le=1, description="the draft's KV share")
    max_tokens_in_paged_kv_cache: int | None = Field(None, gt=0, le=1 << 40, description="cap on KV-cache tokens")
    enable_kv_cache_reuse: bool = Field(True, description="prefix caching (needs paged context FMHA)")
    enable_chunked_context: bool = Field(True, description="chunked prefill (needs paged context FMHA)")
    decoupled: bool | None = Field(
        None,
        description="decoupled (streaming) tensorrt_llm: default on without a draft, off with one (upstream's "
        "draft-target layout, unary target/draft/BLS)",
    )
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = Field(
        "guaranteed_no_evict", description="in-flight batcher scheduling policy"
    )

    def target_decoupled(self, speculative: bool) -> bool:
        """Whether `tensorrt_llm` is decoupled: the spec's choice, else streaming unless a draft is served."""
        return (not speculative) if self.decoupled is None else self.decoupled

    def target_fraction(self, speculative: bool) -> float:
        if self.kv_cache_free_gpu_mem_fraction is not None:
            return self.kv_cache_free_gpu_mem_fraction
        return 0.7 if speculative else 0.9


class HardwareSpec(_Section):
    model_config = _Strict
    IGNORED: ClassVar[dict[str, str]] = {
        "gpu_count": "where the build runs: engines are built for tp x pp ranks, not for the host's GPUs",
        "nodes": "where the build runs (placement)",
        "gpus_per_node": "where the build runs (placement)",
        "tp_across_nodes": "where the build runs (placement)",
        "gpu_price_per_hour": "cost figures only",
    }

    gpu: GPUName = Field("h100-sxm", description="target GPU")
    gpu_count: int = Field(8, ge=1, le=1024, description="GPUs on one host")
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="nodes the ranks may span: TP within a node, PP across nodes")
    gpus_per_node: int | None = Field(None, ge=1, le=64, description="GPUs per node (default: gpu_count)")
    tp_across_nodes: bool = Field(False, description="allow a TP group to span nodes (all-reduce over the network)")
    gpu_price_per_hour: float | None = Field(
        None, gt=0, le=10_000,
        description="USD per GPU-hour for cost figures (default: $PIPELINE_GPU_PRICE, else the GPU's own in "
        "pipeline/core/gpus.py)")


class PlannedTraffic(BaseModel):
    """The traffic a deployment was sized for (`plan --slo`): request lengths, the prompt share a cached prefix
    covers, the draft acceptance assumed, and the arrival rate."""

    model_config = _Strict

    input_len: int = Field(gt=0, le=MAX_REQUEST_TOKENS, description="prompt tokens per request")
    output_len: int = Field(gt=0, le=MAX_REQUEST_TOKENS, description="output tokens per request")
    prefix_share: float = Field(0.0, ge=0, le=1, description="share of each prompt a cached prefix covers, 0..1")
    acceptance: float | None = Field(None, ge=0, le=1, description="draft acceptance rate (default: the planner's)")
    rate: float | None = Field(None, gt=0, le=MAX_RATE,
                               description="requests per second to serve (default: one replica, fully loaded)")
    shared_prefixes: int = Field(1, ge=1, le=MAX_REQUEST_TOKENS,
                                 description="distinct shared prefixes the prefix share is spread over (fleet hits)")
    requests_per_prefix: float | None = Field(None, gt=0, le=1e12,
                                              description="requests that reuse each shared prefix (default: unbounded)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("shared_prefixes") == 1 and data.get("requests_per_prefix") is None:
            data.pop("shared_prefixes", None)  # bench's one shared prefix: written (and read back) as before
            data.pop("requests_per_prefix", None)
        return data


class PlannedEstimate(BaseModel):
    """The planner's estimate for the pick: what the plan paid for (one replica's tok/s; $ over all replicas)."""

    model_config = _Strict

    ttft_ms: float = Field(gt=0, le=MAX_SLO_MS, description="estimated time to first token, ms")
    tpot_ms: float = Field(gt=0, le=MAX_SLO_MS, description="estimated time per output token, ms")
    tokens_per_s: float = Field(gt=0, le=1e9, description="output tokens per second of one replica, fully loaded")
    cost_per_1m_output_tokens_usd: float = Field(gt=0, le=1e9, description="$ per 1M output tokens at the traffic")


class DisaggTarget(BaseModel):
    """A disaggregated unit (`plan --slo` when disaggregation pays; `deploy --platform dynamo` renders it): prefill
    workers of `prefill_tp` GPUs and decode workers of the spec's own tp x pp at its max batch."""

    model_config = _Strict

    prefill_workers: int = Field(ge=1, le=MAX_UNIT_WORKERS, description="prefill workers per unit")
    prefill_tp: int = Field(ge=1, le=MAX_TP, description="GPUs (TP) of a prefill worker")
    decode_workers: int = Field(ge=1, le=MAX_UNIT_WORKERS, description="decode workers per unit (the spec's tp x pp)")


class ServingTarget(BaseModel):
    """What a deployment is for (`plan --slo --write-spec` writes it; `deploy` renders its replicas and alerts on
    its SLO and traffic). Never part of a spec identity: it changes no artifact."""

    model_config = _Strict

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="serving replicas (each tp x pp GPUs; with disagg, "
                                                                    "units)")
    ttft_ms: float = Field(gt=0, le=MAX_SLO_MS, description="SLO: time to first token, ms")
    tpot_ms: float = Field(gt=0, le=MAX_SLO_MS, description="SLO: time per output token, ms")
    traffic: PlannedTraffic
    estimate: PlannedEstimate | None = None
    disagg: DisaggTarget | None = None  # None: aggregated replicas


@dataclass(frozen=True)
class AutoPrecision:
    """`precision: auto`: the candidates `build` calibrates, most precise first (each cheaper in memory than the one
    before; a cheaper one is tried only while the one before passes the quality gate), and those the spec's rules
    refuse, with why."""

    candidates: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()


def auto_ladder(gpu: str) -> tuple[str, ...]:
    """The precisions `auto` tries on `gpu`, in order: FP8 then INT4-AWQ; INT8-SQ instead of FP8 without FP8."""
    return ("fp8", "int4_awq") if GPUS[gpu].has_fp8 else ("int8_sq", "int4_awq")


class SpecNotes(BaseModel):
    """What resolving a request said about its spec, apart from the recipe: never an artifact factor, never dumped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warnings: tuple[str, ...] = ()
    # engine limits the user left unset -> why they have their value (pipeline.planning.limits_choice)
    limit_reasons: dict[str, str] = Field(default_factory=dict)
    # TP the user left unset -> why it has its value (pipeline.planning.placement_choice)
    placement_reason: str | None = None
    # `precision: auto` before `build` chooses: `quantization.precision` holds the first candidate meanwhile, and the
    # spec has no identity (nothing is named after a precision not chosen yet)
    auto_precision: AutoPrecision | None = None


class BuildSpec(BaseModel):
    """A whole, resolved build, frozen: `model`/`draft_model` are registry entries, the sections the recipe and
    `notes` what resolving it said (a changed spec is a copy: `model_copy`, `with_notes`, `with_precision`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelEntry
    draft_model: ModelEntry | None = None
    target: Target = "trtllm"
    runtime: Runtime = Field(
        "engine", description="TensorRT-LLM runtime: engine (trtllm-build engines, TensorRT backend) or pytorch "
        "(a ModelOpt-quantized Hugging Face checkpoint on the PyTorch backend / LLM API)",
    )
    quantization: QuantizationSpec = QuantizationSpec()
    parallelism: ParallelSpec = ParallelSpec()
    limits: EngineLimits = EngineLimits()
    speculation: SpeculationSpec = SpeculationSpec()
    serving: ServingSpec = ServingSpec()
    hardware: HardwareSpec = HardwareSpec()
    models_file: str | None = None
    notes: SpecNotes = Field(default_factory=SpecNotes, exclude=True)
    serving_target: ServingTarget | None = None  # SLO, traffic and replicas (`plan --slo`); no artifact factor

    @property
    def warnings(self) -> list[str]:
        return list(self.notes.warnings)

    @property
    def limit_reasons(self) -> dict[str, str]:
        return dict(self.notes.limit_reasons)

    @property
    def placement_reason(self) -> str | None:
        return self.notes.placement_reason

    @property
    def auto_precision(self) -> AutoPrecision | None:
        return self.notes.auto_precision

    def with_notes(self, **changes: Any) -> BuildSpec:
        """A copy whose notes have `changes` (SpecNotes fields; `warnings` as any sequence)."""
        if "warnings" in changes:
            changes["warnings"] = tuple(changes["warnings"])
        return self.model_copy(update={"notes": self.notes.model_copy(update=changes)})

    @model_validator(mode="after")
    def _coherent(self, info: ValidationInfo) -> BuildSpec:
        """Every coherence rule (`spec_rules.validate_spec`): the first violation raises `SpecError`. Its warnings go
        to the validation context's `warnings` list where the caller collects them (`revised`); a context with
        `unchecked` skips the rules (a spec resolved with `validate=False`)."""
        context = info.context if isinstance(info.context, dict) else {}
        if not context.get(UNCHECKED):
            found = validate_spec(self)
            if isinstance(context.get(WARNINGS), list):
                context[WARNINGS][:] = found
        return self

    def revised(self, *, checked: bool = True, **update: Any) -> BuildSpec:
        """A copy with `update` (BuildSpec fields), validated again: by every rule (its warnings replace
        `notes.warnings`) unless `checked` is False.

        Raises:
            SpecError: an updated field has a bad value, or a rule refuses the revised spec.
        """
        data = {name: getattr(self, name) for name in self.model_fields_set} | update
        return _validated(data, checked=checked)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get(SERVING_TARGET) is None:
            data.pop(SERVING_TARGET, None)  # a spec without one dumps (and releases) as before
        return data

    # Resolved values (defaults filled from the registry). -------------------------------------------------------
    @property
    def max_batch_size(self) -> int:
        """limits.max_batch_size, defaulting to the registry model's value."""
        return self.limits.max_batch_size or self.model.limits.max_batch_size

    @property
    def max_input_len(self) -> int:
        """limits.max_input_len, defaulting to the registry model's value."""
        return self.limits.max_input_len or self.model.limits.max_input_len

    @property
    def max_seq_len(self) -> int:
        """limits.max_seq_len, defaulting to the registry model's value."""
        return self.limits.max_seq_len or self.model.limits.max_seq_len

    @property
    def calib_size(self) -> int:
        """quantization.calib_size, defaulting to the registry model's value."""
        return self.quantization.calib_size or self.model.calibration.calib_size

    @property
    def calib_seq_len(self) -> int:
        """quantization.calib_seq_len, defaulting to the registry model's value."""
        return self.quantization.calib_seq_len or self.model.calibration.calib_seq_len

    @property
    def max_ppl_delta_pct(self) -> float:
        """quantization.max_ppl_delta_pct, defaulting to the registry model's value."""
        return self.quantization.max_ppl_delta_pct or self.model.calibration.max_ppl_delta_pct

    @property
    def draft_len(self) -> int:
        """Tokens proposed per step (K): the spec's, else the target's registry default; 0 without speculation."""
        if self.speculation_mode is None:
            return 0
        k = self.speculation.draft_len
        if k is not None:
            return k
        head = self.draft_model if self.speculation_mode == EAGLE3 else None
        return (head or self.model).default_draft_len  # an EAGLE-3 head's own (upstream's examples use 3-4)

    @property
    def speculation_mode(self) -> str | None:
        """The named mode; unnamed: eagle3 with an EAGLE-3 head, draft-target with a draft model, else None."""
        mode = self.speculation.speculative_decoding
        if mode or self.draft_model is None:
            return mode
        return EAGLE3 if self.draft_model.is_eagle3_head else DRAFT_TARGET

    @property
    def quantized_draft(self) -> ModelEntry | None:
        """The draft model that is calibrated, exported and built like the target (draft-target); None in the other
        modes: an EAGLE-3 head is served as downloaded, in its own dtype."""
        return self.draft_model if self.speculation_mode == DRAFT_TARGET else None

    @property
    def ngram_size(self) -> int:
        """ngram's max_matching_ngram_size (0 in another mode)."""
        if self.speculation_mode != NGRAM:
            return 0
        return self.speculation.max_matching_ngram_size or NGRAM_MATCH_DEFAULT

    @property
    def draft_precision(self) -> str:
        return self.speculation.draft_precision or self.quantization.precision

    def compute_dtype_of(self, role: str) -> str:
        """The compute dtype of the target's or the draft's precision (each model is calibrated, exported and built
        in its own precision's dtype: `trtllm_rules.COMPUTE_DTYPE`)."""
        return precision_compute_dtype(self.draft_precision if role == "draft" else self.quantization.precision)

    @property
    def base_max_num_tokens(self) -> int:
        """The spec's tokens per engine step before any engine-specific floor (default max(8192, max_input_len))."""
        return self.limits.max_num_tokens or max(8192, self.max_input_len)

    @property
    def max_num_tokens(self) -> int:
        """Tokens per engine step: at least one full prompt and every sequence's K+1 speculative tokens."""
        floor = self.max_batch_size * (self.draft_len + 1)
        return max(self.base_max_num_tokens, floor)

    # The draft engine (resolved; meaningful only with a draft model). ------------------------------------------
    @property
    def draft_tp(self) -> int:
        return self.speculation.draft_tp

    @property
    def draft_max_batch_size(self) -> int:
        """The draft's engine batch: it never needs more than the batch speculation is served at."""
        s = self.speculation
        return s.draft_max_batch_size or min(s.max_batch_for_speculation, self.max_batch_size)

    @property
    def draft_max_seq_len(self) -> int:
        """The draft drafts K tokens past any sequence the target holds (S + K; the target's engine records S + K)."""
        return self.max_seq_len + self.draft_len

    @property
    def target_gpu_device_ids(self) -> list[int]:
        """GPUs of the target engine's TP×PP ranks: the host's first tp×pp."""
        return list(range(self.parallelism.world_size))

    @property
    def draft_gpu_device_ids(self) -> list[int]:
        """GPUs of the draft engine, one per draft TP rank; default: co-located on the target's first draft_tp GPUs
        (upstream draft_target_model README: one GPU for both performs better than two)."""
        ids = self.speculation.draft_gpu_device_ids
        return list(ids) if ids is not None else list(range(self.draft_tp))

    @property
    def draft_participant_ids(self) -> list[int]:
        """MPI ranks of the draft in orchestrator mode without spawned processes (upstream README, fast logits:
        rank 0 is the orchestrator, then the draft's ranks, then the target's)."""
        return list(range(1, 1 + self.draft_tp))

    @property
    def target_participant_ids(self) -> list[int]:
        first = 1 + self.draft_tp if self.draft_model else 1
        return list(range(first, first + self.parallelism.world_size))

    @property
    def draft_max_tokens_in_paged_kv_cache(self) -> int:
        """KV tokens the draft needs: its max batch × one full (S + K) sequence, in whole blocks."""
        block = self.limits.tokens_per_block
        return self.draft_max_batch_size * (-(-self.draft_max_seq_len // block) * block)

    def summary(self) -> str:
        """One line describing the resolved spec."""
        q = self.quantization
        parts = [
            f"{self.model.name} ({self.model.repo_id}@{self.model.revision})",
            f"precision=auto({'>'.join(self.auto_precision.candidates)}) kv={q.kv_cache or 'per candidate'}"
            if self.auto_precision else f"precision={q.precision} kv={q.kv}",
            f"tp={self.parallelism.tp} pp={self.parallelism.pp}"
            + (f" moe_tp={self.parallelism.moe_tp_size} moe_ep={self.parallelism.moe_ep_size}"
               if self.model.architecture.is_moe else ""),
            f"gpu={self.hardware.gpu}",
            f"batch={self.max_batch_size} input={self.max_input_len} seq={self.max_seq_len}",
            f"target={self.target}",
        ]
        if "runtime" in self.model_dump(include={"runtime"}, exclude_defaults=True):
            parts.append(f"runtime={self.runtime}")  # only a runtime other than the default
        if self.speculation_mode == EAGLE3 and self.draft_model:
            parts.append(f"speculation=eagle3 head={self.draft_model.name} K={self.draft_len} (its own dtype)")
        elif self.draft_model:
            parts.append(f"draft={self.draft_model.name} K={self.draft_len} ({self.draft_precision}) "
                         f"draft_tp={self.draft_tp} draft_batch={self.draft_max_batch_size} "
                         f"draft_gpus={','.join(map(str, self.draft_gpu_device_ids))}")
        elif self.speculation_mode == NGRAM:
            parts.append(f"speculation=ngram K={self.draft_len} match<={self.ngram_size}")
        parts.append(f"kv_reuse={'on' if self.serving.enable_kv_cache_reuse else 'off'}")
        return "ok: " + " ".join(parts)

    def hash_factors(self, stage: str) -> dict[str, Any]:
        """What names `stage`'s output (`STAGE_FACTORS`): each section's factors (its `IGNORED` fields left out),
        the registry entries themselves (not the file they came from) and the target/runtime where they count.

        Raises:
            SpecError: `precision: auto` not chosen yet (`with_precision`), or an unknown stage.
        """
        if self.auto_precision is not None:
            raise SpecError("precision=auto names no artifact until `invoke build` has chosen one; pass "
                            f"--precision {' or '.join(self.auto_precision.candidates)} for this command")
        try:
            names = STAGE_FACTORS[stage]
        except KeyError:
            raise SpecError(f"no stage {stage!r} has spec hash factors; stages: {', '.join(STAGE_FACTORS)}") from None
        out: dict[str, Any] = {"stage": stage}
        for name in names:
            value = getattr(self, name)
            out[name] = value.hash_factors() if isinstance(value, _Section) else \
                value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        return out

    def identity(self, stage: str = "package") -> str:
        """sha256 of `hash_factors(stage)`: the spec's identity for `stage`, which names its output slot (the build
        ref), the Triton repository and the release (`stage="package"`: every artifact-defining factor). GPU price,
        node count, memory fractions and the models-file path never change it."""
        return _sha256(self.hash_factors(stage))

    def with_precision(self, precision: str) -> BuildSpec:
        """A copy at `precision` (no longer `auto`), checked by the intrinsic rules (its warnings replace these).

        Raises:
            SpecError: a rule refuses `precision` for this spec.
        """
        quant = self.quantization.model_copy(update={"precision": precision})
        QuantizationSpec.model_validate(quant.model_dump())  # a precision name pydantic accepts
        return self.revised(quantization=quant, notes=self.notes.model_copy(update={"auto_precision": None}))


# The spec factors each stage's output depends on (later stages add to earlier ones). Never part of any:
# `models_file` (the registry entries are hashed, not the file's path) and `warnings`.
_CALIBRATE_FACTORS = ("model", "draft_model", "runtime", "quantization", "parallelism", "speculation")
_COMPILE_FACTORS = (*_CALIBRATE_FACTORS, "limits", "hardware")
STAGE_FACTORS: dict[str, tuple[str, ...]] = {
    "calibrate": _CALIBRATE_FACTORS,
    "compile": _COMPILE_FACTORS,
    "package": (*_COMPILE_FACTORS, "serving", "target"),
}


# ----------------------------------------------------------------------------------------------------------------
# Resolution: YAML file + flat overrides (CLI flags) -> BuildSpec.

SECTIONS: dict[str, type[BaseModel]] = {
    "quantization": QuantizationSpec,
    "parallelism": ParallelSpec,
    "limits": EngineLimits,
    "speculation": SpeculationSpec,
    "serving": ServingSpec,
    "hardware": HardwareSpec,
}


TOP_LEVEL = ("model", "target", "runtime", "models_file")
MAX_SPEC_BYTES = 1 << 20  # a spec file is a few hundred bytes
SERVING_TARGET = "serving_target"  # a spec file's section that is no build recipe (`ServingTarget`)


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """The spec file's mapping, its scalar types checked as written (`tp: true` is not 1, `tp: "4"` not 4)."""
    p = Path(path)
    raw = load_yaml_mapping(p, what="spec file", flag="--spec", cap=MAX_SPEC_BYTES, error=SpecError,
                            shape=" (model:, quantization:, parallelism:, ...)")
    unknown = set(raw) - set(SECTIONS) - set(TOP_LEVEL) - {SERVING_TARGET}
    if unknown:
        valid = ", ".join([*TOP_LEVEL, *SECTIONS, SERVING_TARGET])
        raise SpecError(f"spec file {p}: unknown key(s) {', '.join(map(str, sorted(unknown, key=str)))}; "
                        f"valid keys: {valid}")
    for key in TOP_LEVEL:
        if key in raw and not isinstance(raw[key], str):
            raise SpecError(f"spec file {p}: {key}={raw[key]!r}: expected a string")
    sections: dict[str, type[BaseModel]] = {**SECTIONS, SERVING_TARGET: ServingTarget}
    for section, cls in sections.items():
        if section not in raw:
            continue
        if not isinstance(raw[section], dict):
            raise SpecError(f"spec file {p}: '{section}' must be a mapping of its fields")
        fields = {k: v for k, v in raw[section].items() if not (section == "quantization" and k == "precision"
                                                                  and v == AUTO)}
        try:
            cls.model_validate(fields, strict=True)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in (section, *err["loc"]))
            given = "" if err["type"] == "missing" else f"={_shown(err.get('input'))}"
            raise SpecError(f"spec file {p}: {loc}{given}: {err['msg']}") from None
    return raw


def _field_section(name: str) -> str | None:
    for section, cls in SECTIONS.items():
        if name in cls.model_fields:
            return section
    return None


def _shown(value: Any) -> str:
    """`repr(value)`, cut to about 40 characters (a 5,000-digit flag value stays one short line)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "...(long)"


def _pydantic_error(exc: ValidationError) -> SpecError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return SpecError(f"{loc}={_shown(err.get('input'))}: {err['msg']}")


UNCHECKED = "unchecked"  # validation-context keys of `BuildSpec._coherent`
WARNINGS = "warnings"


def _validated(data: Mapping[str, Any], *, checked: bool) -> BuildSpec:
    """`BuildSpec` validated from `data`: field types always, the coherence rules when `checked` (their warnings in
    `notes.warnings`)."""
    context: dict[str, Any] = {UNCHECKED: not checked, WARNINGS: []}
    try:
        spec = BuildSpec.model_validate(data, context=context)
    except ValidationError as exc:
        raise _pydantic_error(exc) from None
    return spec.with_notes(warnings=context[WARNINGS]) if checked else spec


def resolve_spec(
    *,
    spec_file: str | Path | None = None,
    spec_data: Mapping[str, Any] | None = None,
    models_file: str | Path | None = None,
    validate: bool = True,
    **overrides: Any,
) -> BuildSpec:
    """Build and validate a spec from an optional YAML file (or its mapping as `load_spec_file` returned it, so a
    file is read and checked once however often its spec is resolved) and flat overrides (None values are ignored).

    Overrides use field names of the sections (`precision`, `tp`, `draft`, `gpu`, ...) plus `model`, `target`
    and `runtime`.

    Raises:
        SpecError: a field has a bad value, a model is unknown, or a coherence rule is violated.
    """
    data: dict[str, Any] = (copy.deepcopy(dict(spec_data)) if spec_data is not None
                            else load_spec_file(spec_file) if spec_file else {})
    models_file = overrides.pop("models_file", None) or models_file or data.get("models_file")
    for key, value in overrides.items():
        if value is None:
            continue
        if key in ("model", "target", "runtime"):
            data[key] = value
            continue
        section = _field_section(key)
        if section is None:
            raise SpecError(f"unknown spec option '{key}'")
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise SpecError(f"spec section '{section}' must be a mapping")
        data[section][key] = value
    auto = isinstance(data.get("quantization"), dict) and data["quantization"].get("precision") == AUTO
    if auto:
        data["quantization"] = {k: v for k, v in data["quantization"].items() if k != "precision"}
    model_name = data.pop("model", None)
    if not model_name:
        raise SpecError("no model given; pass --model NAME (see `invoke check --help` or pipeline/models.yaml)")
    if not isinstance(model_name, str):
        raise SpecError(f"model must be a registry name, got {model_name!r}")
    entry = get_model(model_name, models_file=models_file)
    fields: dict[str, Any] = {k: v for k, v in data.items() if k != "models_file"}
    fields["model"] = entry
    if models_file:
        fields["models_file"] = str(models_file)
    draft = _draft_entry(entry, data.get("speculation"), models_file)
    if draft is not None:
        fields["draft_model"] = draft
    spec = _validated(fields, checked=validate and not auto)
    if auto:
        spec = _auto_precision(spec, validate=validate)
    if validate and spec.draft_model is not None:
        check_hub_tokenizers(spec.model, spec.draft_model)  # the one rule that reads the Hub, after the rules
    return spec


def spec_from_document(data: Any) -> BuildSpec:
    """A spec read back from its dump (a release's or a deploy source's `spec`): a dump sets every field, so it is
    parsed first and then validated, by the rules too, with only its non-default values given.

    Raises:
        pydantic.ValidationError: a field of the document is not a spec field or has a bad value.
        SpecError: a rule refuses the recorded spec.
    """
    parsed = BuildSpec.model_validate(data, context={UNCHECKED: True})
    return BuildSpec.model_validate(parsed.model_dump(mode="json", exclude_defaults=True))


def _draft_entry(entry: ModelEntry, speculation: Any, models_file: str | Path | None) -> ModelEntry | None:
    """The registry entry of `speculation.draft` ('auto': the model's default draft), None without one (a draft that is
    no string is left to the field's validation)."""
    draft = speculation.get("draft") if isinstance(speculation, dict) else None
    if not draft or not isinstance(draft, str):
        return None
    if draft == AUTO and isinstance(speculation, dict) and speculation.get("speculative_decoding") == EAGLE3:
        heads = eagle3_heads(entry.name, models_file=models_file)
        if not heads:
            raise SpecError(f"speculation.draft='auto' with eagle3: no EAGLE-3 head in the registry is trained for "
                            f"'{entry.name}'; add one (an entry with `eagle3: {{target: {entry.name}, ...}}`) or use "
                            "--speculative-decoding draft-target|ngram")
        return heads[0]
    name = entry.default_draft if draft == AUTO else draft
    if not name:
        raise SpecError(f"speculation.draft='auto': model '{entry.name}' has no default_draft; name a draft model")
    return get_model(name, models_file=models_file)


def _auto_precision(spec: BuildSpec, *, validate: bool) -> BuildSpec:
    """`spec` with `auto_precision` set: the ladder's candidates the rules allow (the first one standing in as its
    precision until `build` chooses), those they refuse with why.

    Raises:
        SpecError: the rules refuse every candidate (naming each reason).
    """
    allowed, refused = [], []
    for precision in auto_ladder(spec.hardware.gpu):
        try:
            spec.with_precision(precision) if validate else None
            allowed.append(precision)
        except SpecError as exc:
            refused.append((precision, str(exc)))
    if not allowed:
        raise SpecError("precision=auto: no candidate fits this spec: "
                        + "; ".join(f"{p}: {why}" for p, why in refused))
    first = spec.with_precision(allowed[0]) if validate else spec.revised(
        checked=False, quantization=spec.quantization.model_copy(update={"precision": allowed[0]}))
    return first.with_notes(auto_precision=AutoPrecision(tuple(allowed), tuple(refused)))
