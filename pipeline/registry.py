"""Model registry: the packaged `models.yaml` plus an optional user file, loaded safely into typed entries."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import RegistryError

PACKAGED_REGISTRY = Path(__file__).with_name("models.yaml")


class Architecture(BaseModel):
    """Architecture numbers of a Llama-class decoder, cross-checked against the downloaded config.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0

    @model_validator(mode="after")
    def _heads(self) -> Architecture:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        return self

    def hf_config(self) -> dict:
        """The matching transformers `config.json` fields (LlamaForCausalLM)."""
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "rope_theta": self.rope_theta,
        }

    @property
    def linear_params(self) -> int:
        """Parameters of the quantizable linear layers (attention + MLP), all layers."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp)

    @property
    def embedding_params(self) -> int:
        """Embedding plus lm_head parameters (kept in 16-bit by every recipe)."""
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    @property
    def norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embedding_params + self.norm_params


class ModelLimits(BaseModel):
    """Per-model default engine limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(default=64, gt=0)
    max_input_len: int = Field(default=2048, gt=0)
    max_seq_len: int = Field(default=4096, gt=0)


class CalibrationDefaults(BaseModel):
    """Per-model calibration defaults (FACTS §2: TRT-LLM's quantize script uses 512 samples of 512 tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calib_size: int = Field(default=512, gt=0)
    calib_seq_len: int = Field(default=512, gt=0)
    max_ppl_delta_pct: float = Field(default=1.0, gt=0)


class ModelEntry(BaseModel):
    """One registry entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    repo_id: str
    revision: str = "main"
    source: Literal["hub", "generated"] = "hub"
    gated: bool = False
    tokenizer_family: str
    architecture: Architecture
    default_draft: str | None = None
    default_draft_len: int = 5
    limits: ModelLimits = ModelLimits()
    calibration: CalibrationDefaults = CalibrationDefaults()

    @model_validator(mode="after")
    def _fit_default_limits(self) -> ModelEntry:
        """Limits an entry leaves unset never exceed its positions (a user entry may omit `limits:`)."""
        lim, given, pos = self.limits, self.limits.model_fields_set, self.architecture.max_position_embeddings
        seq = lim.max_seq_len if "max_seq_len" in given else min(lim.max_seq_len, pos)
        inp = lim.max_input_len if "max_input_len" in given else min(lim.max_input_len, seq // 2)
        if (seq, inp) != (lim.max_seq_len, lim.max_input_len):
            object.__setattr__(self, "limits", lim.model_copy(update={"max_seq_len": seq, "max_input_len": inp}))
        return self


def _load_file(path: Path) -> dict[str, dict]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RegistryError(f"models file {path} does not exist; pass an existing YAML file to --models-file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise RegistryError(f"models file {path} is not valid YAML{where}; fix the syntax") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict):
        raise RegistryError(f"models file {path} must be a mapping with a top-level 'models:' mapping of name -> entry")
    return raw["models"]


@lru_cache(maxsize=16)
def _load(user_file: str | None) -> dict[str, ModelEntry]:
    entries = dict(_load_file(PACKAGED_REGISTRY))
    if user_file:
        entries.update(_load_file(Path(user_file)))
    out: dict[str, ModelEntry] = {}
    for name, body in entries.items():
        if not isinstance(body, dict):
            raise RegistryError(f"model '{name}' must be a mapping of fields, got {type(body).__name__}")
        try:
            out[name] = ModelEntry(name=name, **body)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise RegistryError(f"model '{name}': field '{loc}': {err['msg']}; fix the registry entry") from None
    for entry in out.values():
        if entry.default_draft and entry.default_draft not in out:
            raise RegistryError(f"model '{entry.name}': default_draft '{entry.default_draft}' is not in the registry")
    return out


def load_registry(models_file: str | Path | None = None) -> dict[str, ModelEntry]:
    """Return name -> entry for the packaged registry, overlaid with `models_file` when given."""
    return _load(str(models_file) if models_file else None)


def get_model(name: str, *, models_file: str | Path | None = None) -> ModelEntry:
    """Look one model up by registry name.

    Raises:
        RegistryError: unknown name (the message lists the known ones).
    """
    registry = load_registry(models_file)
    if name not in registry:
        known = ", ".join(sorted(registry))
        raise RegistryError(f"unknown model '{name}'; known models: {known} (add one with --models-file FILE.yaml)")
    return registry[name]
