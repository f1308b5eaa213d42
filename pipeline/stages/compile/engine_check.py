"""Verify a built engine directory against its plan: config.json, version, build_config values, rank files.

TensorRT-LLM 1.2.1 writes (builder.py `Engine.save` / `EngineConfig.to_dict`): `config.json` =
{"version", "pretrained_config", "build_config"} on rank 0, plus `rank{N}.engine` for every rank of the checkpoint
mapping. `build_config.kv_cache_type` is the enum name ("PAGED"), `speculative_decoding_mode` the IntFlag value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.artifacts import read_config_json
from pipeline.core.errors import CompileError
from pipeline.stages.compile.engine_plan import EnginePlan
from pipeline.stages.compile.flags import SPECULATIVE_MODE_VALUE

_MODE_NAMES = {v: k for k, v in SPECULATIVE_MODE_VALUE.items()}


def _norm(key: str, value: Any) -> Any:
    """Normalize the spellings one value may have in config.json (enum name vs value, case)."""
    if key == "kv_cache_type" and isinstance(value, str):
        return value.lower()
    if key == "speculative_decoding_mode":
        if isinstance(value, str):
            return value.lower().removeprefix("speculativedecodingmode.")
        return _MODE_NAMES.get(value, value)
    return value


def diff_build_config(expected: dict[str, Any], actual: dict[str, Any], prefix: str = "build_config") -> list[str]:
    """Human-readable differences for every planned key (extra keys in `actual` are ignored)."""
    diffs = []
    for key, want in expected.items():
        name = f"{prefix}.{key}"
        if isinstance(want, dict):
            got = actual.get(key)
            if not isinstance(got, dict):
                diffs.append(f"{name}: planned a mapping, engine has {got!r}")
            else:
                diffs += diff_build_config(want, got, name)
            continue
        if key not in actual:
            diffs.append(f"{name}: planned {want!r}, missing in engine")
        elif _norm(key, actual[key]) != _norm(key, want):
            diffs.append(f"{name}: planned {want!r}, engine has {actual[key]!r}")
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
