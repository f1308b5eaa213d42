"""`run_compile`: plan → tokenizer check → preflight → cached? → build in a temp dir → verify → manifest → rename."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..artifacts import atomic_dir, is_current, read_manifest, stage_lock, write_manifest
from ..spec import BuildSpec
from .manifest import check_same_tokenizer, checkpoint_identity, compile_key, draft_record, engine_manifest
from .plan import CompilePlan, EnginePlan, plan_compile
from .preflight import Toolchain, preflight
from .runner import run_trtllm_build
from .verify import verify_engine_dir


def log_path_for(engine_dir: Path) -> Path:
    """The build log lives beside the engine dir, so it survives a failed (discarded) build."""
    engine_dir = Path(engine_dir)
    return engine_dir.parent / f"{engine_dir.name}.build.log"


def _compile_one(plan: EnginePlan, toolchain: Toolchain, *, force: bool, draft: dict[str, Any] | None) -> dict:
    out = Path(plan.output_dir)
    tc = toolchain.as_dict()
    checkpoint = checkpoint_identity(Path(plan.checkpoint_dir))
    key = compile_key(plan, checkpoint_key=checkpoint["key"], toolchain=tc, draft_key=draft["key"] if draft else None)
    if not force and is_current(out, key):
        return read_manifest(out)
    with stage_lock(out):
        if not force and is_current(out, key):
            return read_manifest(out)
        log = log_path_for(out)
        with atomic_dir(out) as tmp:
            seconds = run_trtllm_build(plan.argv_for(tmp), log_path=log)
            config = verify_engine_dir(tmp, plan, trtllm_version=toolchain.tensorrt_llm)
            manifest = engine_manifest(tmp, plan, key=key, engine_config=config, toolchain=tc,
                                       checkpoint=checkpoint, draft=draft, build_seconds=seconds, log_path=log)
            write_manifest(tmp, manifest)
    return read_manifest(out)


def run_compile(
    spec: BuildSpec,
    *,
    checkpoint_dir: Path | str,
    output_dir: Path | str,
    draft_checkpoint_dir: Path | str | None = None,
    draft_output_dir: Path | str | None = None,
    dry_run: bool = False,
    force: bool = False,
    toolchain: Toolchain | None = None,
) -> dict[str, Any]:
    """Compile the target (and draft) engines of `spec`; return the target engine's manifest.

    With `dry_run`, return the plan (`CompilePlan.as_dict()`) and touch nothing — works on any machine, and plans
    from the spec when a checkpoint has not been exported yet. Otherwise: a draft with a different tokenizer is
    rejected, the host is preflighted, the draft then the target are built (skipped when their manifest key is
    current, unless `force`), verified and recorded; the target's manifest records the draft as a pair.

    `toolchain`: the result of an earlier `preflight()` on this host (skips a second one).

    Raises:
        CompileError: bad checkpoint, different tokenizers, host cannot compile, build failed or did not verify.
    """
    plan: CompilePlan = plan_compile(
        spec, checkpoint_dir=checkpoint_dir, output_dir=output_dir, draft_checkpoint_dir=draft_checkpoint_dir,
        draft_output_dir=draft_output_dir, allow_derived=dry_run,
    )
    if dry_run:
        return plan.as_dict()
    tokenizer = None
    if plan.draft is not None:
        tokenizer = check_same_tokenizer(Path(plan.target.checkpoint_dir), Path(plan.draft.checkpoint_dir))
    workers = max(p.workers for p in plan.engines)
    if toolchain is None or toolchain.gpu_count < workers:
        toolchain = preflight(gpu=spec.hardware.gpu, workers=workers)
    draft = None
    if plan.draft is not None:
        _compile_one(plan.draft, toolchain, force=force, draft=None)
        draft = draft_record(Path(plan.draft.output_dir), tokenizer)
    return _compile_one(plan.target, toolchain, force=force, draft=draft)
