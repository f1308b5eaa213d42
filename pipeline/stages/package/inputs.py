"""What `package` reads: the directories a caller gives, the rest located from the earlier stages' current outputs
(never built)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.errors import PackageError
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec

@dataclass(frozen=True)
class PackageInputs:
    """Directories and names the package step reads (None: not given; the layout says which it needs).

    `output` is the directory the repository is published under; `build_id`, `name` and `spec_key` name it (see
    `pipeline.stages.package.package.repo_path`).
    """

    checkpoint: Path | None = None
    draft_checkpoint: Path | None = None
    engine: Path | None = None
    draft_engine: Path | None = None
    tokenizer: Path | None = None
    draft_tokenizer: Path | None = None
    output: Path | None = None
    build_id: str | None = None
    name: str | None = None
    spec_key: str | None = None

    @classmethod
    def of(cls, flags: Mapping[str, Any]) -> PackageInputs:
        """The directories `invoke package`'s typed flags name (`--engine-dir` and the like; empty or absent: None)."""

        def path(flag: str) -> Path | None:
            return Path(flags[flag]) if flags.get(flag) else None

        return cls(output=path("output"), engine=path("engine_dir"), draft_engine=path("draft_engine_dir"),
                   checkpoint=path("checkpoint_dir"), draft_checkpoint=path("draft_checkpoint_dir"),
                   tokenizer=path("tokenizer_dir"), draft_tokenizer=path("draft_tokenizer_dir"))


def package_inputs(spec: BuildSpec, given: PackageInputs) -> PackageInputs:
    """`given`, with what it leaves out located: when the directory the spec's runtime packages from (engine or
    checkpoint) is not given, the stage before `package` must be current, and the repository takes the build
    layout's name (`build_id` set); otherwise only the given directories count.

    Raises:
        PipelineError: the stage before `package` has no current output (the message says what to run).
    """
    from pipeline.stages.build import locate_outputs

    row = runtime_of(spec)
    if (given.engine if row.package_from == "engine" else given.checkpoint) is not None:
        return given
    served_stage = row.stages[row.stages.index("package") - 1]  # the stage whose output it serves
    out = locate_outputs(spec, until=served_stage)
    lay, ckpt = out.layout, out.checkpoint
    if lay is None or ckpt is None:  # locate_outputs raises when the build is not current
        raise PackageError(f"the located build of {spec.model.name} has no checkpoint; run `invoke build --until "
                           f"{served_stage}`")
    draft_ckpt, engine, draft_engine = out.draft_checkpoint, out.engine, out.draft_engine
    return replace(
        given, build_id=lay.build_id, name=lay.repo_name, spec_key=lay.spec_key,
        checkpoint=given.checkpoint or ckpt.path, tokenizer=given.tokenizer or ckpt.path,
        draft_checkpoint=given.draft_checkpoint or (draft_ckpt.path if draft_ckpt else None),
        engine=given.engine or (engine.path if engine else None),
        draft_engine=given.draft_engine or (draft_engine.path if draft_engine else None),
    )
