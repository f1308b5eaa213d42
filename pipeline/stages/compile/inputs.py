"""Where `compile` reads its checkpoints and writes its engines when the caller does not say."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.core.artifacts import engines_dir
from pipeline.core.errors import CompileError
from pipeline.core.layout import PENDING
from pipeline.core.spec import BuildSpec


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


def locate_checkpoints(
    spec: BuildSpec, *, checkpoint_dir: str | None, draft_checkpoint_dir: str | None, dry_run: bool
) -> tuple[Path, Path | None]:
    """Explicit directories win; else the calibrate stage's current outputs (check-only: never calibrates); a dry
    run plans without them."""
    from pipeline.stages.build import locate_outputs

    target = Path(checkpoint_dir) if checkpoint_dir else None
    draft = Path(draft_checkpoint_dir) if draft_checkpoint_dir else None
    need_draft = spec.quantized_draft is not None and draft is None
    if target is not None and not need_draft:
        return target, draft
    if dry_run:
        target = target or engines_dir() / PENDING / "checkpoint"
        if need_draft:
            draft = engines_dir() / f"{PENDING}-draft" / "checkpoint"
        return target, draft
    out = locate_outputs(spec, until="calibrate")
    if out.checkpoint is None or (need_draft and out.draft_checkpoint is None):
        raise CompileError(f"no current checkpoint for {spec.model.name} {spec.quantization.precision}; run "
                           "`invoke calibrate` (or `invoke build --until calibrate`) first")
    if need_draft and out.draft_checkpoint is not None:
        draft = out.draft_checkpoint.path
    return target or out.checkpoint.path, draft
