"""One-command build: check → download → calibrate → compile (target trtllm, runtime engine) → package.

Runtime pytorch: calibrate exports a unified Hugging Face checkpoint, compile is a no-op (the PyTorch backend loads
the checkpoint; the report says so) and package writes the Triton `llmapi` repository with the LLM-API options.

Every stage owns its cache (its output dir's `manifest.json` records `key`, the hash of exactly its inputs, and the
file table of its output), so a finished build re-run reads manifests and file sizes/mtimes only, a changed input
rebuilds just the stages downstream of it, and an output that no longer matches its manifest fails with one line
naming `--force STAGE`. Each stage is a `Stage` (`pipeline.stages.stage`): run in the order of the runtime row's
stage list, it records the typed results it returned in `BuildOutputs`; this module reports them and points the
stage's build ref (`pipeline.core.refs`) at them, which is how every later reader finds the build. It only
sequences the stages, validates everything first (spec + the compile preflight for target trtllm, so an
impossible build fails in well under a second before any download), serializes concurrent builds of the same spec
on a file lock, prints one progress line per stage, and returns a machine-readable report.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.artifacts import engines_dir, stage_lock
from pipeline.core.errors import BuildError
from pipeline.core.manifests import PrecisionSearch
from pipeline.core.refs import ROLES, write_ref
from pipeline.core.runtimes import RuntimeTarget, runtime_named, runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.planning.limits_choice import choose_limits
from pipeline.stages.calibrate.precision_search import choose_precision
from pipeline.stages.calibrate.stage import CALIBRATE, check_family
from pipeline.stages.check import check_spec_fits
from pipeline.stages.compile.preflight import Toolchain, preflight
from pipeline.stages.compile.stage import COMPILE
from pipeline.stages.download.stage import DOWNLOAD
from pipeline.stages.package.stage import PACKAGE
from pipeline.stages.stage import BuildOptions, BuildOutputs, RefLocated, Stage, StageOutcome

STAGES = ("check", "download", "calibrate", "compile", "package")
__all__ = ["STAGES", "BuildError", "BuildOptions", "BuildOutputs", "BuildReport", "StageOutcome", "build",
           "locate_outputs", "stage_range"]

_BY_NAME: dict[str, Stage] = {stage.name: stage for stage in (DOWNLOAD, CALIBRATE, COMPILE, PACKAGE)}


@dataclass
class BuildReport:
    summary: str
    target: str
    build_id: str | None
    stages: list[StageOutcome]
    total_s: float
    outputs: BuildOutputs
    precision_search: PrecisionSearch | None = None  # what `precision: auto` tried, when it chose
    spec: BuildSpec | None = None  # the spec built (with `precision: auto`, at the chosen precision)

    @property
    def noop(self) -> bool:
        """True when no stage did any work (everything was current)."""
        return all(s.status in ("cached", "skipped", "ok") for s in self.stages)

    def as_dict(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in ("summary", "target", "build_id", "noop")},
            "total_s": round(self.total_s, 3),
            "stages": [asdict(s) for s in self.stages],
            "outputs": self.outputs.paths(),
            **({"precision_search": self.precision_search.model_dump(mode="json")} if self.precision_search else {}),
        }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stage_range(*, until: str | None, from_stage: str | None, force: str | None, target: str,
                runtime: str = "engine") -> list[str]:
    """The stages to execute, validated. Raises BuildError for unknown names or an empty/inverted range."""
    for name, value in (("--until", until), ("--from", from_stage), ("--force", force)):
        if value is not None and value not in STAGES:
            raise BuildError(f"{name} {value!r} is not a stage; stages: {', '.join(STAGES)}")
    backend = runtime_named(runtime, target)
    if force == "compile" and not backend.compiles:
        raise BuildError(backend.no_force_compile)
    lo = STAGES.index(from_stage) if from_stage else 0
    hi = STAGES.index(until) if until else len(STAGES) - 1
    if lo > hi:
        raise BuildError(f"--from {from_stage} comes after --until {until}; stages run in order {' → '.join(STAGES)}")
    if force is not None and not lo <= STAGES.index(force) <= hi:
        raise BuildError(f"--force {force} is outside the stages being run ({STAGES[lo]}..{STAGES[hi]})")
    return list(STAGES[lo : hi + 1])


def _check(spec: BuildSpec, *, preflight_compile: bool) -> tuple[StageOutcome, Toolchain | None]:
    """The spec is validated by resolve_spec; before a trtllm compile also run the preflight (< 1 s on CPU)."""
    note = runtime_of(spec).check_note
    if note is not None:
        return StageOutcome("check", "ok", 0.0, detail=note), None
    if not preflight_compile:
        return StageOutcome("check", "ok", 0.0, detail="spec ok; compile not run"), None

    world = spec.parallelism.world_size
    tc = preflight(gpu=spec.hardware.gpu, workers=max(1, min(world, spec.hardware.gpu_count)))
    detail = f"spec ok; TensorRT-LLM {tc.tensorrt_llm}, TensorRT {tc.tensorrt}, {tc.gpu_count}x {tc.gpu_name}"
    return StageOutcome("check", "ok", 0.0, detail=detail), tc


def build(
    spec: BuildSpec,
    *,
    until: str | None = None,
    from_stage: str | None = None,
    force: str | None = None,
    options: BuildOptions | None = None,
    progress: Callable[[str], None] | None = _stderr,
    check_only: bool = False,
    host_check: Callable[[list[str]], str] | None = None,
) -> BuildReport:
    """Run the build chain for `spec`.

    Args:
        until: last stage to run (inclusive).
        from_stage: first stage to run; earlier stages are only *located* (check-only: offline, current and
            intact outputs), never executed — if one is not current the build fails saying what to run.
        force: rebuild this stage and every later stage even if current.
        options: download options (offline/update/verify/endpoint/token/revision) and `verify` (re-hash all).
        progress: callback for the one-line-per-stage progress (default: stderr); None for silence.
        check_only: locate every stage up to `until`; nothing is built (`locate_outputs`).
        host_check: called with the stages to run after the spec and preflight checks, before any download;
            returns a line for the check stage's detail or raises (`pipeline.stages.host_check`).

    Raises:
        BuildError: bad --until/--from/--force. PipelineError subclasses from the stages, e.g. IntegrityError
            (exit 3) when a current output differs from its manifest.
    """
    options = options or BuildOptions()
    say = progress or (lambda line: None)
    t_start = time.perf_counter()
    run = [] if check_only else stage_range(until=until, from_stage=from_stage, force=force, target=spec.target,
                                            runtime=spec.runtime)
    if spec.auto_precision is not None and "calibrate" not in run:
        raise BuildError("precision=auto is chosen by calibrating: run a stage range that includes calibrate, or "
                         f"pass --precision {' or '.join(spec.auto_precision.candidates)}")
    forced = set(STAGES[STAGES.index(force):]) if force else set()
    out = BuildOutputs()
    chain = _chain(runtime_of(spec), until or STAGES[-1])
    n = 1 + len([s for s in chain if s.name in run])
    # check (spec validation + compile preflight) always runs first, outside the lock, even with --from: it is
    # instant, guards every stage, and leaves nothing behind when the build is impossible.
    say(f"[1/{n}] check: {_doing('check', spec)} ...")
    t0 = time.perf_counter()
    oc, out.toolchain = _check(spec, preflight_compile="compile" in run)
    if "calibrate" in run:
        check_family(spec)  # a family calibrate cannot round-trip fails here, before the download
    if host_check is not None and run:
        oc.detail += "; " + host_check(run)
    oc.elapsed_s = round(time.perf_counter() - t0, 3)
    say(f"[1/{n}] check: ok ({oc.detail}) in {oc.elapsed_s:.2f}s")
    outcomes = [oc]
    search = None
    if spec.auto_precision is not None:
        spec, search = _choose_precision(spec, run, options, say)
    lock = contextlib.nullcontext() if check_only else stage_lock(engines_dir() / f"build-{spec.identity()[:16]}")
    with lock:
        outcomes += _run_chain(spec, chain, run, forced, out, options, n=n, say=say)
    total = time.perf_counter() - t_start
    report = BuildReport(spec.summary(), spec.target, out.build_id, outcomes, total, out, search, spec)
    say(f"build {'unchanged' if report.noop else 'done'}: {out.build_id or '-'} in {total:.2f}s")
    return report


def _choose_precision(spec: BuildSpec, run: list[str], options: BuildOptions,
                      say: Callable[[str], None]) -> tuple[BuildSpec, PrecisionSearch]:
    """`precision: auto`: fetch (or locate) the model, calibrate the candidates (`choose_precision`), and return the
    spec at the chosen precision with its limits chosen and its fit checked again, and what was measured."""
    fetched = BuildOutputs()
    if DOWNLOAD.name in run:
        DOWNLOAD.run(spec, fetched, options, force=False)
    else:
        DOWNLOAD.locate(spec, fetched, options)
    choice = choose_precision(spec, source=fetched.download, verify=options.verify, say=say)
    chosen = check_spec_fits(choose_limits(choice.spec))
    for w in chosen.warnings:
        if w not in spec.warnings:  # the stand-in precision's were printed with the spec
            say(f"warning: {w}")
    return chosen, choice.record


def _chain(row: RuntimeTarget, last: str) -> list[Stage]:
    """The row's stages up to `last`, in the row's order (compile only where the row compiles)."""
    return [_BY_NAME[name] for name in row.stages if STAGES.index(name) <= STAGES.index(last)]


def _run_chain(spec: BuildSpec, chain: list[Stage], run: list[str], forced: set[str], out: BuildOutputs,
               options: BuildOptions, *, n: int, say: Callable[[str], None]) -> list[StageOutcome]:
    """Run the stages of `chain` that are in `run` (pointing each one's build ref at what it returned), locate the
    others (check-only); the outcomes of those run.

    A compile stage in `run` that the row does not have is reported skipped in its place, without a `[k/n]`
    counter (n counts the stages that run)."""
    outcomes: list[StageOutcome] = []
    i = 1
    row = runtime_of(spec)
    skipped = "compile" in run and not row.compiles
    for stage in chain:
        if skipped and STAGES.index(stage.name) > STAGES.index("compile"):
            outcomes.append(_skip_compile(row, say))
            skipped = False
        if stage.name not in run:
            stage.locate(spec, out, options)
            continue
        i += 1
        say(f"[{i}/{n}] {stage.name}: {stage.doing(spec)} ...")
        t0 = time.perf_counter()
        oc = stage.run(spec, out, options, force=stage.name in forced)
        oc.elapsed_s = round(time.perf_counter() - t0, 3)
        if isinstance(stage, RefLocated):  # found by its build ref: point the ref at what the stage returned
            write_ref(stage.name, stage.identity(spec), {role: getattr(out, role) for role in ROLES[stage.name]},
                      say=say)
        outcomes.append(oc)
        detail = f" ({oc.detail})" if oc.detail else ""
        say(f"[{i}/{n}] {stage.name}: {oc.status}{detail} in {oc.elapsed_s:.2f}s")
    if skipped:
        outcomes.append(_skip_compile(row, say))
    return outcomes


def _skip_compile(row: RuntimeTarget, say: Callable[[str], None]) -> StageOutcome:
    say(f"compile: skipped ({row.no_compile})")
    return StageOutcome("compile", "skipped", 0.0, detail=row.no_compile)


def _doing(stage: str, spec: BuildSpec) -> str:
    """The words of `stage`'s progress line."""
    if stage == "check":
        return "validating spec" + (" and GPU/toolchain preflight" if runtime_of(spec).compiles else "")
    return _BY_NAME[stage].doing(spec)


def locate_outputs(spec: BuildSpec, *, until: str = "package", verify: bool = False) -> BuildOutputs:
    """The outputs of a finished build of `spec` up to stage `until`, check-only: nothing is downloaded,
    calibrated, compiled or packaged, and no key is recomputed from this host; each stage's build ref is followed
    and what it points at must match its manifest (all sha256 with `verify`). A build made with other library
    versions or from a calibration file since moved is found; whether it is current here is `build`'s question.

    Raises:
        PipelineError: an output is missing or stale (the message says what to run); IntegrityError (exit 3) when
            one differs from its manifest.
    """
    return build(spec, until=until, check_only=True, progress=None, options=BuildOptions(offline=True, verify=verify)
                 ).outputs
