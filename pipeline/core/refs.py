"""Build refs: a finished stage's pointer from a spec identity to its outputs (as huggingface_hub keeps
`refs/<revision>` -> commit).

    engines/.refs/<stage>/<spec identity>.json    {"stage", "identity", "outputs": {role: {"path", "key"}}}

`build` writes a stage's ref when the stage returns (built or cached); serve, bench, release, package and deploy
follow it (`lookup`) and check the file table of what it points at. A lookup never recomputes a stage key on this
host (no re-tokenizing of calibration data, no library versions): it answers found, stale (with the reason) or
absent. Whether an output is still current for this host's inputs is `build`'s question: the stages recompute their
keys and rebuild what changed, then move the ref.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.artifacts import engines_dir, output_root, safe_join
from pipeline.core.errors import PipelineError
from pipeline.core.manifests import CheckpointManifest, EngineManifest, Manifest, RepoManifest, StageResult
from pipeline.core.untrusted import read_bytes

RefStage = Literal["calibrate", "compile", "package"]
REFS_DIR = ".refs"  # hidden: never a build id (those start with a letter or digit)
MAX_REF_BYTES = 64 * 1024
_IDENTITY = re.compile(r"^[0-9a-f]{64}$")

# role (a `BuildOutputs` field) -> the manifest type of that output, per stage.
ROLES: dict[str, dict[str, type[Manifest]]] = {
    "calibrate": {"checkpoint": CheckpointManifest, "draft_checkpoint": CheckpointManifest},
    "compile": {"engine": EngineManifest, "draft_engine": EngineManifest},
    "package": {"triton_repo": RepoManifest},
}


class OutputRef(BaseModel):
    """One output a ref points at: its directory (relative to the output root) and the key its manifest records."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    key: str = Field(min_length=1)


class BuildRef(BaseModel):
    """The pointer a stage leaves for one spec identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    stage: RefStage
    identity: str = Field(pattern=_IDENTITY.pattern)
    outputs: dict[str, OutputRef] = Field(min_length=1)


@dataclass(frozen=True)
class Lookup:
    """What a ref lookup found: `found` (every output intact), `stale` (why, and any file-table differences of
    `path`), or `absent` (no stage of this spec identity has finished here)."""

    state: Literal["found", "stale", "absent"]
    results: dict[str, StageResult] = field(default_factory=dict)
    reason: str = ""
    path: Path | None = None
    problems: tuple[str, ...] = ()


def ref_path(stage: str, identity: str) -> Path:
    """Where the ref of `stage` for a spec identity lives.

    Raises:
        PipelineError: an unknown stage or an identity that is not a sha256 hex digest.
    """
    if stage not in ROLES or not _IDENTITY.match(identity):
        raise PipelineError(f"no build ref for stage {stage!r} and identity {identity!r}; stages: {', '.join(ROLES)}")
    return engines_dir() / REFS_DIR / stage / f"{identity}.json"


def write_ref(stage: RefStage, identity: str, results: Mapping[str, StageResult | None]) -> BuildRef:
    """Point `stage`'s ref for `identity` at `results` (role -> result; None roles are left out), atomically."""
    root = output_root()
    outputs = {}
    for role, res in results.items():
        if res is None:
            continue
        if role not in ROLES[stage]:
            raise PipelineError(f"{role!r} is not an output of stage {stage}; roles: {', '.join(ROLES[stage])}")
        path = Path(res.path).resolve()
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        outputs[role] = OutputRef(path=rel, key=res.manifest.key)
    ref = BuildRef(stage=stage, identity=identity, outputs=outputs)
    dest = ref_path(stage, identity)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_text(ref.model_dump_json(indent=2) + "\n")
    os.replace(tmp, dest)
    return ref


def read_ref(stage: str, identity: str) -> BuildRef | None:
    """The ref of `stage` for `identity`; None when there is none.

    Raises:
        PipelineError: the ref file is not a regular file, oversized or not a ref (the message names it and the
            fix).
    """
    path = ref_path(stage, identity)
    try:
        ref = BuildRef.model_validate_json(read_bytes(path, cap=MAX_REF_BYTES, what=f"build ref {path}",
                                                      fix="delete it and run `invoke build`"))
    except FileNotFoundError:
        return None
    except (ValidationError, ValueError):
        raise PipelineError(f"{path} is not a build ref (corrupt or from another version); delete it and run "
                            "`invoke build`", path=path) from None
    if ref.stage != stage or ref.identity != identity:
        raise PipelineError(f"{path} is the ref of another stage or spec; delete it and run `invoke build`", path=path)
    return ref


def lookup(stage: RefStage, identity: str, *, verify: bool = False) -> Lookup:
    """Follow `stage`'s ref for `identity` and check what it points at against its manifest's file table (sizes and
    mtimes, every sha256 with `verify`). Nothing is recomputed from this host and nothing is written."""
    ref = read_ref(stage, identity)
    if ref is None:
        return Lookup("absent", reason=f"no {stage} output recorded for this spec")
    results: dict[str, StageResult] = {}
    for role, out in ref.outputs.items():
        kind = ROLES[stage].get(role)
        if kind is None:
            return Lookup("stale", reason=f"the ref names an unknown {stage} output {role!r}")
        path = safe_join(output_root(), out.path) if not Path(out.path).is_absolute() else Path(out.path)
        m = kind.read(path, strict=False)
        if m is None:
            return Lookup("stale", reason=f"{path} is gone or has no readable manifest", path=path)
        if m.key != out.key:
            return Lookup("stale", reason=f"{path} was rebuilt for other inputs since the ref was written", path=path)
        problems = m.problems(path, full=verify)
        if problems:
            return Lookup("stale", reason=f"{path} differs from its manifest", path=path, problems=tuple(problems))
        results[role] = StageResult(path, m, "cached")
    return Lookup("found", results=results)
