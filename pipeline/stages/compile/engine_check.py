"""Verify a built engine directory against its plan: config.json, version, build_config meaning, rank files.

TensorRT-LLM 1.2.1 writes `config.json` = {"version", "pretrained_config", "build_config"} on rank 0, plus
`rank{N}.engine` for every rank of the checkpoint mapping. Its `build_config` is compared by meaning, not by
spelling, because the serialized form depends on which `BuildConfig` wrote it (NVIDIA/TensorRT-LLM, read with the
code-search tools):

- tensorrt_llm/builder.py @ 008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc (dataclass `BuildConfig.to_dict`,
  `EngineConfig.to_dict`, `update_kv_cache_type`, `from_dict`): `kv_cache_type` as the enum *name* ("PAGED");
  `speculative_decoding_mode` an IntFlag that json writes as its int; `from_dict` defaults an absent `max_draft_len`
  to 0, `strongly_typed` to True; `update_kv_cache_type` derives `plugin_config.paged_kv_cache` from `kv_cache_type`
  (and the type from the flag, PAGED when both are unset).
- tensorrt_llm/llmapi/kv_cache_type.py @ 188362024c038718d11cb1f5bcc2a4b1fa829bac: the pydantic-era `KVCacheType`
  is a `str` Enum whose *values* are lower case ("paged"), matched case-insensitively.
- cpp/include/tensorrt_llm/runtime/modelConfig.h @ 012f8ad2031a113485f7485fd9bfb8aaacded4c5: the bindings'
  `KVCacheType` ordinals kCONTINUOUS=0, kPAGED=1, kDISABLED=2 (an int in the JSON).
- tensorrt_llm/models/modeling_utils.py `SpeculativeDecodingMode(IntFlag)`: NONE=1, DRAFT_TOKENS_EXTERNAL=2, ... —
  written as the int, the member name, or "SpeculativeDecodingMode.NAME".
- tensorrt_llm/plugin/plugin.py @ c20322ffd3dc0740ca530c9fad989b22e64f6e06 (pydantic `PluginConfig`): bool
  features accept "enable"/"disable", dtype plugins store "disable" as None and "auto" meaning `dtype`;
  `paged_kv_cache: Optional[bool] = None` until derived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.artifacts import read_config_json
from pipeline.core.errors import CompileError
from pipeline.stages.compile.engine_plan import EnginePlan
from pipeline.stages.compile.flags import SPECULATIVE_MODE_VALUE

_MODE_NAMES = {v: k for k, v in SPECULATIVE_MODE_VALUE.items()}
_KV_CACHE_ORDINALS = {0: "continuous", 1: "paged", 2: "disabled"}  # modelConfig.h KVCacheType
_KV_CACHE_TYPES = frozenset(_KV_CACHE_ORDINALS.values())
_BOOL_WORDS = {"enable": True, "true": True, "disable": False, "false": False}
_UNSET = object()
# Absent from an engine's build_config: BuildConfig.from_dict's defaults (absent == this value).
_DEFAULTS = {"max_draft_len": 0, "strongly_typed": True,
             "speculative_decoding_mode": SPECULATIVE_MODE_VALUE["none"]}


def _enum_name(value: Any, prefix: str) -> Any:
    if isinstance(value, str):
        return value.strip().lower().removeprefix(prefix)
    return value


def kv_cache_type(value: Any) -> str | None:
    """"paged"/"continuous"/"disabled" for any serialized KVCacheType (name, value, "KVCacheType.X", ordinal)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _KV_CACHE_ORDINALS.get(value)
    name = _enum_name(value, "kvcachetype.")
    return name if name in _KV_CACHE_TYPES else None


def speculative_mode(value: Any) -> Any:
    """The `flags.SPECULATIVE_MODE_VALUE` name for any serialized SpeculativeDecodingMode (int, name, "Cls.NAME")."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _MODE_NAMES.get(value, value)
    return _enum_name(value, "speculativedecodingmode.")


def _bool(value: Any) -> Any:
    return _BOOL_WORDS.get(value.strip().lower(), value) if isinstance(value, str) else value


def _int(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _plugin_value(value: Any, dtype: Any) -> Any:
    """A dtype plugin: "disable"/None -> None, "auto" -> the PluginConfig dtype (what `__getattribute__` returns)."""
    if value == "disable":
        return None
    if value == "auto":
        return dtype
    return value


def _canonical(key: str, value: Any, *, planned: Any, dtype: Any) -> Any:
    """`value` in the spelling of the plan's value for `key`."""
    if key == "kv_cache_type":
        return kv_cache_type(value)
    if key == "speculative_decoding_mode":
        return speculative_mode(value)
    if isinstance(planned, bool):
        return _bool(value)
    if isinstance(planned, int):
        return _int(value)
    if key.endswith("_plugin"):
        return _plugin_value(value, dtype)
    return value


def _engine_kv_cache_type(actual: dict[str, Any]) -> str | None:
    """The engine's KV cache type: recorded, else derived from `paged_kv_cache` (`update_kv_cache_type`)."""
    if actual.get("kv_cache_type") is not None:
        return kv_cache_type(actual["kv_cache_type"])
    paged = _bool((actual.get("plugin_config") or {}).get("paged_kv_cache"))
    if paged is None:
        return "paged"
    return "paged" if paged is True else "continuous" if paged is False else None


def _compare(name: str, key: str, want: Any, got: Any, *, dtype: Any) -> str | None:
    shown = repr(got)
    if got is _UNSET:
        if key not in _DEFAULTS:
            return f"{name}: planned {want!r}, missing in engine"
        got = _DEFAULTS[key]
        shown = f"nothing (default {got!r})"
    if _canonical(key, got, planned=want, dtype=dtype) != _canonical(key, want, planned=want, dtype=dtype):
        return f"{name}: planned {want!r}, engine has {shown}"
    return None


def diff_build_config(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Differences that change the engine, for every planned key (extra keys in `actual` are ignored).

    Derived values are compared as derived: `kv_cache_type` and `plugin_config.paged_kv_cache` are one setting,
    compared once as the engine's KV cache type (recorded, else derived from the flag);
    a planned `opt_num_tokens` of None (multiple profiles, which ignore it: FACTS §3 rules) is not compared.
    """
    diffs = []
    kv = _engine_kv_cache_type(actual)
    for key, want in expected.items():
        name = f"build_config.{key}"
        if key == "plugin_config":
            diffs += _diff_plugin_config(want, actual.get(key))
        elif key == "kv_cache_type":
            if kv != kv_cache_type(want):
                diffs.append(f"{name}: planned {want!r}, engine has {actual.get(key, 'nothing')!r}")
        elif key == "opt_num_tokens" and want is None:
            continue
        elif (d := _compare(name, key, want, actual.get(key, _UNSET), dtype=None)) is not None:
            diffs.append(d)
    return diffs


def _diff_plugin_config(expected: dict[str, Any], actual: Any) -> list[str]:
    if not isinstance(actual, dict):
        return [f"build_config.plugin_config: planned a mapping, engine has {actual!r}"]
    dtype = actual.get("dtype")
    diffs = []
    for key, want in expected.items():
        name = f"build_config.plugin_config.{key}"
        if key == "paged_kv_cache":
            continue  # derived from kv_cache_type (update_kv_cache_type), compared there
        if (d := _compare(name, key, want, actual.get(key, _UNSET), dtype=dtype)) is not None:
            diffs.append(d)
    return diffs


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    path = Path(engine_dir) / "config.json"
    config = read_config_json(path, CompileError,
                              missing=f"engine directory {engine_dir} has no config.json; the build did not finish",
                              fix="rebuild the engine (invoke compile --force)")
    missing = [k for k in ("version", "pretrained_config", "build_config") if k not in config]
    if missing:
        raise CompileError(f"{path} lacks {', '.join(missing)}; it was not written by TensorRT-LLM's trtllm-build")
    return config


def verify_engine_dir(engine_dir: Path, plan: EnginePlan, *, trtllm_version: str) -> dict[str, Any]:
    """Check an engine directory; return its config.json.

    Raises:
        CompileError: listing every difference (version, build_config values, mapping, missing/empty rank files).
    """
    engine_dir = Path(engine_dir)
    config = read_engine_config(engine_dir)
    problems: list[str] = []
    if config["version"] != trtllm_version:
        problems.append(f"version: built by TensorRT-LLM {config['version']!r}, expected {trtllm_version!r}")
    problems += diff_build_config(plan.expected_build_config, config["build_config"])
    mapping = (config["pretrained_config"] or {}).get("mapping") or {}
    world = mapping.get("world_size", plan.world_size)
    if world != plan.world_size:
        problems.append(f"pretrained_config.mapping.world_size: planned {plan.world_size}, engine has {world}")
    for name in plan.rank_files:
        f = engine_dir / name
        if not f.is_file():
            problems.append(f"{name}: missing")
        elif f.stat().st_size == 0:
            problems.append(f"{name}: empty")
    if problems:
        raise CompileError(
            f"{plan.role} engine in {engine_dir} does not match its plan: " + "; ".join(problems)
            + " — rebuild with `invoke compile --force` on the pinned toolchain"
        )
    return config
