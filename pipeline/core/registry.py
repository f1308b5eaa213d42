"""Model registry: the packaged `models.yaml` plus an optional user file (read by
`pipeline.core.untrusted.load_yaml_mapping`, at most `MAX_MODELS_FILE_BYTES`), loaded into typed entries
(`pipeline.core.model_entry`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.core.errors import RegistryError
from pipeline.core.hub_entry import hub_entry_fields
from pipeline.core.model_entry import (
    MAX_BATCH,
    MAX_DRAFT_LEN,
    MAX_POSITIONS,
    Architecture,
    ModelEntry,
    check_repo_id,
    hub_architecture,
)
from pipeline.core.untrusted import load_yaml_mapping

# the entry's types, where the registry's callers have always found them
__all__ = ["MAX_BATCH", "MAX_DRAFT_LEN", "MAX_POSITIONS", "Architecture", "ModelEntry", "check_repo_id",
           "get_model", "hub_architecture", "load_registry"]

PACKAGED_REGISTRY = Path(__file__).parents[1] / "models.yaml"
MAX_MODELS_FILE_BYTES = 4 << 20  # the packaged models.yaml is ~12 KB


def _load_file(path: Path) -> dict[str, dict[str, Any]]:
    shape = " with a top-level 'models:' mapping of name -> entry"
    raw = load_yaml_mapping(path, what="models file", flag="--models-file", cap=MAX_MODELS_FILE_BYTES, shape=shape)
    if not isinstance(raw.get("models"), dict):
        raise RegistryError(f"models file {path} must be a YAML mapping{shape}", path=path)
    models: dict[str, dict[str, Any]] = raw["models"]
    return models


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
            out[name] = ModelEntry.model_validate({"name": name, **body}, strict=True)  # YAML types as written
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            raise RegistryError(f"model {name!r}: field '{loc}': {msg}; fix the registry entry") from None
    for entry in out.values():
        if entry.default_draft and entry.default_draft not in out:
            raise RegistryError(f"model '{entry.name}': default_draft '{entry.default_draft}' is not in the registry")
        head = entry.eagle3
        if head is not None and (head.target_model not in out or out[head.target_model].is_eagle3_head):
            raise RegistryError(f"model '{entry.name}': eagle3.target '{head.target_model}' is not a model in the registry")
    return out


def load_registry(models_file: str | Path | None = None) -> dict[str, ModelEntry]:
    """Return name -> entry for the packaged registry, overlaid with `models_file` when given."""
    return _load(str(models_file) if models_file else None)


def get_model(name: str, *, models_file: str | Path | None = None) -> ModelEntry:
    """Look one model up by registry name.

    `hf:ORG/NAME[@REVISION]` builds an entry from that Hub repo's config.json (`pipeline.core.hub_entry`).

    Raises:
        RegistryError: unknown name (the message lists the known ones), or an unusable Hub repo.
    """
    if name.startswith("hf:"):
        entry = _hub_entry(name)
        _HUB_ENTRIES[entry.name] = entry  # later lookups by the entry's own name (plan --compare variants)
        return entry
    if name in _HUB_ENTRIES:
        return _HUB_ENTRIES[name]
    registry = load_registry(models_file)
    if name not in registry:
        known = ", ".join(sorted(registry))
        raise RegistryError(f"unknown model '{name}'; known models: {known} (add one with --models-file FILE.yaml)")
    return registry[name]


def eagle3_heads(model: str, *, models_file: str | Path | None = None) -> list[ModelEntry]:
    """The registry's EAGLE-3 heads trained for `model`, in registry order."""
    return [e for e in load_registry(models_file).values() if e.eagle3 is not None and e.eagle3.target_model == model]


_HUB_ENTRIES: dict[str, ModelEntry] = {}


@lru_cache(maxsize=16)
def _hub_entry(ref: str) -> ModelEntry:
    body = hub_entry_fields(ref)
    try:
        return ModelEntry.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise RegistryError(f"--model {ref}: config.json field '{loc}': {err['msg']}") from None
