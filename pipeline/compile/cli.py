"""Body of `invoke compile`: locate the checkpoints, then plan (`--dry-run`) or preflight and build."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from ..artifacts import engines_dir, read_manifest
from ..errors import CompileError
from ..spec import BuildSpec

PENDING = "<build-id>"


def _calibrate_available() -> bool:
    return importlib.util.find_spec("pipeline.calibrate") is not None


def engine_dirs_for(checkpoint_dir: Path, spec: BuildSpec) -> tuple[Path, Path]:
    """engines/<build-id>/engine and draft_engine for a checkpoint at engines/<build-id>/checkpoint.

    A checkpoint elsewhere (--checkpoint-dir) gets engines/<model>-<precision>-ext-<hash12 of its path>/.
    """
    checkpoint_dir = Path(checkpoint_dir).resolve()
    if checkpoint_dir.name == "checkpoint":
        base = checkpoint_dir.parent
    else:
        digest = hashlib.sha256(str(checkpoint_dir).encode()).hexdigest()[:12]
        base = engines_dir() / f"{spec.model.name}-{spec.quantization.precision}-ext-{digest}"
    return base / "engine", base / "draft_engine"


def _calibrated(spec: BuildSpec, role: str) -> Path:
    """The checkpoint of `role` from the calibrate stage (a no-op when it is current)."""
    from ..calibrate import run_calibrate  # written by the calibrate helper; imported only when needed

    return Path(run_calibrate(spec, role=role).path)


def locate_checkpoints(
    spec: BuildSpec, *, checkpoint_dir: str | None, draft_checkpoint_dir: str | None, dry_run: bool
) -> tuple[Path, Path | None]:
    """Explicit directories win; else the calibrate stage provides them; a dry run plans without them."""
    target = Path(checkpoint_dir) if checkpoint_dir else None
    draft = Path(draft_checkpoint_dir) if draft_checkpoint_dir else None
    need_draft = spec.draft_model is not None and draft is None
    if target is not None and not need_draft:
        return target, draft
    if dry_run:
        target = target or engines_dir() / PENDING / "checkpoint"
        if need_draft:
            draft = engines_dir() / f"{PENDING}-draft" / "checkpoint"
        return target, draft
    if not _calibrate_available():
        raise CompileError(
            "no checkpoint given and the calibrate stage is not available; pass --checkpoint-dir DIR"
            + (" and --draft-checkpoint-dir DIR" if spec.draft_model else "")
        )
    target = target or _calibrated(spec, "target")
    if need_draft:
        draft = _calibrated(spec, "draft")
    return target, draft


def compile_command(
    spec: BuildSpec,
    *,
    dry_run: bool = False,
    checkpoint_dir: str | None = None,
    draft_checkpoint_dir: str | None = None,
    force: bool = False,
    as_json: bool = False,
) -> dict[str, Any]:
    """Run the compile stage for the CLI; prints the plan (dry run) or where the engines are."""
    from .plan import plan_compile
    from .preflight import preflight
    from .stage import run_compile

    if not dry_run:
        # Fail fast (< 1 s on a CPU host) before anything heavy, e.g. calibrating to locate a checkpoint.
        world = spec.parallelism.world_size
        preflight_toolchain = preflight(gpu=spec.hardware.gpu, workers=max(1, min(world, spec.hardware.gpu_count)))
    target, draft = locate_checkpoints(spec, checkpoint_dir=checkpoint_dir,
                                       draft_checkpoint_dir=draft_checkpoint_dir, dry_run=dry_run)
    engine_dir, draft_engine_dir = engine_dirs_for(target, spec)
    if dry_run:
        plan = plan_compile(spec, checkpoint_dir=target, output_dir=engine_dir, draft_checkpoint_dir=draft,
                            draft_output_dir=draft_engine_dir if draft else None, allow_derived=True)
        print(plan.to_json() if as_json else plan.format())
        return plan.as_dict()
    manifest = run_compile(spec, checkpoint_dir=target, output_dir=engine_dir, draft_checkpoint_dir=draft,
                           draft_output_dir=draft_engine_dir if draft else None, force=force,
                           toolchain=preflight_toolchain)
    if as_json:
        print(json.dumps(manifest, indent=2))
    else:
        print(f"ok: target engine {engine_dir} (key {manifest['key'][:12]}, "
              f"TensorRT-LLM {manifest['engine_version']}, SM {manifest['gpu']['sm']})")
        if manifest.get("draft"):
            d = read_manifest(draft_engine_dir) or {}
            print(f"ok: draft engine {draft_engine_dir} (key {str(d.get('key'))[:12]}, tokenizer shared)")
    return manifest
