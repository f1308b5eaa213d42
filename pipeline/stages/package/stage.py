"""The package stage of a build: the repository layout of its runtime × target row (`repository.package`), from
the checkpoints and engines earlier stages located or built."""

from __future__ import annotations

from pipeline.core.errors import PackageError
from pipeline.core.refs import Lookup
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.stages.package.inputs import PackageInputs, served_draft
from pipeline.stages.package.repository import package
from pipeline.stages.stage import BuildOptions, BuildOutputs, RefLocated, StageOutcome, outcome


class PackageStage(RefLocated):
    """The package stage over `package`: the Triton repository of the build's layout."""

    name = "package"
    error = PackageError
    absent = ("no current Triton repository for {model} {precision} (none recorded for this spec); run "
              "`invoke package` or `invoke build` first")

    def doing(self, spec: BuildSpec) -> str:
        note = runtime_of(spec).repo_note
        return f"Triton model repository ({spec.target}" + (f", {note} model)" if note else ")")

    def chained(self, outputs: BuildOutputs) -> Lookup | None:
        repo, checkpoint = outputs.triton_repo, outputs.checkpoint
        if repo is not None and checkpoint is not None and repo.manifest.build_id != checkpoint.manifest.build_id:
            return Lookup("stale", reason=f"{repo.path} packages another build", path=repo.path)
        return None

    def run(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions, *, force: bool) -> StageOutcome:
        layout, checkpoint = outputs.calibrated("package")
        engine, draft_engine = outputs.engine, outputs.draft_engine
        inputs = PackageInputs(
            checkpoint=checkpoint.path, tokenizer=checkpoint.path, draft_checkpoint=served_draft(spec, outputs),
            engine=engine.path if engine else None, draft_engine=draft_engine.path if draft_engine else None,
            build_id=layout.build_id, name=layout.repo_name, spec_key=layout.spec_key,
        )
        outputs.triton_repo = package(spec, inputs, force=force, verify=options.verify)
        note = runtime_of(spec).repo_note
        return outcome("package", {"triton_repo": outputs.triton_repo}, f"{note} model" if note else "")


PACKAGE = PackageStage()
