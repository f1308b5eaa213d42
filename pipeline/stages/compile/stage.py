"""`run_compile`: plan → tokenizer check → preflight → cached? → build in a temp dir → verify → manifest → rename."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.artifacts import atomic_dir, stage_lock
from pipeline.core.errors import CompileError
from pipeline.core.manifests import CheckpointManifest, DraftRecord, EngineManifest, StageResult, TokenizerIdentity
from pipeline.core.refs import Lookup
from pipeline.core.spec import BuildSpec
from pipeline.core.upstream import Upstream
from pipeline.stages.compile.engine_check import verify_engine_dir
from pipeline.stages.compile.engine_plan import CompilePlan, EnginePlan, plan_compile
from pipeline.stages.compile.manifest import BuildRun, check_same_tokenizer, compile_key, draft_record, engine_manifest
from pipeline.stages.compile.preflight import Toolchain, preflight
from pipeline.stages.compile.runner import run_trtllm_build
from pipeline.stages.stage import BuildOptions, BuildOutputs, RefLocated, StageOutcome, outcome

EngineResult = StageResult[EngineManifest]
CheckpointInput = StageResult[CheckpointManifest] | Upstream | Path | str


@dataclass(frozen=True)
class CompileIO:
    """What compile reads and writes: the target's checkpoint and engine directory, and the draft's.

    A checkpoint is the calibrate stage's result, or a directory from outside the pipeline (identified once, by
    `Upstream.of_dir`); `draft_checkpoint` is required when the spec has a draft, whose engine directory defaults
    to `draft_engine` beside `output_dir` (as `plan_compile` takes them).
    """

    checkpoint: CheckpointInput
    output_dir: Path | str
    draft_checkpoint: CheckpointInput | None = None
    draft_output_dir: Path | str | None = None


@dataclass(frozen=True)
class _Draft:
    """The draft engine to compile: its plan, its checkpoint, and the tokenizer it shares with the target."""

    plan: EnginePlan
    checkpoint: Upstream
    tokenizer: TokenizerIdentity


def _upstream(checkpoint: CheckpointInput) -> Upstream:
    """The checkpoint as compile's input: a calibrate result, or a given directory identified once here."""
    if isinstance(checkpoint, Upstream):
        return checkpoint
    return Upstream.of(checkpoint) if isinstance(checkpoint, StageResult) else Upstream.of_dir(checkpoint)


def log_path_for(engine_dir: Path) -> Path:
    """The build log lives beside the engine dir, so it survives a failed (discarded) build."""
    engine_dir = Path(engine_dir)
    return engine_dir.parent / f"{engine_dir.name}.build.log"


def _current(out: Path, key: str | None, *, verify: bool) -> EngineManifest | None:
    """The engine manifest of `out` for `key` (None: check-only, any key) when its files match it."""
    return EngineManifest.current(out, key, verify=verify, strict=key is None)


def _recorded_toolchain(m: EngineManifest) -> dict[str, Any]:
    """The toolchain an engine was built with, shaped like `Toolchain.as_dict()` (for its stage key)."""
    return {**m.toolchain, "sm": m.gpu.sm, "gpu_name": m.gpu.name}


def _locate_one(plan: EnginePlan, checkpoint: Upstream, *, draft: DraftRecord | None, verify: bool) -> EngineResult:
    """Check-only: the engine at the plan's output dir, if it was built from this plan and checkpoint (under the
    toolchain it records) and still matches its manifest."""
    out = Path(plan.output_dir)
    m = _current(out, None, verify=verify)
    if m is not None:
        key = compile_key(plan, checkpoint_key=checkpoint.key, toolchain=_recorded_toolchain(m),
                          draft_key=draft.key if draft else None)
        if m.key == key:
            return EngineResult(out, m, "cached")
    raise CompileError(f"no current {plan.role} engine at {out} for this spec and checkpoint; run `invoke compile` "
                       "or `invoke build` on a GPU host first", path=out)


def _compile_one(plan: EnginePlan, toolchain: Toolchain, *, force: bool, draft: DraftRecord | None,
                 verify: bool = False, checkpoint: Upstream | None = None) -> EngineResult:
    out = Path(plan.output_dir)
    checkpoint = checkpoint or Upstream.of_dir(plan.checkpoint_dir)
    tc = toolchain.as_dict()
    key = compile_key(plan, checkpoint_key=checkpoint.key, toolchain=tc, draft_key=draft.key if draft else None)
    if not force and (m := _current(out, key, verify=verify)) is not None:
        return EngineResult(out, m, "cached")
    with stage_lock(out):
        if not force and (m := _current(out, key, verify=verify)) is not None:
            return EngineResult(out, m, "cached")
        log = log_path_for(out)
        with atomic_dir(out) as tmp:
            seconds = run_trtllm_build(plan.argv_for(tmp), log_path=log)
            config = verify_engine_dir(tmp, plan, trtllm_version=toolchain.tensorrt_llm)
            manifest = engine_manifest(tmp, plan, key=key, run=BuildRun(config, seconds, log), toolchain=tc,
                                       checkpoint=checkpoint.record(), draft=draft)
            manifest.write(tmp)
    return EngineResult(out, manifest, "built")


def _draft_of(plan: CompilePlan, checkpoint: Upstream | None) -> _Draft | None:
    """The plan's draft with its checkpoint and the tokenizer it shares with the target (None: no draft).

    Raises:
        CompileError: no draft checkpoint, or the two checkpoints' tokenizers differ.
    """
    if plan.draft is None:
        return None
    if checkpoint is None:
        raise CompileError(f"the plan has draft {plan.draft.model} but no draft checkpoint was given; run "
                           "`invoke calibrate` for the draft or pass --draft-checkpoint-dir DIR")
    tokenizer = check_same_tokenizer(Path(plan.target.checkpoint_dir), Path(plan.draft.checkpoint_dir))
    return _Draft(plan.draft, checkpoint, tokenizer)


def run_compile(
    spec: BuildSpec,
    io: CompileIO,
    *,
    force: bool = False,
    toolchain: Toolchain | None = None,
    check_only: bool = False,
    verify: bool = False,
) -> tuple[EngineResult, EngineResult | None]:
    """Compile the target (and draft) engines of `spec`; return (target, draft) results.

    A draft with a different tokenizer is rejected, the host is preflighted, the draft then the target are built
    (cached when their manifest key is current and their files match it, unless `force`), verified and recorded;
    the target's manifest records the draft as a pair. `invoke compile --dry-run` plans without this function.

    Args:
        io: the checkpoints read and the engine directories written.
        toolchain: the result of an earlier `preflight()` on this host (skips a second one).
        check_only: return the existing engines (no preflight, works on any host) or raise `CompileError`.
        verify: re-hash every file of current engines (default: sizes and mtimes, hashing what changed).

    Raises:
        CompileError: bad checkpoint, different tokenizers, build failed or did not verify, nothing current.
        ToolchainError: this host cannot compile (exit 4).
        IntegrityError: a current engine differs from its manifest (exit 3).
    """
    target_in = _upstream(io.checkpoint)
    draft_in = _upstream(io.draft_checkpoint) if io.draft_checkpoint is not None else None
    plan: CompilePlan = plan_compile(spec, checkpoint_dir=target_in.path, output_dir=io.output_dir,
                                     draft_checkpoint_dir=draft_in.path if draft_in else None,
                                     draft_output_dir=io.draft_output_dir, allow_derived=False)
    draft = _draft_of(plan, draft_in)
    draft_engine: EngineResult | None = None
    record: DraftRecord | None = None
    if check_only:
        if draft is not None:
            draft_engine = _locate_one(draft.plan, draft.checkpoint, draft=None, verify=verify)
            record = draft_record(draft_engine.path, draft.tokenizer)
        return _locate_one(plan.target, target_in, draft=record, verify=verify), draft_engine
    workers = max(p.workers for p in plan.engines)
    if toolchain is None or toolchain.gpu_count < workers:
        toolchain = preflight(gpu=spec.hardware.gpu, workers=workers)
    if draft is not None:
        draft_engine = _compile_one(draft.plan, toolchain, force=force, draft=None, verify=verify,
                                    checkpoint=draft.checkpoint)
        record = draft_record(draft_engine.path, draft.tokenizer)
    target = _compile_one(plan.target, toolchain, force=force, draft=record, verify=verify, checkpoint=target_in)
    return target, draft_engine


class CompileStage(RefLocated):
    """The compile stage of a build (`run_compile`): the target and draft engines from the located or built
    checkpoints, into the build's layout, with the toolchain the check stage's preflight found."""

    name = "compile"
    error = CompileError
    absent = ("no current target engine for {model} {precision} (none recorded for this spec); run `invoke compile` "
              "or `invoke build` on a GPU host first")

    def doing(self, spec: BuildSpec) -> str:
        return f"trtllm-build tp={spec.parallelism.tp} pp={spec.parallelism.pp} for {spec.hardware.gpu}"

    def chained(self, outputs: BuildOutputs) -> Lookup | None:
        engine, checkpoint = outputs.engine, outputs.checkpoint
        if engine is not None and checkpoint is not None and engine.manifest.checkpoint.key != checkpoint.manifest.key:
            return Lookup("stale", reason=f"{engine.path} was compiled from another checkpoint", path=engine.path)
        return None

    def run(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions, *, force: bool) -> StageOutcome:
        layout, checkpoint = outputs.calibrated("compile")
        io = CompileIO(checkpoint, layout.engine, outputs.draft_checkpoint, layout.draft_engine)
        outputs.engine, outputs.draft_engine = run_compile(spec, io, force=force, toolchain=outputs.toolchain,
                                                           verify=options.verify)
        m = outputs.engine.manifest
        detail = f"TensorRT-LLM {m.toolchain.get('tensorrt_llm')}, SM {m.gpu.sm}"
        return outcome("compile", {"engine": outputs.engine, "draft_engine": outputs.draft_engine}, detail)


COMPILE = CompileStage()
