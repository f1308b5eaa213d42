"""What `package` reads: the directories given, the rest located from the earlier stages' current outputs (never
built)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.stages.package.repository import PackageInputs


@dataclass(frozen=True)
class PackageDirs:
    """The directories a caller names (None: located, or not needed by the backend)."""

    output: str | None = None
    engine_dir: str | None = None
    draft_engine_dir: str | None = None
    checkpoint_dir: str | None = None
    draft_checkpoint_dir: str | None = None
    tokenizer_dir: str | None = None
    draft_tokenizer_dir: str | None = None

    @classmethod
    def of(cls, values: dict[str, Any]) -> PackageDirs:
        """The fields of `values` (a task's typed flags) this class has."""
        return cls(**{f.name: values.get(f.name) for f in fields(cls)})


def _path(p: str | Path | None) -> Path | None:
    return Path(p) if p else None


def package_inputs(spec: BuildSpec, given: PackageDirs) -> PackageInputs:
    """`given`, with what it leaves out located: when the directory the spec's runtime packages from (engine or
    checkpoint) is not given, the stage before `package` must be current, and the repository takes the build
    layout's name (`build_id` set); otherwise only the given directories count."""
    from pipeline.stages.build import locate_outputs

    row = runtime_of(spec)
    d = {f.name: getattr(given, f.name) for f in fields(given)}
    explicit = d["engine_dir"] if row.package_from == "engine" else d["checkpoint_dir"]
    naming: dict[str, Any] = {}
    if explicit is None:
        served_stage = row.stages[row.stages.index("package") - 1]  # the stage whose output it serves
        out = locate_outputs(spec, until=served_stage)
        lay = out.layout
        naming = dict(build_id=lay.build_id, name=lay.repo_name, spec_key=lay.spec_key)
        d["checkpoint_dir"] = d["checkpoint_dir"] or out.checkpoint.path
        d["tokenizer_dir"] = d["tokenizer_dir"] or out.checkpoint.path
        if out.draft_checkpoint is not None:
            d["draft_checkpoint_dir"] = d["draft_checkpoint_dir"] or out.draft_checkpoint.path
        if out.engine is not None:
            d["engine_dir"] = d["engine_dir"] or out.engine.path
            d["draft_engine_dir"] = d["draft_engine_dir"] or (out.draft_engine.path if out.draft_engine else None)
    return PackageInputs(
        output=_path(d["output"]), engine=_path(d["engine_dir"]), draft_engine=_path(d["draft_engine_dir"]),
        checkpoint=_path(d["checkpoint_dir"]), draft_checkpoint=_path(d["draft_checkpoint_dir"]),
        tokenizer=_path(d["tokenizer_dir"]), draft_tokenizer=_path(d["draft_tokenizer_dir"]), **naming,
    )
