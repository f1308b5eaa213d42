"""Shared, session-cached calibrate-stage runs on the generated tiny model (real ModelOpt, CPU).

`calibrated(tiny_models, **spec_overrides)` runs `run_calibrate` once per distinct spec in this test session and
returns the `CheckpointResult`; the output tree lives in one temporary PIPELINE_ROOT for the whole session, set only
for the duration of each call (other tests' environment is untouched).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

# Lean calibration for tests: AWQ cost is linear in calibration tokens.
LEAN = {"calib_size": 2, "calib_seq_len": 32}
NO_PAGED = {"enable_kv_cache_reuse": False, "enable_chunked_context": False}  # lets every KV dtype validate

_ROOT: list[Path] = []
_CACHE: dict[tuple, Any] = {}


def session_root() -> Path:
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="pipeline-test-calibrate-")))
    return _ROOT[0]


def make_spec(**overrides: Any):
    from pipeline.core.spec import resolve_spec

    args = {"model": "tiny-llama", **LEAN, **NO_PAGED, **overrides}
    if args.get("draft") and "enable_kv_cache_reuse" not in overrides:
        args["enable_kv_cache_reuse"] = True  # a draft-target target needs KV reuse (pipeline/core/spec_rules.py)
    return resolve_spec(**args)


def run_in_root(root: Path, fn, *args, **kwargs):
    """Call fn with PIPELINE_ROOT=root (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(root))
        return fn(*args, **kwargs)


def calibrated(tiny_models: dict[str, Path], *, role: str = "target", **overrides: Any):
    """Session-cached `run_calibrate(make_spec(**overrides), role=role, source=<generated model>)`."""
    from pipeline.stages.calibrate.stage import run_calibrate

    key = (role, tuple(sorted(overrides.items())))
    if key not in _CACHE:
        spec = make_spec(**overrides)
        name = spec.model.name if role == "target" else spec.draft_model.name
        _CACHE[key] = run_in_root(session_root(), run_calibrate, spec, role=role, source=tiny_models[name])
    return _CACHE[key]


def cleanup() -> None:
    for root in _ROOT:
        shutil.rmtree(root, ignore_errors=True)


def leftovers(root: Path) -> list[str]:
    """Every path under engines/ (used to prove a failed run left nothing behind)."""
    eng = root / "engines"
    return sorted(str(p.relative_to(root)) for p in eng.rglob("*")) if eng.exists() else []


atexit.register(cleanup)
