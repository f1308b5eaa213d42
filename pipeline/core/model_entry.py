"""A model entry's types: the Hub repo id rule, the architecture numbers (typed and bounded, from a registry entry
or a Hub `config.json`) and the entry itself; `pipeline.core.registry` loads entries, `pipeline.core.hub_entry`
builds one from the Hub."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeGuard

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from pipeline.core.architectures import (
    FAMILIES,
    HF_KEYS,
    UnusableConfigField,
    architecture_fields,
    hf_config_fields,
)
from pipeline.core.artifacts import SAFE_NAME

# A Hugging Face Hub repo id, 'org/name' or 'name' (huggingface_hub's rule: no '--' or '..', at most 96 characters).
REPO_ID = re.compile(r"^(?=.{1,96}$)[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def check_repo_id(value: str) -> str:
    """`value` if it is a Hub repo id (one cache directory per id: 'org/name' maps to 'org--name').

    Raises:
        ValueError: it is not; the message says what is allowed.
    """
    if not REPO_ID.match(value) or ".." in value or "--" in value:
        raise ValueError(f"{value!r} is not a Hub repo id: 'org/name' or 'name' of letters, digits and . _ - "
                         "(at most 96 characters, no '--' or '..')")
    return value



# Fields added for families beyond Llama: left out of a dump at their defaults, so every Llama entry (and every
# cache key hashed from one) is what it was before they existed.
_FAMILY_DEFAULTS = {"family": "llama", "num_experts": 0, "experts_per_token": 0, "sliding_window": None}


# Upper bounds of the architecture numbers: generous but finite, each far above every open model (Llama 3.1 405B:
# 126 layers, hidden 16384, 128 heads, FFN 53248; vocab up to ~262k (Gemma 3); max positions up to ~10M (Llama 4
# Scout); experts up to 384 (Kimi K2)), so a typo or a corrupt config.json is refused instead of planned.
MAX_LAYERS = 1024
MAX_HIDDEN = 1 << 17
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_INTERMEDIATE = 1 << 20
MAX_VOCAB = 1 << 22
MAX_POSITIONS = 1 << 27
MAX_EXPERTS = 4096
MAX_ROPE_THETA = 1e12  # the largest in use is ~1e8
MAX_DRAFT_LEN = 64  # draft tokens per step: 4-10 in common use (examples/draft_target_model/README.md)
MAX_BATCH = 1 << 16  # engine max batch size: TensorRT-LLM builds in practice use <= 2048


def _count(value: object, most: int) -> TypeGuard[int]:
    """Whether `value` is an integer (not a bool) within 1..`most`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= most


class Architecture(BaseModel):
    """Architecture numbers of a decoder of one family (`pipeline.core.architectures`), cross-checked against the
    downloaded config.json; every count is within the `MAX_*` bounds above, `rope_theta` a finite positive number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    family: Literal["llama", "mistral", "mixtral", "qwen2", "qwen3"] = "llama"
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: int = Field(gt=0, le=MAX_HIDDEN)
    num_heads: int = Field(gt=0, le=MAX_HEADS)
    num_kv_heads: int = Field(gt=0, le=MAX_HEADS)
    head_dim: int = Field(gt=0, le=MAX_HEAD_DIM)
    intermediate_size: int = Field(gt=0, le=MAX_INTERMEDIATE)  # per expert for MoE families
    vocab_size: int = Field(gt=0, le=MAX_VOCAB)
    max_position_embeddings: int = Field(gt=0, le=MAX_POSITIONS)
    tie_word_embeddings: bool = False
    rope_theta: float = Field(10000.0, gt=0, le=MAX_ROPE_THETA)
    num_experts: int = Field(0, ge=0, le=MAX_EXPERTS)  # MoE: experts per layer (HF num_local_experts)
    experts_per_token: int = Field(0, ge=0, le=MAX_EXPERTS)  # MoE: top-k (HF num_experts_per_tok)
    sliding_window: int | None = Field(None, gt=0, le=MAX_POSITIONS)  # attention window, when the model uses one

    @model_validator(mode="before")
    @classmethod
    def _derived_head_dim(cls, data: Any) -> Any:
        """No head_dim (or null): hidden_size / num_heads, transformers' default, once both are counts in range;
        hidden_size must then be a multiple of num_heads."""
        if not isinstance(data, dict) or data.get("head_dim") is not None:
            return data
        hidden, heads = data.get("hidden_size"), data.get("num_heads")
        if not (_count(hidden, MAX_HIDDEN) and _count(heads, MAX_HEADS)):
            return data  # the fields' own errors name them
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_heads {heads} and no head_dim is given")
        return {**data, "head_dim": hidden // heads}

    @model_validator(mode="after")
    def _heads(self) -> Architecture:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        moe = FAMILIES[self.family].moe
        if moe != (self.num_experts > 1) or (self.num_experts == 0) != (self.experts_per_token == 0):
            raise ValueError(f"family {self.family} {'needs' if moe else 'takes no'} num_experts > 1 with "
                             "experts_per_token (both or neither, tensorrt_llm/layers/moe.py MoeConfig.validate)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} exceeds num_experts {self.num_experts}")
        if self.sliding_window is not None and self.sliding_window > self.max_position_embeddings:
            raise ValueError(f"sliding_window {self.sliding_window} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if k not in _FAMILY_DEFAULTS or v != _FAMILY_DEFAULTS[k]}

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def hf_config(self) -> dict[str, Any]:
        """The matching transformers `config.json` fields (the family's class)."""
        return hf_config_fields(self)

    @property
    def attention_params(self) -> int:
        """q/k/v/o projection weights, all layers."""
        h, d = self.hidden_size, self.head_dim
        return self.num_layers * (h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2)

    def _mlp_params(self, experts: int) -> int:
        return self.num_layers * experts * 3 * self.hidden_size * self.intermediate_size

    @property
    def router_params(self) -> int:
        """MoE router (gate) weights: left unquantized by ModelOpt and kept in float by TensorRT-LLM."""
        return self.num_layers * self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def linear_params(self) -> int:
        """Parameters of the quantizable linear layers (attention + MLP / every expert), all layers."""
        return self.attention_params + self._mlp_params(max(1, self.num_experts))

    @property
    def active_linear_params(self) -> int:
        """Quantizable linear parameters one token passes through (MoE: top-k experts of each layer)."""
        return self.attention_params + self._mlp_params(self.experts_per_token or 1)

    def expert_linear_params_touched(self, tokens: float) -> float:
        """Linear parameters a step of `tokens` tokens reads: attention plus the experts that uniform top-k routing
        is expected to select, E x (1 - (1 - k/E)^tokens) of E per layer (all of them for a dense model)."""
        if not self.is_moe:
            return float(self.linear_params)
        e, k = self.num_experts, self.experts_per_token
        experts: float = e * (1 - (1 - k / e) ** max(tokens, 1.0))
        return self.attention_params + experts * self._mlp_params(1)

    @property
    def embedding_params(self) -> int:
        """Embedding plus lm_head parameters (kept in 16-bit by every recipe)."""
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    @property
    def norm_params(self) -> int:
        """Norms, Qwen2's q/k/v biases, Qwen3's per-head q/k norms and the MoE router: small, kept 16-bit+."""
        fam = FAMILIES[self.family]
        extra = self.num_layers * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if fam.attn_bias else 0
        extra += self.num_layers * 2 * self.head_dim if fam.qk_norm else 0
        return (2 * self.num_layers + 1) * self.hidden_size + extra + self.router_params

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embedding_params + self.norm_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses (MoE: top-k experts); equal to total_params for a dense model."""
        return self.total_params - self.linear_params + self.active_linear_params


def hub_architecture(config: dict[str, Any]) -> Architecture:
    """The `Architecture` of a Hub `config.json`, its numbers taken as written: a JSON integer for every count (no
    bool, float or string), a finite positive number for `rope_theta`, each within the `MAX_*` bounds.

    Raises:
        UnsupportedArchitecture: the class is not one of the families.
        UnusableConfigField: a number is missing, of the wrong type or out of range (one line naming the config.json
            field and the value).
    """
    try:
        return Architecture.model_validate(architecture_fields(config), strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a cross-field rule
            raise UnusableConfigField(f"config.json: {msg}") from None
        key = HF_KEYS.get(str(err["loc"][0]), str(err["loc"][0]))
        given = "" if err["type"] == "missing" else f"={err['input']!r}"[:60]
        raise UnusableConfigField(f"config.json field '{key}'{given}: {msg}") from None


class ModelLimits(BaseModel):
    """Per-model default engine limits (bounded as the spec's `EngineLimits` are)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(default=64, gt=0, le=MAX_BATCH)
    max_input_len: int = Field(default=2048, gt=0, le=MAX_POSITIONS)
    max_seq_len: int = Field(default=4096, gt=0, le=MAX_POSITIONS)


class CalibrationDefaults(BaseModel):
    """Per-model calibration defaults (TRT-LLM's quantize script uses 512 samples of 512 tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    calib_size: int = Field(default=512, gt=0, le=1_000_000)
    calib_seq_len: int = Field(default=512, gt=0, le=1_048_576)
    max_ppl_delta_pct: float = Field(default=1.0, gt=0, le=1000)


class Eagle3Head(BaseModel):
    """What makes an entry an EAGLE-3 head: the target it was trained on (its hidden states and tokenizer), the
    head's draft vocabulary (TensorRT-LLM 1.2 `_torch/models/modeling_auto.py` loads a checkpoint as
    `EAGLE3<arch>` only when its config.json has `draft_vocab_size`) and, where the target has too few layers for
    upstream's default `(1, L/2 - 1, L - 4)` (`Eagle3SpecMetadata`: "Not enough hidden layers for default EAGLE3
    capture" at L <= 5), the target layers whose outputs the head was trained on (`eagle3_layers_to_capture`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # `target` in the registry (named apart from the spec's Triton `target`)
    target_model: str = Field(validation_alias=AliasChoices("target", "target_model"), serialization_alias="target")
    draft_vocab_size: int = Field(gt=0, le=MAX_VOCAB)
    capture_layers: list[Annotated[int, Field(ge=0, lt=MAX_LAYERS)]] | None = Field(None, min_length=1)

    @field_validator("target_model")
    @classmethod
    def _safe_target(cls, value: str) -> str:
        if not SAFE_NAME.match(value) or ".." in value:
            raise ValueError(f"{value!r} is not a safe name: use letters, digits and . _ + - (no '/', no '..')")
        return value

    @field_validator("capture_layers")
    @classmethod
    def _distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"capture_layers {list(value)} repeats a layer")
        return value


class ModelEntry(BaseModel):
    """One registry entry (a model, or an EAGLE-3 head when `eagle3` is set)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    repo_id: str
    revision: str = "main"
    source: Literal["hub", "generated"] = "hub"
    gated: bool = False
    tokenizer_family: str
    # the tokenizer's own length where the embedding is padded past it (Qwen2.5 7B+ pad to 152064, the small ones
    # to 151936): draft and target must agree on it instead of on vocab_size
    tokenizer_size: int | None = Field(None, gt=0, le=MAX_VOCAB)
    architecture: Architecture
    default_draft: str | None = None
    default_draft_len: int = Field(5, ge=1, le=MAX_DRAFT_LEN)
    limits: ModelLimits = ModelLimits()
    calibration: CalibrationDefaults = CalibrationDefaults()
    eagle3: Eagle3Head | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("tokenizer_size", "eagle3"):
            if data.get(name) is None:
                data.pop(name, None)  # unset: every entry that predates it dumps (and hashes) as before
        return data

    @property
    def is_eagle3_head(self) -> bool:
        return self.eagle3 is not None

    @field_validator("name", "default_draft")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        """Names become directory names (engines/<name>-...): one safe path component."""
        if value is not None and (not SAFE_NAME.match(value) or ".." in value):
            raise ValueError(f"{value!r} is not a safe name: use letters, digits and . _ + - (no '/', no '..')")
        return value

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        return check_repo_id(value)

    @model_validator(mode="after")
    def _fit_default_limits(self) -> ModelEntry:
        """Limits an entry leaves unset never exceed its positions (a user entry may omit `limits:`)."""
        lim, given, pos = self.limits, self.limits.model_fields_set, self.architecture.max_position_embeddings
        seq = lim.max_seq_len if "max_seq_len" in given else min(lim.max_seq_len, pos)
        inp = lim.max_input_len if "max_input_len" in given else min(lim.max_input_len, seq // 2)
        if (seq, inp) != (lim.max_seq_len, lim.max_input_len):
            object.__setattr__(self, "limits", lim.model_copy(update={"max_seq_len": seq, "max_input_len": inp}))
        return self
