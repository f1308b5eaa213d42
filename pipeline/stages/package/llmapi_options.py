"""The subset of TensorRT-LLM 1.2.1 `LlmArgs` this pipeline sets, as strict pydantic models, and the YAML we write.

Field names and accepted values are those of `tensorrt_llm/llmapi/llm_args.py` (1.2.x): `BaseLlmArgs`
(`tensor_parallel_size`, `pipeline_parallel_size`, `max_batch_size`, `max_num_tokens`, `max_seq_len`),
`TorchLlmArgs.enable_chunked_prefill` / `disable_overlap_scheduler`, `KvCacheConfig`, `DraftTargetDecodingConfig`,
`EagleDecodingConfig` and `NGramDecodingConfig` (built from YAML through `DecodingBaseConfig.from_dict`, whose keys
for them are "DraftTarget", "Eagle" and "NGram"). The same YAML feeds
`trtllm-serve --extra_llm_api_options` and the Triton `llmapi` model's `model.yaml`. Unknown keys are refused
here as `LlmArgs` (a `StrictBaseModel`, extra="forbid") refuses them there.

An engine served by `trtllm-serve --backend tensorrt` takes a smaller YAML (`EngineServeOptions`): the engine fixes
batch, sequence lengths, TP/PP and the KV dtype, so only the runtime KV-cache settings and chunked prefill remain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.errors import SpecError
from pipeline.core.spec import EAGLE3, MAX_SPEC_BYTES, BuildSpec
from pipeline.core.untrusted import load_yaml_mapping

_Strict = ConfigDict(extra="forbid", allow_inf_nan=False)

# kv_cache_config.dtype values the 1.2.1 PyTorch backend accepts (`_torch/pyexecutor/_util.py`
# `_VALID_KV_CACHE_DTYPES`, plus "nvfp4" which we never write); "auto" keeps the checkpoint's own KV quantization.
KV_DTYPE = {"fp8": "fp8", "bf16": "auto", "fp16": "auto"}


class KvCacheConfig(BaseModel):
    """`kv_cache_config` (1.2.1 `KvCacheConfig`; `dtype` is a PyTorch-backend-only field there)."""

    model_config = _Strict

    dtype: Literal["auto", "fp8"] = Field("auto", description="KV-cache dtype; auto: the checkpoint's")
    enable_block_reuse: bool = Field(True, description="reuse KV blocks across requests (prefix caching)")
    free_gpu_memory_fraction: float = Field(0.9, gt=0, le=1, description="share of free GPU memory for the KV pool")


# The speculative-config spellings of TensorRT-LLM 1.2.x, read from `tensorrt_llm/llmapi/llm_args.py` as rendered
# in the 1.2.0 documentation (gh-pages `1.2.0/_modules/tensorrt_llm/llmapi/llm_args.html`, generated from commit
# dbdb13b; transcribed in ../shared/upstream-trtllm-1.2/llm_args_fields.md — no .py copy of a 1.2.x tag is stored
# in the code index, and 1.2.1 is the patch release of that line):
# - a YAML/dict `speculative_config` goes through `DecodingBaseConfig.from_dict` (via
#   `llm_utils.update_llm_args_with_extra_dict`), whose dispatch table has exactly these `decoding_type` keys; any
#   other raises "Invalid decoding type". Draft-target is "DraftTarget" there; the class's own
#   `decoding_type: ClassVar[str] = "Draft_Target"` is not an input (the YAML spelling "Draft_Target" arrives later,
#   with a `Literal` field per class, and is refused by 1.2.x).
# - the draft model: field `speculative_model`, `validation_alias=AliasChoices("speculative_model",
#   "speculative_model_dir")` — both input names are accepted; we write `speculative_model_dir`, which 1.1's field
#   of that name and every 1.2.x alias take.
FROM_DICT_DECODING_TYPES = ("MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "SaveState",
                            "UserProvided", "AUTO")
DRAFT_TARGET_DECODING_TYPE: Final = "DraftTarget"
SPECULATIVE_MODEL_INPUT_NAMES = ("speculative_model", "speculative_model_dir")


class DraftTargetConfig(BaseModel):
    """`speculative_config` for two-model draft-target speculation (1.2.1 `DraftTargetDecodingConfig`), in the
    spellings of the table above."""

    model_config = _Strict

    decoding_type: Literal["DraftTarget"] = DRAFT_TARGET_DECODING_TYPE
    max_draft_len: int = Field(..., ge=1, description="draft tokens proposed per step (K)")
    speculative_model_dir: str = Field(..., min_length=1, description="the draft's Hugging Face checkpoint")
    max_concurrency: int | None = Field(
        None, ge=1, description="PyTorch only: speculation is disabled at batch sizes above this value"
    )


NGRAM_DECODING_TYPE: Final = "NGram"


class NGramConfig(BaseModel):
    """`speculative_config` for n-gram (prompt lookup) speculation (1.2.1 `NGramDecodingConfig`, PyTorch backend
    only): drafts are the tokens that followed an earlier match of the request's last `max_matching_ngram_size`
    tokens. `is_keep_all`, `is_use_oldest` and `is_public_pool` keep upstream's defaults (True) and are not
    written."""

    model_config = _Strict

    decoding_type: Literal["NGram"] = NGRAM_DECODING_TYPE
    max_draft_len: int = Field(..., ge=1, description="draft tokens proposed per step (K)")
    # 1.2.0 declares 0 and asserts > 0 (TorchLlmArgs.validate_speculative_config): always written
    max_matching_ngram_size: int = Field(..., ge=1, description="longest suffix matched against earlier tokens")
    max_concurrency: int | None = Field(
        None, ge=1, description="PyTorch only: speculation is disabled at batch sizes above this value"
    )


EAGLE_DECODING_TYPE: Final = "Eagle"


class EagleConfig(BaseModel):
    """`speculative_config` for EAGLE-3 (1.2.1 `EagleDecodingConfig` on the PyTorch backend; `from_dict`'s key is
    "Eagle": there is no "Eagle3" key, and a head loads as EAGLE-3 because its config.json has `draft_vocab_size`).
    `max_draft_len` is required (`validate_eagle_config`), the head directory too ("EAGLE3 draft model must be
    specified"); `eagle3_one_model` keeps upstream's default (True: the head runs inside the target's engine, in its
    KV pool) and is not written; `eagle3_layers_to_capture` only when the head's registry entry names the target
    layers it was trained on (else upstream's default `(1, L/2 - 1, L - 4)`)."""

    model_config = _Strict

    decoding_type: Literal["Eagle"] = EAGLE_DECODING_TYPE
    max_draft_len: int = Field(..., ge=1, description="draft tokens proposed per step (K), a linear chain")
    speculative_model_dir: str = Field(..., min_length=1, description="the EAGLE-3 head's directory")
    eagle3_layers_to_capture: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="target layers whose outputs the head reads (default: upstream's three)")
    max_concurrency: int | None = Field(
        None, ge=1, description="PyTorch only: speculation is disabled at batch sizes above this value"
    )


SpeculativeConfig = Annotated[DraftTargetConfig | EagleConfig | NGramConfig, Field(discriminator="decoding_type")]


class LlmApiOptions(BaseModel):
    """The extra LLM-API options of one build (`trtllm-serve --extra_llm_api_options`, `model.yaml`)."""

    model_config = _Strict

    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    # MoE models (BaseLlmArgs moe_expert_parallel_size / moe_tensor_parallel_size; unset for dense models)
    moe_expert_parallel_size: int | None = Field(None, ge=1)
    moe_tensor_parallel_size: int | None = Field(None, ge=1)
    max_batch_size: int = Field(..., ge=1)
    max_num_tokens: int = Field(..., ge=1)
    max_seq_len: int = Field(..., ge=1)
    enable_chunked_prefill: bool = False
    kv_cache_config: KvCacheConfig = KvCacheConfig()
    # n-gram: the PyTorch executor turns the overlap scheduler off for it anyway (py_executor_creator.py:
    # `support_overlap_scheduler()` is False for NGRAM); written as upstream's n-gram examples do
    disable_overlap_scheduler: bool | None = None
    speculative_config: SpeculativeConfig | None = None

    def as_dict(self) -> dict[str, Any]:
        """The options as upstream reads them (unset speculation and max_concurrency left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.as_dict(), sort_keys=False)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, what: str) -> LlmApiOptions:
        """Validate a mapping (e.g. a loaded YAML); `SpecError` with one line naming the key otherwise."""
        try:
            return cls.model_validate(data, strict=True)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            given = err.get("input")
            if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # the speculative config's own key
                loc, given = f"{loc}.decoding_type", (err.get("ctx") or {}).get("tag")
            raise SpecError(f"{what}: {loc}={given!r}: {err['msg']}; fix the LLM-API options") from None

    @classmethod
    def read(cls, path: str | Path) -> LlmApiOptions:
        """Load and validate an extra-options YAML file."""
        data = load_yaml_mapping(path, what="LLM-API options file", flag="--extra-llm-api-options",
                                 cap=MAX_SPEC_BYTES, error=SpecError)
        return cls.from_mapping(data, what=str(path))


def llm_api_options(spec: BuildSpec, *, draft_dir: Path | str | None) -> LlmApiOptions:
    """The LLM-API options of `spec` on the PyTorch backend; `draft_dir`: where the draft's HF checkpoint (or the
    EAGLE-3 head's directory) is when served (required exactly when the spec has one). No `sampler_type` is written:
    TensorRT-LLM 1.2.1 refuses TRTLLMSampler with EAGLE-3 ("Please use sampler type auto")."""
    if (spec.draft_model is not None) != (draft_dir is not None):
        head = spec.speculation_mode == EAGLE3
        need = ("no draft directory (the spec has no draft)" if spec.draft_model is None
                else "the EAGLE-3 head's directory" if head else "the draft's checkpoint directory")
        raise SpecError(f"llm_api_options: spec {spec.model.name} needs {need}")
    # a draft model beside the target has its own KV pool on the GPU; an EAGLE-3 head (one-model) has its layer in
    # the target's pool
    speculative = spec.quantized_draft is not None
    kv_dtype = KV_DTYPE.get(spec.quantization.kv)
    if kv_dtype is None:
        raise SpecError(f"quantization.kv_cache={spec.quantization.kv}: the PyTorch backend's KV cache is fp8 or the "
                        "compute dtype; use --kv-cache fp8 or bf16")
    s = spec.serving
    kv = KvCacheConfig(
        dtype=kv_dtype,
        enable_block_reuse=s.enable_kv_cache_reuse,
        free_gpu_memory_fraction=s.target_fraction(speculative),
    )
    draft: DraftTargetConfig | EagleConfig | NGramConfig | None = None
    if speculative:
        draft = DraftTargetConfig(max_draft_len=spec.draft_len, speculative_model_dir=str(draft_dir),
                                  max_concurrency=spec.speculation.max_batch_for_speculation)
    elif spec.speculation_mode == EAGLE3 and spec.draft_model is not None and spec.draft_model.eagle3 is not None:
        capture = spec.draft_model.eagle3.capture_layers
        draft = EagleConfig(max_draft_len=spec.draft_len, speculative_model_dir=str(draft_dir),
                            eagle3_layers_to_capture=list(capture) if capture is not None else None,
                            max_concurrency=spec.speculation.max_batch_for_speculation)
    elif spec.speculation_mode == "ngram":
        draft = NGramConfig(max_draft_len=spec.draft_len, max_matching_ngram_size=spec.ngram_size,
                            max_concurrency=spec.speculation.max_batch_for_speculation)
    return LlmApiOptions(
        tensor_parallel_size=spec.parallelism.tp,
        pipeline_parallel_size=spec.parallelism.pp,
        **({"moe_expert_parallel_size": spec.parallelism.moe_ep_size,
            "moe_tensor_parallel_size": spec.parallelism.moe_tp_size} if spec.model.architecture.is_moe else {}),
        max_batch_size=spec.max_batch_size,
        max_num_tokens=spec.max_num_tokens,
        max_seq_len=spec.max_seq_len,
        enable_chunked_prefill=s.enable_chunked_context,
        kv_cache_config=kv,
        disable_overlap_scheduler=True if isinstance(draft, NGramConfig) else None,
        speculative_config=draft,
    )


class EngineServeOptions(BaseModel):
    """The extra LLM-API options of an engine under `trtllm-serve --backend tensorrt` (1.2.1 `TrtLlmArgs`)."""

    model_config = _Strict

    kv_cache_config: KvCacheConfig
    enable_chunked_prefill: bool

    def as_dict(self) -> dict[str, Any]:
        """The options as upstream reads them; the KV dtype is the engine's, so `dtype` is left out."""
        return self.model_dump(mode="json", exclude={"kv_cache_config": {"dtype"}})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.as_dict(), sort_keys=False)


def engine_serve_options(spec: BuildSpec) -> EngineServeOptions:
    """The runtime options of `spec`'s target engine: the spec's KV pool share, KV reuse and chunked prefill (the spec
    rules already refuse those two where the engine would lack paged context FMHA)."""
    s = spec.serving
    kv = KvCacheConfig(enable_block_reuse=s.enable_kv_cache_reuse, free_gpu_memory_fraction=s.target_fraction(False))
    return EngineServeOptions(kv_cache_config=kv, enable_chunked_prefill=s.enable_chunked_context)
