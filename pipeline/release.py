"""Versioned, reproducible release artifacts: engines (or checkpoint), Triton repo, tokenizer, manifests, release.json.

The tarball is deterministic: `release.json` first, then every directory and file in sorted order, with fixed
mtime/uid/gid/owner names, normalised modes, and a gzip header without a file name or time. Two releases built from
the same stage outputs therefore have the same sha256, which is written next to the tarball (`sha256sum -c` format).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .artifacts import MANIFEST, output_root, read_manifest, safe_join, sha256_file
from .errors import PipelineError

if TYPE_CHECKING:
    from .spec import BuildSpec

RELEASE_JSON = "release.json"
RELEASE_FORMAT = 1
# 1980-01-01T00:00:00Z: a fixed, plausible timestamp for every tar entry (tar warns about 1970 dates).
FIXED_MTIME = 315532800
RELEASES_DIR = "releases"


class ReleaseError(PipelineError):
    """A release cannot be assembled from the current stage outputs."""


@dataclass(frozen=True)
class ReleaseResult:
    name: str
    tarball: Path
    sha256: str
    sha256_file: Path
    document: dict[str, Any]


# ---------------------------------------------------------------------------------------------------------------
# Collecting files.


def _walk(source: Path) -> list[Path]:
    """Every file and directory below `source` (sorted); symlinks are refused (they would not verify)."""
    out = []
    for p in sorted(source.rglob("*")):
        if p.is_symlink():
            raise ReleaseError(f"{p} is a symlink; releases hold regular files only, copy the target in its place")
        if p.name.startswith(".tmp-") or p.name.startswith(".old-") or p.suffix == ".lock":
            continue
        out.append(p)
    return out


def collect_files(components: dict[str, Path]) -> dict[str, Path]:
    """Map release-relative paths to source files for `components` (arc dir -> source dir or file)."""
    files: dict[str, Path] = {}
    for arc, source in sorted(components.items()):
        source = Path(source)
        if source.is_file():
            files[arc] = source
            continue
        if not source.is_dir():
            raise ReleaseError(f"release component {arc} is missing ({source}); run `invoke build` first")
        for p in _walk(source):
            if p.is_file():
                files[f"{arc}/{p.relative_to(source).as_posix()}"] = p
    if RELEASE_JSON in files:
        raise ReleaseError(f"a component provides a top-level {RELEASE_JSON}; rename it")
    return files


def collect_empty_dirs(components: dict[str, Path]) -> list[str]:
    """Release-relative directories that hold no released file: Triton needs a model's version directory (e.g.
    `ensemble/1/`, or `tensorrt_llm/1/` with the tensorrtllm backend) even when it is empty."""
    out = []
    for arc, source in sorted(components.items()):
        source = Path(source)
        if source.is_dir():
            walked = _walk(source)
            used = set(_dirs_of([p.relative_to(source).as_posix() for p in walked if p.is_file()]))
            out += [f"{arc}/{rel}" for p in walked if p.is_dir() and (rel := p.relative_to(source).as_posix()) not in used]
    return out


def hash_table(files: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {rel: {"sha256": sha256_file(src), "size": src.stat().st_size} for rel, src in sorted(files.items())}


# ---------------------------------------------------------------------------------------------------------------
# Deterministic tarball.


class _HashingWriter(io.RawIOBase):
    """Write-through file wrapper that hashes what passes through it (avoids re-reading a large tarball)."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.sha.update(b)
        return self._raw.write(b)


def _tarinfo(name: str, *, size: int = 0, directory: bool = False, executable: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if directory:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = size
        info.mode = 0o755 if executable else 0o644
    return info


def _dirs_of(paths: list[str]) -> list[str]:
    dirs = set()
    for rel in paths:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return sorted(dirs)


def write_tarball(dest: Path, *, prefix: str, document: bytes, files: dict[str, Path], compresslevel: int = 6,
                  empty_dirs: list[str] | tuple[str, ...] = ()) -> str:
    """Write the deterministic tar.gz atomically (`empty_dirs`: extra directory entries); return its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    dirs = set(_dirs_of(list(files))) | set(empty_dirs)
    entries = sorted([(d, None) for d in dirs] + list(files.items()), key=lambda e: e[0])
    try:
        with open(tmp, "wb") as raw:
            hashing = _HashingWriter(raw)
            with gzip.GzipFile(filename="", mode="wb", fileobj=hashing, mtime=0, compresslevel=compresslevel) as gz:
                with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    tar.addfile(_tarinfo(prefix, directory=True))
                    tar.addfile(_tarinfo(f"{prefix}/{RELEASE_JSON}", size=len(document)), io.BytesIO(document))
                    for rel, src in entries:
                        name = f"{prefix}/{rel}"
                        if src is None:
                            tar.addfile(_tarinfo(name, directory=True))
                            continue
                        size = src.stat().st_size
                        executable = bool(src.stat().st_mode & 0o111)
                        with open(src, "rb") as f:
                            tar.addfile(_tarinfo(name, size=size, executable=executable), f)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return hashing.sha.hexdigest()


def release_document(metadata: dict[str, Any], files: dict[str, dict[str, Any]]) -> bytes:
    """The canonical bytes of release.json (sorted keys, no timestamps)."""
    doc = {"format": RELEASE_FORMAT, **metadata, "files": files}
    return (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode()


def pack_release(
    *,
    name: str,
    components: dict[str, Path],
    metadata: dict[str, Any],
    output_dir: Path,
    compresslevel: int = 6,
) -> ReleaseResult:
    """Assemble `<output_dir>/<name>.tar.gz` (+ `.sha256`) from component dirs and release metadata."""
    files = collect_files(components)
    table = hash_table(files)
    document = release_document({"name": name, **metadata}, table)
    tarball = Path(output_dir) / f"{name}.tar.gz"
    digest = write_tarball(tarball, prefix=name, document=document, files=files, compresslevel=compresslevel,
                           empty_dirs=collect_empty_dirs(components))
    sha_path = tarball.with_name(tarball.name + ".sha256")
    tmp = sha_path.with_name(f".tmp-{sha_path.name}")
    tmp.write_text(f"{digest}  {tarball.name}\n")
    os.replace(tmp, sha_path)
    return ReleaseResult(name, tarball, digest, sha_path, json.loads(document))


# ---------------------------------------------------------------------------------------------------------------
# From a spec: locate the stage outputs through their manifests.


def _manifest_or_none(path: Path | None) -> dict[str, Any] | None:
    return read_manifest(path) if path is not None and Path(path).is_dir() else None


def _pick(manifest: dict[str, Any] | None, *keys: str) -> Any:
    """First present key of a stage manifest (stages name things slightly differently)."""
    if not manifest:
        return None
    for key in keys:
        if key in manifest and manifest[key] is not None:
            return manifest[key]
    return None


def release_name(spec: BuildSpec, build_id: str, version: str) -> str:
    prefix = f"{spec.model.name}-{spec.quantization.precision}-"
    base = build_id if build_id.startswith(prefix) else prefix + build_id
    return f"{base}-v{version}"


def release_metadata(
    spec: BuildSpec,
    *,
    build_id: str,
    version: str,
    components: dict[str, Path],
    manifests: dict[str, dict[str, Any] | None],
) -> dict[str, Any]:
    """release.json fields other than the file table: spec, revisions, toolchain, GPU, quality, planner figures."""
    from .planner import plan

    engine = manifests.get("engine")
    calib = manifests.get("checkpoint")
    download = manifests.get("download")
    draft_download = manifests.get("draft_download")

    def revision(entry, m, ckpt):
        if entry is None:
            return None
        resolved = _pick(m, "sha", "resolved_revision", "commit")
        if resolved is None and isinstance((ckpt or {}).get("model"), dict):
            resolved = ckpt["model"].get("sha")  # the calibrate stage records the source it quantized
        return {"repo_id": entry.repo_id, "requested": entry.revision, "resolved": resolved}

    toolchain = {
        "engine": _pick(engine, "toolchain", "versions"),
        "calibrate": _pick(calib, "toolchain") or ((calib or {}).get("factors") or {}).get("toolchain"),
    }
    gpu = _pick(engine, "gpu", "gpu_arch")
    return {
        "version": version,
        "build_id": build_id,
        "target": spec.target,
        "spec": spec.model_dump(mode="json"),
        "summary": spec.summary(),
        "revisions": {
            "model": revision(spec.model, download, calib),
            "draft": revision(spec.draft_model, draft_download, manifests.get("draft_checkpoint")),
        },
        "toolchain": toolchain,
        "gpu": gpu if gpu is not None else {"planned": spec.hardware.gpu, "built_on": None},
        "quality_gate": _pick(calib, "quality_gate", "quality"),
        "plan": plan(spec).as_dict(),
        "components": {arc: sorted(_component_manifests(arc, src)) for arc, src in sorted(components.items())},
        "stage_keys": {k: (m or {}).get("key") for k, m in sorted(manifests.items()) if m},
        # The download manifests live in the cache, not in a released directory: embed them.
        "source_manifests": {"model": download, "draft": draft_download},
    }


def _component_manifests(arc: str, source: Path) -> list[str]:
    source = Path(source)
    if source.is_file():
        return []
    return [f"{arc}/{p.relative_to(source).as_posix()}" for p in source.rglob(MANIFEST)]


def release(
    spec: BuildSpec,
    *,
    output: str | Path | None = None,
    version: str | None = None,
    compresslevel: int = 6,
) -> ReleaseResult:
    """Package the finished build of `spec` as a release tarball under the output tree.

    Raises:
        ReleaseError: a stage output the release needs is missing (run `invoke build` first).
        PipelineError: `output` escapes the output tree.
    """
    from . import __version__
    from .build import locate_outputs

    version = version or __version__
    out = locate_outputs(spec)
    if out.build_id is None:
        raise ReleaseError(f"no finished build for {spec.model.name} {spec.quantization.precision}; run `invoke build`")
    root = output_root()
    if spec.target == "trtllm":
        dirs = {"engine": out.engine, "draft_engine": out.draft_engine}
    else:
        dirs = {"checkpoint": out.checkpoint, "draft_checkpoint": out.draft_checkpoint}
    dirs["triton_repo"] = out.triton_repo
    required = ("engine" if spec.target == "trtllm" else "checkpoint", "triton_repo")
    for role in required:
        if dirs.get(role) is None:
            raise ReleaseError(f"the {role.replace('_', ' ')} of build {out.build_id} is missing; run `invoke build`")
    # Keep the output-tree layout (engines/<build-id>/..., triton_repo/<name>/): the repository's gpt_model_path is
    # relative (../../../engines/...), so an unpacked release is itself a valid PIPELINE_ROOT.
    components: dict[str, Path] = {}
    for path in dirs.values():
        if path is None:
            continue
        try:
            arc = Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            raise ReleaseError(f"{path} is outside the output tree {root}; set PIPELINE_ROOT to the build's") from None
        components[arc] = Path(path)
    if out.tokenizer is not None:
        components["tokenizer"] = out.tokenizer
    for arc, path in components.items():
        if read_manifest(path) is None and arc != "tokenizer":
            raise ReleaseError(f"{path} has no {MANIFEST}: an unfinished stage output; re-run `invoke build`")
    name = release_name(spec, out.build_id, version)
    out_dir = safe_join(root, str(output)) if output else safe_join(root, RELEASES_DIR)
    metadata = release_metadata(
        spec, build_id=out.build_id, version=version, components=components, manifests=out.manifests
    )
    return pack_release(name=name, components=components, metadata=metadata, output_dir=out_dir,
                        compresslevel=compresslevel)
