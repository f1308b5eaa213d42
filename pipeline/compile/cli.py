"""Body of `invoke compile`: locate the checkpoints (check-only), then plan (`--dry-run`) or preflight and build."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..artifacts import engines_dir
from ..spec import BuildSpec

PENDING = "<build-id>"


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
    from ..build import locate_outputs

    out = locate_outputs(spec, until="calibrate")
    target = target or out.checkpoint.path
    if need_draft:
        draft = out.draft_checkpoint.path
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
        # Fail fast (< 1 s on a CPU host) before locating anything.
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
    res, draft_res = run_compile(spec, checkpoint_dir=target, output_dir=engine_dir, draft_checkpoint_dir=draft,
                                 draft_output_dir=draft_engine_dir if draft else None, force=force,
                                 toolchain=preflight_toolchain)
    m = res.manifest
    if as_json:
        print(json.dumps(m.model_dump(mode="json"), indent=2))
    else:
        print(f"ok: target engine {res.path} {res.status} (key {m.key[:12]}, TensorRT-LLM {m.engine_version}, "
              f"SM {m.gpu.get('sm')})")
        if draft_res is not None:
            print(f"ok: draft engine {draft_res.path} {draft_res.status} (key {draft_res.manifest.key[:12]}, "
                  "tokenizer shared)")
    return m.model_dump(mode="json")
