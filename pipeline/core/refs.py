"""Build refs: a finished stage's pointer from a spec identity to its outputs (as huggingface_hub keeps
`refs/<revision>` -> commit).

    engines/.refs/<stage>/<spec identity>.json    {"stage", "identity", "outputs": {role: {"path", "key"}}}

`build` writes a stage's ref when the stage returns (built or cached); serve, bench, release, package and deploy
follow it (`lookup`) and check that what it points at belongs to the spec looked up (its manifest records the same
model, role, precision and KV dtype, or the same spec key and target for a repository) and matches its file table.
An output path is relative, under the stage's area of the output tree (engines/ or triton_repo/), and never leaves it.
A lookup never recomputes a stage key on this host (no re-tokenizing of calibration data, no library versions): it
answers found, stale (with the reason) or absent. Whether an output is still current for this host's inputs is `build`'s question: the stages recompute their
keys and rebuild what changed, then move the ref.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.artifacts import engines_dir, output_root, replace_file, safe_join, triton_repo_dir
from pipeline.core.errors import IntegrityError, PipelineError
from pipeline.core.manifests import CheckpointManifest, EngineManifest, Manifest, RepoManifest, StageResult
from pipeline.core.untrusted import read_bytes

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

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
AREAS = {"calibrate": "engines", "compile": "engines", "package": "triton_repo"}  # where a stage's outputs live


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
    results: dict[str, StageResult[Manifest]] = field(default_factory=dict)
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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def write_ref(stage: RefStage, identity: str, results: Mapping[str, StageResult[Manifest] | None], *,
              say: Callable[[str], None] = _stderr) -> BuildRef:
    """Point `stage`'s ref for `identity` at `results` (role -> result; None roles are left out), atomically.

    Whatever occupies the ref's place and is not a regular file (a directory, FIFO, symlink) is replaced, as it lies
    inside engines/.refs; `say` receives one line naming what was replaced.

    Raises:
        PipelineError: a result outside its stage's area of the output tree, or engines/.refs is a symlink.
    """
    root = output_root()
    outputs = {}
    for role, res in results.items():
        if res is None:
            continue
        if role not in ROLES[stage]:
            raise PipelineError(f"{role!r} is not an output of stage {stage}; roles: {', '.join(ROLES[stage])}")
        path = Path(os.path.abspath(res.path))  # lexical: engines/ may be a symlink to another disk
        rel = PurePosixPath(path.relative_to(root).as_posix()) if path.is_relative_to(root) else None
        if rel is None or rel.parts[:1] != (AREAS[stage],):
            raise PipelineError(f"{stage} output {path} is outside {root / AREAS[stage]}; a build ref points only "
                                "inside the output tree (set PIPELINE_ROOT to the tree that holds it)", path=path)
        outputs[role] = OutputRef(path=rel.as_posix(), key=res.manifest.key)
    ref = BuildRef(stage=stage, identity=identity, outputs=outputs)
    dest = ref_path(stage, identity)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _clear(dest, say)
    replace_file(dest, lambda tmp: tmp.write_text(ref.model_dump_json(indent=2) + "\n"))
    return ref


def _clear(dest: Path, say: Callable[[str], None]) -> None:
    """Remove what sits at the ref path `dest` when it is not a regular file, once engines/.refs/<stage> is ours
    (real directories, not symlinks)."""
    if not os.path.lexists(dest) or (dest.is_file() and not dest.is_symlink()):
        return
    if dest.parent.is_symlink() or dest.parent.parent.is_symlink():
        raise PipelineError(f"{dest} is not a regular file and {dest.parent} is reached through a symlink; remove "
                            "it yourself, then re-run", path=dest)
    kind = "symlink" if dest.is_symlink() else "directory" if dest.is_dir() else "special file"
    if kind == "directory":
        shutil.rmtree(dest)
    else:
        dest.unlink()
    say(f"warning: replaced the {kind} at {dest} with the build ref")


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


def lookup(stage: RefStage, spec: BuildSpec, *, verify: bool = False) -> Lookup:
    """Follow `stage`'s ref for `spec` and check what it points at: it belongs to `spec` (`mismatches`) and matches
    its manifest's file table (sizes and mtimes, every sha256 with `verify`). Nothing is recomputed from this host
    and nothing is written.

    Raises:
        IntegrityError: the ref points outside the stage's area of the output tree, or at an output built for
            another spec (the message names the ref, the output and what differs; `invoke build` rewrites it).
    """
    identity = spec.identity(stage)
    ref = read_ref(stage, identity)
    if ref is None:
        return Lookup("absent", reason=f"no {stage} output recorded for this spec")
    source = ref_path(stage, identity)
    results: dict[str, StageResult[Manifest]] = {}
    for role, out in ref.outputs.items():
        kind = ROLES[stage].get(role)
        if kind is None:
            return Lookup("stale", reason=f"the ref names an unknown {stage} output {role!r}")
        path = _output_dir(source, stage, out.path)
        m = kind.read(path, strict=False)
        if m is None:
            return Lookup("stale", reason=f"{path} is gone or has no readable manifest", path=path)
        if m.key != out.key:
            return Lookup("stale", reason=f"{path} was rebuilt for other inputs since the ref was written", path=path)
        differs = mismatches(role, m, spec)
        if differs:
            raise IntegrityError(f"build ref {source} points {role} at {path}, which was built for {'; '.join(differs)}"
                                 "; run `invoke build` to rebuild this spec's output and rewrite the ref",
                                 path=source, actual=differs)
        problems = m.problems(path, full=verify)
        if problems:
            return Lookup("stale", reason=f"{path} differs from its manifest", path=path, problems=tuple(problems))
        results[role] = StageResult(path, m, "cached")
    return Lookup("found", results=results)


def _output_dir(source: Path, stage: str, recorded: str) -> Path:
    """The directory a ref's output path names: relative, under the stage's area (engines/ or triton_repo/, not
    engines/.refs), and still inside that area once symlinks are followed."""
    rel = PurePosixPath(recorded)
    area = AREAS[stage]
    if rel.is_absolute() or ".." in rel.parts or len(rel.parts) < 2 or rel.parts[0] != area or \
            rel.parts[1] == REFS_DIR:
        raise IntegrityError(f"build ref {source} points at {recorded!r}, not a directory under {area}/ of the output "
                             "tree; run `invoke build` to rewrite it", path=source, actual=recorded)
    base = triton_repo_dir() if area == "triton_repo" else engines_dir()
    try:
        return safe_join(base, *rel.parts[1:])
    except PipelineError:
        raise IntegrityError(f"build ref {source} points at {recorded!r}, a symlink out of {base}; run `invoke "
                             "build` to rewrite it", path=source, actual=recorded) from None


def mismatches(role: str, m: Manifest, spec: BuildSpec) -> list[str]:
    """How output `m` (in `role`) records other spec inputs than `spec`'s, e.g. "precision bf16 (this spec: fp8)";
    [] when it belongs to `spec`. A checkpoint or engine may serve several specs (with or without a draft): what it
    records is compared, not a spec hash; a repository records the whole spec's key."""
    draft = role.startswith("draft")
    entry = spec.quantized_draft if draft else spec.model  # an EAGLE-3 head has no checkpoint or engine
    claims: dict[str, tuple[Any, Any]]
    if isinstance(m, RepoManifest):
        claims = {"spec key": (m.spec_key, spec.identity("package")), "target": (m.target, spec.target),
                  "runtime": (m.runtime, spec.runtime)}
    else:
        want = {"role": "draft" if draft else "target", "model": entry.name if entry else None,
                "precision": spec.draft_precision if draft and entry else spec.quantization.precision,
                "kv_cache": spec.quantization.kv}
        if isinstance(m, CheckpointManifest):
            got = {"role": m.role, "model": m.model.name, "precision": m.recipe.precision,
                   "kv_cache": m.recipe.kv_cache}
        else:
            e = cast(EngineManifest, m)  # ROLES: a checkpoint, engine or repository
            got = {"role": e.role, "model": e.model, "precision": e.precision, "kv_cache": e.kv_cache}
        claims = {name: (got[name], want[name]) for name in want}
    return [f"{name} {got} (this spec: {want})" for name, (got, want) in claims.items() if got != want]
