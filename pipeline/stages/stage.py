"""The one interface of a build stage after `check`, and the typed record the stages hand on to each other.

    Stage.identity(spec)                      what its output is found by (a build-ref identity, or None)
    Stage.locate(spec, outputs, options)      check-only: find the current output, recompute nothing
    Stage.run(spec, outputs, options, force)  build it, or return the cached output (a report row)

A stage reads earlier stages' results from `BuildOutputs` and records its own there. `pipeline.stages.build` runs
them in the order of the runtime row's stage list (`pipeline.core.runtimes`); each stage's object lives beside its
public function (`download.stage.DOWNLOAD`, `calibrate.stage.CALIBRATE`, `compile.stage.COMPILE`,
`package.stage.PACKAGE`). `RefLocated` is the locate of a stage whose output is found by its build ref.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pipeline.core.errors import BuildError, PipelineError
from pipeline.core.layout import BuildLayout
from pipeline.core.manifests import (CheckpointManifest, DownloadManifest, EngineManifest, RepoManifest, StageResult,
                                      integrity_error)
from pipeline.core.refs import Lookup, RefStage, lookup
from pipeline.core.spec import BuildSpec

if TYPE_CHECKING:
    from pipeline.stages.compile.preflight import Toolchain


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
class BuildOptions:
    offline: bool = False
    update: bool = False
    verify_download: bool = False
    verify: bool = False  # re-hash every stage's outputs (sha256), not only sizes and mtimes
    endpoint: str | None = None
    token: str | None = None
    revision: str | None = None


@dataclass
class BuildOutputs:
    """The typed results the stages returned, and the build's layout (what serve, bench and release use)."""

    layout: BuildLayout | None = None
    download: StageResult[DownloadManifest] | None = None
    draft_download: StageResult[DownloadManifest] | None = None
    checkpoint: StageResult[CheckpointManifest] | None = None
    draft_checkpoint: StageResult[CheckpointManifest] | None = None
    engine: StageResult[EngineManifest] | None = None
    draft_engine: StageResult[EngineManifest] | None = None
    triton_repo: StageResult[RepoManifest] | None = None
    toolchain: Toolchain | None = None  # what the check stage's preflight found (compile builds with it)

    @property
    def build_id(self) -> str | None:
        return self.layout.build_id if self.layout else None

    def results(self) -> dict[str, StageResult[Any]]:
        """role -> result, for every stage output found or built."""
        return {k: v for k, v in vars(self).items() if isinstance(v, StageResult)}

    def paths(self) -> dict[str, str]:
        return {k: str(r.path) for k, r in self.results().items()}

    def calibrated(self, stage: str) -> tuple[BuildLayout, StageResult[CheckpointManifest]]:
        """The layout and target checkpoint that `stage` (after calibrate) builds from.

        Raises:
            BuildError: calibrate has not run or been located before `stage` (a stage list out of order).
        """
        if self.layout is None or self.checkpoint is None:
            raise BuildError(f"{stage} needs the calibrated checkpoint; run `invoke build --until calibrate` first")
        return self.layout, self.checkpoint

    def set_layout(self, spec: BuildSpec) -> None:
        """The build's layout, named by the target checkpoint (and the draft's) once calibrate found or built it."""
        if self.checkpoint is None:
            raise BuildError("the build's layout is named by the target checkpoint; calibrate first")
        self.layout = BuildLayout(
            build_id=self.checkpoint.manifest.build_id, target=spec.target, spec_key=spec.identity("package"),
            draft_build_id=self.draft_checkpoint.manifest.build_id if self.draft_checkpoint else None,
            runtime=spec.runtime,
        )


@runtime_checkable
class Stage(Protocol):
    """A build stage after `check`: found by `identity`, located check-only, or run (built or cached)."""

    @property
    def name(self) -> str:
        """Its name in `pipeline.stages.build.STAGES` and the runtime rows' stage lists."""
        ...

    def identity(self, spec: BuildSpec) -> str | None:
        """The build-ref identity its output is found by; None: a cache found by its own key (no build ref)."""
        ...

    def doing(self, spec: BuildSpec) -> str:
        """The words of its progress line before it runs."""
        ...

    def locate(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions) -> None:
        """Record its current output in `outputs`, check-only (nothing built, fetched or recomputed).

        Raises:
            PipelineError: nothing current (the message says what to run); IntegrityError (exit 3): an output
                differs from its manifest.
        """
        ...

    def run(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions, *, force: bool) -> StageOutcome:
        """Build its output from `outputs` (or reuse the current one; `force`: rebuild), record it there and
        return its report row."""
        ...


def outcome(stage: str, results: Mapping[str, StageResult[Any] | None], detail: str = "") -> StageOutcome:
    """The report row of a stage that returned `results` (role -> result; None: a role it has not)."""
    found = {role: r for role, r in results.items() if r is not None}
    status = "built" if any(r.built for r in found.values()) else "cached"
    return StageOutcome(stage, status, 0.0, paths={role: str(r.path) for role, r in found.items()},
                        keys={role: r.manifest.key for role, r in found.items()}, detail=detail)


class RefLocated:
    """A stage whose output is found by its build ref (`pipeline.core.refs`): `identity` and check-only `locate`."""

    name: ClassVar[RefStage]
    error: ClassVar[type[PipelineError]]  # what `locate` raises when nothing current is recorded
    absent: ClassVar[str]  # its message when nothing is recorded ({model}, {precision})

    def identity(self, spec: BuildSpec) -> str:
        return spec.identity(self.name)

    def chained(self, outputs: BuildOutputs) -> Lookup | None:
        """A stale lookup when the located output was made from another upstream output than the one located."""
        return None

    def locate(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions) -> None:
        """Follow the build ref and record what it points at in `outputs` (all sha256 with `options.verify`).

        Raises:
            the stage's `error`: nothing recorded, or stale (the message says why and what to run);
            IntegrityError (exit 3): an output differs from its manifest.
        """
        found = lookup(self.name, spec, verify=options.verify)
        if found.state == "found":
            for role, res in found.results.items():
                setattr(outputs, role, res)
            found = self.chained(outputs) or found
        if found.problems:
            assert found.path is not None, "a lookup with problems names the output"
            raise integrity_error(found.path, list(found.problems), fix=f"re-run `invoke build --force {self.name}`")
        model, precision = spec.model.name, spec.quantization.precision
        if found.state == "absent":
            raise self.error(self.absent.format(model=model, precision=precision))
        if found.state == "stale":
            raise self.error(f"the {self.name} output recorded for {model} {precision} is stale ({found.reason}); "
                             "run `invoke build`", path=found.path)
