"""One-command build: check → download → calibrate → compile (target trtllm, runtime engine) → package.

Runtime pytorch: calibrate exports a unified Hugging Face checkpoint, compile is a no-op (the PyTorch backend loads
the checkpoint; the report says so) and package writes the Triton `llmapi` repository with the LLM-API options.

Every stage owns its cache (its output dir's `manifest.json` records `key`, the hash of exactly its inputs, and the
file table of its output), so a finished build re-run reads manifests and file sizes/mtimes only, a changed input
rebuilds just the stages downstream of it, and an output that no longer matches its manifest fails with one line
naming `--force STAGE`. Each stage returns a typed `StageResult`; this module reports what they returned and
points the stage's build ref (`pipeline.core.refs`) at it, which is how every later reader finds the build. It
only sequences the stages, validates everything first (spec + the compile preflight for target trtllm, so an
impossible build fails in well under a second before any download), serializes concurrent builds of the same spec
on a file lock, prints one progress line per stage, and returns a machine-readable report.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.core.artifacts import engines_dir, stage_lock
from pipeline.core.errors import BuildError, CalibrationError, CompileError, PackageError, PipelineError
from pipeline.core.layout import BuildLayout
from pipeline.core.manifests import PrecisionSearch, StageResult, integrity_error
from pipeline.core.refs import ROLES, Lookup, lookup, write_ref
from pipeline.core.runtimes import runtime_named, runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.planning.limits_choice import choose_limits
from pipeline.stages.calibrate.precision_search import choose_precision
from pipeline.stages.calibrate.stage import check_family, run_calibrate
from pipeline.stages.check import check_spec_fits
from pipeline.stages.calibrate.stage import log_file as calibrate_log
from pipeline.stages.compile import run_compile
from pipeline.stages.compile.preflight import preflight
from pipeline.stages.download.stage import download_model
from pipeline.stages.download.stage import is_cached as download_is_cached
from pipeline.stages.package.repository import PackageInputs, package

STAGES = ("check", "download", "calibrate", "compile", "package")
__all__ = ["STAGES", "BuildError", "BuildOptions", "BuildOutputs", "BuildReport", "build", "locate_outputs",
           "stage_range"]


@dataclass
class StageOutcome:
    """One row of the build report: what a stage returned (built or cached), or "ok"/"skipped"."""

    stage: str
    status: str  # "built" | "cached" | "skipped" | "ok"
    elapsed_s: float
    paths: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str | None] = field(default_factory=dict)
    detail: str = ""


@dataclass
class BuildOutputs:
    """The typed results the stages returned, and the build's layout (what serve, bench and release use)."""

    layout: BuildLayout | None = None
    download: StageResult | None = None
    draft_download: StageResult | None = None
    checkpoint: StageResult | None = None
    draft_checkpoint: StageResult | None = None
    engine: StageResult | None = None
    draft_engine: StageResult | None = None
    triton_repo: StageResult | None = None

    @property
    def build_id(self) -> str | None:
        return self.layout.build_id if self.layout else None

    def results(self) -> dict[str, StageResult]:
        """role -> result, for every stage output found or built."""
        return {k: v for k, v in vars(self).items() if isinstance(v, StageResult)}

    def paths(self) -> dict[str, str]:
        return {k: str(r.path) for k, r in self.results().items()}


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


# ---------------------------------------------------------------------------------------------------------------
# Stage adapters: each calls the stage's public API (which owns caching, integrity, locks and atomic outputs) and
# turns the typed results it returns into one report row; `build` then points the stage's ref at them. A stage that
# is only located follows its ref (`_locate`); download, a cache keyed by the pinned revision, is asked check-only.


@dataclass
class BuildOptions:
    offline: bool = False
    update: bool = False
    verify_download: bool = False
    verify: bool = False  # re-hash every stage's outputs (sha256), not only sizes and mtimes
    endpoint: str | None = None
    token: str | None = None
    revision: str | None = None


def _outcome(stage: str, results: dict[str, StageResult | None], detail: str = "") -> StageOutcome:
    found = {role: r for role, r in results.items() if r is not None}
    status = "built" if any(r.built for r in found.values()) else "cached"
    return StageOutcome(stage, status, 0.0, paths={role: str(r.path) for role, r in found.items()},
                        keys={role: r.manifest.key for role, r in found.items()}, detail=detail)


def _download(spec: BuildSpec, out: BuildOutputs, opts: BuildOptions, force: bool,
              check_only: bool = False) -> StageOutcome:
    for role, entry in (("model", spec.model), ("draft", spec.draft_model)):
        if entry is None:
            continue
        kwargs: dict[str, Any] = dict(offline=opts.offline, update=opts.update and not check_only,
                                      verify=opts.verify_download or opts.verify or force, check_only=check_only)
        if role == "model" and opts.revision:
            kwargs["revision"] = opts.revision
        if opts.endpoint:
            kwargs["endpoint"] = opts.endpoint
        if opts.token:
            kwargs["token"] = opts.token
        res = download_model(entry, **kwargs)
        if role == "model":
            out.download = res
        else:
            out.draft_download = res
    detail = " ".join(f"{r.manifest.model}@{r.manifest.sha[:12]}" for r in (out.download, out.draft_download) if r)
    return _outcome("download", {"model": out.download, "draft": out.draft_download}, detail)


def _calibrate(spec: BuildSpec, out: BuildOutputs, opts: BuildOptions, force: bool) -> StageOutcome:
    out.checkpoint = run_calibrate(spec, role="target", source=out.download, force=force, verify=opts.verify)
    if spec.draft_model is not None:
        out.draft_checkpoint = run_calibrate(spec, role="draft", source=out.draft_download, force=force,
                                             verify=opts.verify)
    _set_layout(spec, out)
    results = {"target": out.checkpoint, "draft": out.draft_checkpoint}
    detail = " ".join(f"{role} ppl Δ {r.manifest.quality.ppl_delta_pct:+.2f}%" for role, r in results.items() if r)
    logs = [str(calibrate_log(r.path)) for r in results.values() if r and r.built]
    if logs:
        detail += f"; library output: {', '.join(logs)}"
    return _outcome("calibrate", results, detail)


def _compile(spec: BuildSpec, out: BuildOutputs, opts: BuildOptions, force: bool,
             toolchain: Any = None) -> StageOutcome:
    lay = out.layout
    out.engine, out.draft_engine = run_compile(
        spec, checkpoint=out.checkpoint, output_dir=lay.engine, draft_checkpoint=out.draft_checkpoint,
        draft_output_dir=lay.draft_engine, force=force, toolchain=toolchain, verify=opts.verify,
    )
    m = out.engine.manifest
    detail = f"TensorRT-LLM {m.toolchain.get('tensorrt_llm')}, SM {m.gpu.sm}"
    return _outcome("compile", {"engine": out.engine, "draft_engine": out.draft_engine}, detail)


def _package(spec: BuildSpec, out: BuildOutputs, opts: BuildOptions, force: bool) -> StageOutcome:
    lay = out.layout
    backend = runtime_of(spec)
    inputs = PackageInputs(
        checkpoint=out.checkpoint.path, tokenizer=out.checkpoint.path,
        draft_checkpoint=out.draft_checkpoint.path if out.draft_checkpoint else None,
        engine=out.engine.path if out.engine else None,
        draft_engine=out.draft_engine.path if out.draft_engine else None,
        build_id=lay.build_id, name=lay.repo_name, spec_key=lay.spec_key,
    )
    out.triton_repo = package(spec, inputs, force=force, verify=opts.verify)
    note = backend.repo_note
    return _outcome("package", {"triton_repo": out.triton_repo}, f"{note} model" if note else "")


def _set_layout(spec: BuildSpec, out: BuildOutputs) -> None:
    out.layout = BuildLayout(
        build_id=out.checkpoint.manifest.build_id, target=spec.target, spec_key=spec.identity("package"),
        draft_build_id=out.draft_checkpoint.manifest.build_id if out.draft_checkpoint else None,
        runtime=spec.runtime,
    )


_ABSENT: dict[str, tuple[type[PipelineError], str]] = {
    "calibrate": (CalibrationError, "no current target checkpoint for {model} {precision} with these inputs "
                  "(none recorded for this spec); run `invoke build` (or `invoke calibrate`) first"),
    "compile": (CompileError, "no current target engine for {model} {precision} (none recorded for this spec); run "
                "`invoke compile` or `invoke build` on a GPU host first"),
    "package": (PackageError, "no current Triton repository for {model} {precision} (none recorded for this spec); "
                "run `invoke package` or `invoke build` first"),
}


def _locate(spec: BuildSpec, stage: str, out: BuildOutputs, verify: bool) -> None:
    """Fill `out` with `stage`'s outputs from its build ref (check-only; nothing recomputed from this host).

    Raises:
        CalibrationError/CompileError/PackageError: nothing recorded, or stale (the message says why and what to
            run); IntegrityError (exit 3): an output differs from its manifest.
    """
    error, absent = _ABSENT[stage]
    found = lookup(stage, spec, verify=verify)
    if found.state == "found":
        for role, res in found.results.items():
            setattr(out, role, res)
        found = _chained(stage, out) or found
    if found.problems:
        raise integrity_error(found.path, list(found.problems), fix=f"re-run `invoke build --force {stage}`")
    if found.state == "absent":
        raise error(absent.format(model=spec.model.name, precision=spec.quantization.precision))
    if found.state == "stale":
        raise error(f"the {stage} output recorded for {spec.model.name} {spec.quantization.precision} is stale "
                    f"({found.reason}); run `invoke build`", path=found.path)
    if stage == "calibrate":
        _set_layout(spec, out)


def _chained(stage: str, out: BuildOutputs) -> Lookup | None:
    """A stale lookup when `stage`'s located output was made from another upstream output than the one located."""
    if stage == "compile" and out.engine.manifest.checkpoint.key != out.checkpoint.manifest.key:
        return Lookup("stale", reason=f"{out.engine.path} was compiled from another checkpoint", path=out.engine.path)
    if stage == "package" and out.triton_repo.manifest.build_id != out.checkpoint.manifest.build_id:
        return Lookup("stale", reason=f"{out.triton_repo.path} packages another build", path=out.triton_repo.path)
    return None


def _check(spec: BuildSpec, *, preflight_compile: bool) -> tuple[StageOutcome, Any]:
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


_ADAPTERS = {"download": _download, "calibrate": _calibrate, "compile": _compile, "package": _package}

# ---------------------------------------------------------------------------------------------------------------


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
    chain = _chain(spec, until or STAGES[-1])
    n = 1 + len([s for s in chain if s in run])
    # check (spec validation + compile preflight) always runs first, outside the lock, even with --from: it is
    # instant, guards every stage, and leaves nothing behind when the build is impossible.
    say(f"[1/{n}] check: {_doing('check', spec)} ...")
    t0 = time.perf_counter()
    oc, toolchain = _check(spec, preflight_compile="compile" in run)
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
        outcomes += _run_chain(spec, chain, run, forced, out, options, toolchain, n=n, say=say)
    total = time.perf_counter() - t_start
    report = BuildReport(spec.summary(), spec.target, out.build_id, outcomes, total, out, search, spec)
    say(f"build {'unchanged' if report.noop else 'done'}: {out.build_id or '-'} in {total:.2f}s")
    return report


def _choose_precision(spec: BuildSpec, run: list[str], options: BuildOptions,
                      say: Callable[[str], None]) -> tuple[BuildSpec, PrecisionSearch]:
    """`precision: auto`: fetch (or locate) the model, calibrate the candidates (`choose_precision`), and return the
    spec at the chosen precision with its limits chosen and its fit checked again, and what was measured."""
    fetched = BuildOutputs()
    _download(spec, fetched, options, False, "download" not in run)
    choice = choose_precision(spec, source=fetched.download, verify=options.verify, say=say)
    chosen = check_spec_fits(choose_limits(choice.spec))
    for w in chosen.warnings:
        if w not in spec.warnings:  # the stand-in precision's were printed with the spec
            say(f"warning: {w}")
    return chosen, choice.record


def _chain(spec: BuildSpec, last: str) -> list[str]:
    """The backend's stages after check up to `last` (compile only for trtllm engines)."""
    return [s for s in STAGES[1 : STAGES.index(last) + 1] if s in runtime_of(spec).stages]


def _run_chain(spec: BuildSpec, chain: list[str], run: list[str], forced: set[str], out: BuildOutputs,
               options: BuildOptions, toolchain: Any, *, n: int, say: Callable[[str], None]) -> list[StageOutcome]:
    """Run the stages of `chain` that are in `run` (pointing each one's build ref at what it returned), locate the
    others (check-only, from their refs); the outcomes of those run.

    A compile stage in `run` that the spec does not have is reported skipped in its place, without a `[k/n]`
    counter (n counts the stages that run)."""
    outcomes: list[StageOutcome] = []
    i = 1
    skip_compile = "compile" in run and not runtime_of(spec).compiles
    for stage in sorted({*chain, "compile"} if skip_compile else chain, key=STAGES.index):
        if stage == "compile" and skip_compile:
            reason = runtime_of(spec).no_compile
            outcomes.append(StageOutcome("compile", "skipped", 0.0, detail=reason))
            say(f"compile: skipped ({reason})")
            continue
        if stage not in run:
            _locate_or_check(spec, stage, out, options)
            continue
        i += 1
        say(f"[{i}/{n}] {stage}: {_doing(stage, spec)} ...")
        t0 = time.perf_counter()
        extra = {"toolchain": toolchain} if stage == "compile" else {}
        oc = _ADAPTERS[stage](spec, out, options, stage in forced, **extra)
        oc.elapsed_s = round(time.perf_counter() - t0, 3)
        if stage in ROLES:
            write_ref(stage, spec.identity(stage), {role: getattr(out, role) for role in ROLES[stage]}, say=say)
        outcomes.append(oc)
        detail = f" ({oc.detail})" if oc.detail else ""
        say(f"[{i}/{n}] {stage}: {oc.status}{detail} in {oc.elapsed_s:.2f}s")
    return outcomes


def _locate_or_check(spec: BuildSpec, stage: str, out: BuildOutputs, options: BuildOptions) -> None:
    """A stage that is not run: download is asked check-only, the others follow their build ref."""
    if stage == "download":
        _download(spec, out, options, False, True)
    else:
        _locate(spec, stage, out, options.verify)


def _doing(stage: str, spec: BuildSpec) -> str:
    if stage == "download":
        return _fetching(spec)
    q, backend = spec.quantization, runtime_of(spec)
    note = backend.repo_note
    return {
        "check": "validating spec" + (" and GPU/toolchain preflight" if backend.compiles else ""),
        "calibrate": f"{q.precision} / KV {q.kv} quantization, quality gate, {backend.checkpoint.export_label}",
        "compile": f"trtllm-build tp={spec.parallelism.tp} pp={spec.parallelism.pp} for {spec.hardware.gpu}",
        "package": f"Triton model repository ({spec.target}" + (f", {note} model)" if note else ")"),
    }[stage]


def _fetching(spec: BuildSpec) -> str:
    """The download progress line: each model is either cached (checked from manifests and stats) or fetched."""
    return " + ".join(f"{e.repo_id}@{e.revision} cached" if download_is_cached(e)
                      else f"fetching {e.repo_id}@{e.revision}" for e in (spec.model, spec.draft_model) if e)


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
