"""`package`'s inputs located: what a caller leaves out comes from the earlier stages' current outputs (never
built). Imported by the CLI only; the package stage itself gets its inputs from the build."""

from __future__ import annotations

from dataclasses import replace

from pipeline.core.errors import PackageError
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.stages.build import locate_outputs
from pipeline.stages.package.inputs import PackageInputs, served_draft


def package_inputs(spec: BuildSpec, given: PackageInputs) -> PackageInputs:
    """`given`, with what it leaves out located: when the directory the spec's runtime packages from (engine or
    checkpoint) is not given, the stage before `package` must be current, and the repository takes the build
    layout's name (`build_id` set); otherwise only the given directories count.

    Raises:
        PipelineError: the stage before `package` has no current output (the message says what to run).
    """
    row = runtime_of(spec)
    if (given.engine if row.package_from == "engine" else given.checkpoint) is not None:
        return given
    served_stage = row.stages[row.stages.index("package") - 1]  # the stage whose output it serves
    out = locate_outputs(spec, until=served_stage)
    lay, ckpt = out.layout, out.checkpoint
    if lay is None or ckpt is None:  # locate_outputs raises when the build is not current
        raise PackageError(f"the located build of {spec.model.name} has no checkpoint; run `invoke build --until "
                           f"{served_stage}`")
    engine, draft_engine = out.engine, out.draft_engine
    return replace(
        given, build_id=lay.build_id, name=lay.repo_name, spec_key=lay.spec_key,
        checkpoint=given.checkpoint or ckpt.path, tokenizer=given.tokenizer or ckpt.path,
        draft_checkpoint=given.draft_checkpoint or served_draft(spec, out),
        engine=given.engine or (engine.path if engine else None),
        draft_engine=given.draft_engine or (draft_engine.path if draft_engine else None),
    )
