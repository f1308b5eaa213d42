"""One-command build: check → download → calibrate → compile (target trtllm) or reference → package.

Every stage owns its cache (its output dir's `manifest.json` records `key`, the hash of exactly its inputs), so a
finished build re-run reads manifests only and a changed input rebuilds just the stages downstream of it. This module
only sequences the stages, validates everything first (spec + the compile preflight for target trtllm, so an
impossible build fails in well under a second before any download), serializes concurrent builds of the same spec
on a file lock, prints one progress line per stage, and returns a machine-readable report.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import MANIFEST, engines_dir, read_manifest, stage_lock
from .errors import PipelineError
from .spec import BuildSpec

STAGES = ("check", "download", "calibrate", "compile", "package")


class BuildError(PipelineError):
    """The build options are inconsistent, or a stage output needed by --from is missing."""


@dataclass
class StageOutcome:
    stage: str
    status: str  # "built" | "cached" | "skipped" | "ok"
    elapsed_s: float
    paths: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str | None] = field(default_factory=dict)
    detail: str = ""


@dataclass
class BuildOutputs:
    """Where a build's outputs are (what `release` packs)."""

    build_id: str | None = None
    source: Path | None = None
    draft_source: Path | None = None
    checkpoint: Path | None = None
    draft_checkpoint: Path | None = None
    engine: Path | None = None
    draft_engine: Path | None = None
    triton_repo: Path | None = None
    tokenizer: Path | None = None
    manifests: dict[str, dict[str, Any] | None] = field(default_factory=dict)


@dataclass
class BuildReport:
    summary: str
    target: str
    build_id: str | None
    stages: list[StageOutcome]
    total_s: float
    outputs: BuildOutputs

    @property
    def noop(self) -> bool:
        """True when no stage did any work (everything was current)."""
        return all(s.status in ("cached", "skipped", "ok") for s in self.stages)

    def as_dict(self) -> dict[str, Any]:
        out = {k: str(v) for k, v in asdict(self.outputs).items() if k != "manifests" and v is not None}
        return {
            "summary": self.summary,
            "target": self.target,
            "build_id": self.build_id,
            "noop": self.noop,
            "total_s": round(self.total_s, 3),
            "stages": [asdict(s) for s in self.stages],
            "outputs": out,
        }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stage_range(*, until: str | None, from_stage: str | None, force: str | None, target: str) -> list[str]:
    """The stages to execute, validated. Raises BuildError for unknown names or an empty/inverted range."""
    for name, value in (("--until", until), ("--from", from_stage), ("--force", force)):
        if value is not None and value not in STAGES:
            raise BuildError(f"{name} {value!r} is not a stage; stages: {', '.join(STAGES)}")
    if force == "compile" and target != "trtllm":
        raise BuildError("--force compile: target=reference has no compile stage; use --target trtllm")
    lo = STAGES.index(from_stage) if from_stage else 0
    hi = STAGES.index(until) if until else len(STAGES) - 1
    if lo > hi:
        raise BuildError(f"--from {from_stage} comes after --until {until}; stages run in order {' → '.join(STAGES)}")
    if force is not None and not lo <= STAGES.index(force) <= hi:
        raise BuildError(f"--force {force} is outside the stages being run ({STAGES[lo]}..{STAGES[hi]})")
    return list(STAGES[lo : hi + 1])


def _status(directory: Path | None, started_ns: int) -> str:
    """"cached" when the stage's manifest predates this call (the stage did nothing), else "built"."""
    p = Path(directory) / MANIFEST if directory is not None else None
    if p is None or not p.is_file():
        return "built"
    # File-system timestamps are coarse (a few ms): a manifest written by this call is never older than 20 ms
    # before it started.
    return "cached" if p.stat().st_mtime_ns < started_ns - 20_000_000 else "built"


# ---------------------------------------------------------------------------------------------------------------
# Stage adapters (each calls the stage's public API; they own caching, locks and atomic outputs).


@dataclass
class BuildOptions:
    offline: bool = False
    update: bool = False
    verify_download: bool = False
    endpoint: str | None = None
    token: str | None = None
    revision: str | None = None


def _download(spec: BuildSpec, out: BuildOutputs, opts: BuildOptions, force: bool, located: bool) -> StageOutcome:
    from .download import download_model

    outcome = StageOutcome("download", "cached", 0.0)
    statuses = []
    for role, entry in (("model", spec.model), ("draft", spec.draft_model)):
        if entry is None:
            continue
        kwargs: dict[str, Any] = dict(
            offline=opts.offline or located,
            update=opts.update and not located,
            verify=opts.verify_download or force,
        )
        if role == "model" and opts.revision:
            kwargs["revision"] = opts.revision
        if opts.endpoint:
            kwargs["endpoint"] = opts.endpoint
        if opts.token:
            kwargs["token"] = opts.token
        res = download_model(entry, **kwargs)
        path = Path(res.path)
        statuses.append("built" if res.status in ("downloaded", "generated") else "cached")
        manifest = res.manifest
        key = "download" if role == "model" else "draft_download"
        out.manifests[key] = manifest
        if role == "model":
            out.source = path
        else:
            out.draft_source = path
        outcome.paths[role] = str(path)
        outcome.keys[role] = (manifest or {}).get("key")
        outcome.detail += f"{entry.name}@{res.sha[:12]} "
    outcome.status = "built" if "built" in statuses else "cached"
    outcome.detail = outcome.detail.strip()
    return outcome


def _calibrate(spec: BuildSpec, out: BuildOutputs, force: bool, located: bool = False) -> StageOutcome:
    """Run (or, with `located`, only find the current) calibrate outputs of the target and the draft."""
    from .calibrate import run_calibrate

    outcome = StageOutcome("calibrate", "cached", 0.0)
    statuses = []
    for role, source in (("target", out.source), ("draft", out.draft_source)):
        if role == "draft" and spec.draft_model is None:
            continue
        res = run_calibrate(spec, role=role, force=force, source_dir=source, check_only=located)
        path = Path(res.path)
        manifest = res.manifest
        statuses.append(res.status)
        if role == "target":
            out.checkpoint, out.build_id = path, res.build_id
            out.manifests["checkpoint"] = manifest
            tok = path / "tokenizer"
            out.tokenizer = tok if tok.is_dir() else None
        else:
            out.draft_checkpoint = path
            out.manifests["draft_checkpoint"] = manifest
        outcome.paths[role] = str(path)
        outcome.keys[role] = (manifest or {}).get("key")
        gate = (manifest or {}).get("quality_gate") or (manifest or {}).get("quality")
        if isinstance(gate, dict):
            delta = gate.get("ppl_delta_pct", gate.get("delta_pct"))
            if delta is not None:
                outcome.detail += f"{role} ppl Δ {float(delta):+.2f}% "
    outcome.status = "built" if "built" in statuses else "cached"
    outcome.detail = outcome.detail.strip()
    return outcome


def _compile(spec: BuildSpec, out: BuildOutputs, force: bool, toolchain: Any = None) -> StageOutcome:
    from .compile import run_compile

    engine_dir = engines_dir() / str(out.build_id) / "engine"
    draft_dir = engine_dir.parent / "draft_engine" if out.draft_checkpoint is not None else None
    started = time.time_ns()
    manifest = run_compile(
        spec, checkpoint_dir=out.checkpoint, output_dir=engine_dir, draft_checkpoint_dir=out.draft_checkpoint,
        draft_output_dir=draft_dir, force=force, toolchain=toolchain,
    )
    out.engine, out.draft_engine = engine_dir, draft_dir
    out.manifests["engine"] = manifest
    if draft_dir is not None:
        out.manifests["draft_engine"] = read_manifest(draft_dir)
    outcome = StageOutcome("compile", _status(engine_dir, started), 0.0, paths={"engine": str(engine_dir)},
                           keys={"engine": manifest.get("key")})
    tc = manifest.get("toolchain") or {}
    outcome.detail = f"TensorRT-LLM {tc.get('tensorrt_llm')}, SM {(manifest.get('gpu') or {}).get('sm')}"
    if draft_dir is not None:
        outcome.paths["draft_engine"] = str(draft_dir)
        outcome.keys["draft_engine"] = (out.manifests["draft_engine"] or {}).get("key")
    return outcome


def _package(spec: BuildSpec, out: BuildOutputs, force: bool) -> StageOutcome:
    from .triton import package_repo

    kwargs: dict[str, Any] = dict(build_id=out.build_id, checkpoint_dir=out.checkpoint,
                                  draft_checkpoint_dir=out.draft_checkpoint, engine_dir=out.engine,
                                  draft_engine_dir=out.draft_engine, tokenizer_dir=out.tokenizer, force=force)
    res = package_repo(spec, **kwargs)
    path = Path(res.path)
    out.triton_repo = path
    out.manifests["triton_repo"] = res.manifest
    status = "cached" if res.reused else "built"
    return StageOutcome("package", status, 0.0, paths={"triton_repo": str(path)},
                        keys={"triton_repo": (out.manifests["triton_repo"] or {}).get("key")})


def _check(spec: BuildSpec) -> tuple[StageOutcome, Any]:
    """The spec is validated by resolve_spec; for target trtllm also run the compile preflight (< 1 s on CPU)."""
    if spec.target != "trtllm":
        return StageOutcome("check", "ok", 0.0, detail="spec ok; reference target (PyTorch backend, no engines)"), None
    from .compile.preflight import preflight

    world = spec.parallelism.world_size
    tc = preflight(gpu=spec.hardware.gpu, workers=max(1, min(world, spec.hardware.gpu_count)))
    detail = f"spec ok; TensorRT-LLM {tc.tensorrt_llm}, TensorRT {tc.tensorrt}, {tc.gpu_count}x {tc.gpu_name}"
    return StageOutcome("check", "ok", 0.0, detail=detail), tc


# ---------------------------------------------------------------------------------------------------------------


def build(
    spec: BuildSpec,
    *,
    until: str | None = None,
    from_stage: str | None = None,
    force: str | None = None,
    options: BuildOptions | None = None,
    progress: Callable[[str], None] | None = _stderr,
) -> BuildReport:
    """Run the build chain for `spec`.

    Args:
        until: last stage to run (inclusive).
        from_stage: first stage to run; earlier stages are only *located* (download offline, cached outputs),
            never executed — if one is not current the build fails telling you to drop --from.
        force: rebuild this stage and every later stage even if current.
        options: download options (offline/update/verify/endpoint/token/revision).
        progress: callback for the one-line-per-stage progress (default: stderr); None for silence.

    Raises:
        BuildError: bad --until/--from/--force; PipelineError subclasses from the stages (exit code 2).
    """
    options = options or BuildOptions()
    say = progress or (lambda line: None)
    t_start = time.perf_counter()
    run = stage_range(until=until, from_stage=from_stage, force=force, target=spec.target)
    forced = set(STAGES[STAGES.index(force):]) if force else set()
    out = BuildOutputs()
    outcomes: list[StageOutcome] = []
    last = run[-1]
    # check (spec validation + compile preflight) always runs first, outside the lock, even with --from: it is
    # instant, guards every stage, and leaves nothing behind when the build is impossible.
    chain = [s for s in STAGES[1 : STAGES.index(last) + 1] if not (s == "compile" and spec.target != "trtllm")]
    n = 1 + len([s for s in chain if s in run])
    say(f"[1/{n}] check: {_doing('check', spec)} ...")
    t0 = time.perf_counter()
    oc, toolchain = _check(spec)
    oc.elapsed_s = round(time.perf_counter() - t0, 3)
    outcomes.append(oc)
    say(f"[1/{n}] check: ok ({oc.detail}) in {oc.elapsed_s:.2f}s")
    if "calibrate" in chain and "calibrate" not in run:
        _require_checkpoints(spec)
    i = 1
    with stage_lock(engines_dir() / f"build-{spec.fingerprint()[:16]}"):
        for stage in chain:
            located = stage not in run
            if not located:
                i += 1
                say(f"[{i}/{n}] {stage}: {_doing(stage, spec)} ...")
            t0 = time.perf_counter()
            f = stage in forced
            if stage == "download":
                oc = _download(spec, out, options, f, located)
            elif stage == "calibrate":
                oc = _calibrate(spec, out, f, located=located)
            elif stage == "compile":
                oc = _compile_located(spec, out) if located else _compile(spec, out, f, toolchain)
            else:
                oc = _package(spec, out, f)
            oc.elapsed_s = round(time.perf_counter() - t0, 3)
            if not located:
                outcomes.append(oc)
                detail = f" ({oc.detail})" if oc.detail else ""
                say(f"[{i}/{n}] {stage}: {oc.status}{detail} in {oc.elapsed_s:.2f}s")
        if spec.target != "trtllm" and "compile" in run:
            at = next((k for k, o in enumerate(outcomes) if o.stage == "package"), len(outcomes))
            outcomes.insert(at, StageOutcome("compile", "skipped", 0.0, detail="target reference: no engines"))
    total = time.perf_counter() - t_start
    report = BuildReport(spec.summary(), spec.target, out.build_id, outcomes, total, out)
    say(f"build {'unchanged' if report.noop else 'done'}: {out.build_id or '-'} in {total:.2f}s")
    return report


def _doing(stage: str, spec: BuildSpec) -> str:
    q = spec.quantization
    return {
        "check": "validating spec" + (" and GPU/toolchain preflight" if spec.target == "trtllm" else ""),
        "download": f"fetching {spec.model.repo_id}@{spec.model.revision}"
        + (f" + {spec.draft_model.repo_id}" if spec.draft_model else ""),
        "calibrate": f"{q.precision} / KV {q.kv} quantization, quality gate, checkpoint export",
        "compile": f"trtllm-build tp={spec.parallelism.tp} pp={spec.parallelism.pp} for {spec.hardware.gpu}",
        "package": f"Triton model repository ({spec.target})",
    }[stage]


def _require_checkpoints(spec: BuildSpec) -> None:
    """Refuse --from past calibrate when no checkpoint exists at all for this model/precision: a cheap look before
    the (offline) download stage is located, which would otherwise generate a tiny model. A stale checkpoint is
    refused by the calibrate stage's check-only call."""
    roles = [("target", spec.model, spec.quantization.precision)]
    if spec.draft_model is not None:
        roles.append(("draft", spec.draft_model, spec.draft_precision))
    for role, entry, precision in roles:
        if not any(engines_dir().glob(f"{entry.name}-{precision}-*/checkpoint/{MANIFEST}")):
            raise BuildError(
                f"no calibrated {role} checkpoint for {entry.name} {precision} under {engines_dir()}; "
                "run `invoke build` (without --from) first"
            )


def _compile_located(spec: BuildSpec, out: BuildOutputs) -> StageOutcome:
    engine = engines_dir() / str(out.build_id) / "engine"
    if read_manifest(engine) is None:
        raise BuildError(f"no engine at {engine}; run `invoke build` without --from first")
    oc = _compile(spec, out, force=False)
    if oc.status != "cached":
        raise BuildError("--from skips compile, but the engine was not current (it had to be rebuilt); drop --from")
    return oc


def locate_outputs(spec: BuildSpec) -> BuildOutputs:
    """The outputs of a finished build of `spec`: download, calibrate and compile must be current (nothing is
    downloaded or calibrated); the package stage is re-run, which is a no-op unless its templates changed."""
    return build(spec, from_stage="package", until="package", progress=None,
                 options=BuildOptions(offline=True)).outputs
