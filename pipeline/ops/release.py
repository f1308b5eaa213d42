"""Versioned, reproducible release artifacts: engines (or checkpoint), Triton repo, tokenizer, manifests, release.json.

The tarball is an uncompressed, deterministic tar (FP8/BF16 weights barely compress; gzip capped packing at
8-30 MB/s): `release.json` first, then every directory and file in sorted order, with fixed mtime/uid/gid/owner
names and normalised modes, all recorded in `release.json` (`dirs`, `executable`), so the tarball is a function of
`release.json` alone. The release's identity is the sha256 of `release.json`, which lists every member's sha256: it
is written next to the tarball as `<digest>  <name>/release.json` (`sha256sum -c` of an unpacked release). It is
written in one pass: each file is read once and hashed while it is copied; no byte is hashed twice.

Nothing unverified is packed: every file must match its stage manifest's file table (complete, no extra file; its
bytes hashed as they are packed), else the release is refused (exit 3) naming `--force STAGE`. The file name comes
from the spec and the version alone (`pipeline.core.layout.release_file`), so `deploy` names the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tarfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.core.runtimes import runtime_of
from pipeline.core.artifacts import MANIFEST, check_name, output_root, remove_stale_temps, sha256_file
from pipeline.core.errors import IntegrityError, ReleaseError
from pipeline.core.layout import RELEASE_SUFFIX, BuildLayout, release_name
from pipeline.core.manifests import CheckpointManifest, ReleaseDocument, StageResult, integrity_error
from pipeline.core.spec import BuildSpec
from pipeline.core.trtllm_rules import TRTLLM_VERSION
from pipeline.planning.planner import plan_capacity
from pipeline.stages.build import BuildOutputs, locate_outputs

RELEASE_JSON = "release.json"
RELEASE_FORMAT = 2  # 1: the sidecar pinned the tarball's own sha256
# 1980-01-01T00:00:00Z: a fixed, plausible timestamp for every tar entry (tar warns about 1970 dates).
FIXED_MTIME = 315532800
RELEASES_DIR = "releases"
__all__ = ["ReleaseError", "ReleaseResult", "pack_release", "release", "release_output_dir"]


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


def file_table(files: dict[str, Path], recorded: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """release path -> {sha256, size}: a file its stage manifest records at its current size takes the recorded
    sha256 (checked while it is packed: read once); any other file (a manifest itself, a size that differs) is
    hashed now."""
    table = {}
    for rel, src in sorted(files.items()):
        size = src.stat().st_size
        arc = next((a for a in recorded if rel.startswith(f"{a}/")), None)
        rec = recorded[arc][1].get(rel[len(arc) + 1:]) if arc else None
        sha = rec.sha256 if rec is not None and rec.size == size else sha256_file(src)
        table[rel] = {"sha256": sha, "size": size}
    return table


# ---------------------------------------------------------------------------------------------------------------
# Deterministic tarball, written in one pass: each file is read once in large chunks; its sha256 is computed on a
# worker thread (hashlib releases the GIL) while the main thread reads the next chunk and writes.

COPY_CHUNK = 1 << 20  # two buffers that stay in cache: 8 MiB ones packed 2-3x slower on a loaded 2-core box
_BLOCK = 512
_RECORD = 20 * _BLOCK  # tar's record size: the archive ends on a record boundary, as GNU tar and tarfile write it


class _Changed(Exception):
    """A file hashed differently while it was packed than its table entry says (its size or its bytes)."""

    def __init__(self, rel: str, got: str):
        super().__init__(rel)
        self.rel, self.got = rel, got


class _TarWriter:
    """Writes tar members to a raw file; file contents are hashed as they are copied."""

    def __init__(self, raw, pool: ThreadPoolExecutor):
        self._raw, self._pool = raw, pool
        self._pending: Future | None = None
        self._bufs = (bytearray(COPY_CHUNK), bytearray(COPY_CHUNK))

    def _drain(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _write(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[self._raw.write(view):]

    def add(self, info: tarfile.TarInfo, data: bytes = b"") -> None:
        """Append a member: its header, then `data`."""
        self._write(tar_header(info))
        self._write(data + bytes(-len(data) % _BLOCK))

    def add_file(self, info: tarfile.TarInfo, src: Path) -> str:
        """Append a member: its header, then the `info.size` bytes of `src`; their sha256."""
        self._write(tar_header(info))
        file_sha = hashlib.sha256()
        left, i = info.size, 0
        with open(src, "rb", buffering=0) as f:
            while left:
                buf = memoryview(self._bufs[i & 1])[: min(COPY_CHUNK, left)]
                n = 0
                while n < len(buf) and (got := f.readinto(buf[n:])):
                    n += got
                if n < len(buf):  # shorter than recorded
                    self._drain()
                    raise _Changed(info.name, "(a shorter file)")
                self._drain()  # the other buffer is hashed; this one is free to hand over
                self._pending = self._pool.submit(file_sha.update, buf)
                self._write(buf)
                left -= n
                i += 1
            self._drain()
            if f.read(1):
                raise _Changed(info.name, "(a longer file)")
        self._write(bytes(-info.size % _BLOCK))
        return file_sha.hexdigest()

    def close(self, written: int) -> None:
        """End of archive: two zero blocks, then zeros up to the record boundary."""
        self._write(tar_end(written))


def tar_end(written: int) -> bytes:
    """What follows the last member of a tarball of `written` bytes: two zero blocks, zeros to the record boundary."""
    return bytes(2 * _BLOCK + (-(written + 2 * _BLOCK) % _RECORD))


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


def tar_members(document: bytes, doc: ReleaseDocument) -> list[tarfile.TarInfo]:
    """Every member of the release tarball of `doc` (whose canonical bytes are `document`), in order: `<name>/`,
    `<name>/release.json`, then its `dirs` and `files` sorted, modes from `executable`."""
    executable = set(doc.executable)
    entries = sorted([(d, None) for d in doc.dirs] + [(rel, rec.size) for rel, rec in doc.files.items()])
    return [_tarinfo(doc.name, directory=True), _tarinfo(f"{doc.name}/{RELEASE_JSON}", size=len(document)),
            *(_tarinfo(f"{doc.name}/{rel}", directory=size is None, size=size or 0, executable=rel in executable)
              for rel, size in entries)]


def tar_header(info: tarfile.TarInfo) -> bytes:
    """The header bytes `invoke release` writes for `info`."""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def write_tarball(dest: Path, *, document: bytes, files: dict[str, Path], table: dict[str, dict[str, Any]]) -> None:
    """Write the deterministic tar of `document` (canonical release.json bytes) atomically.

    Every file is packed at its `table` size (release path -> {sha256, size}) and must hash to its `table` sha256
    while it is copied, else nothing is written (`_Changed`).
    """
    doc = ReleaseDocument.model_validate_json(document)
    created = [d for d in (dest.parent, *dest.parent.parents) if not d.exists()]  # removed again on failure
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    try:
        with open(tmp, "wb", buffering=0) as raw, ThreadPoolExecutor(1) as pool:
            tar = _TarWriter(raw, pool)
            head, meta, *members = tar_members(document, doc)
            tar.add(head)
            tar.add(meta, data=document)
            for info in members:
                rel = info.name[len(doc.name) + 1:]
                if info.isdir():
                    tar.add(info)
                elif (got := tar.add_file(info, files[rel])) != table[rel]["sha256"]:
                    raise _Changed(rel, got)
            tar.close(raw.tell())
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(exc, _Changed):
            exc.rel = exc.rel.removeprefix(f"{doc.name}/")
        raise


def release_document(metadata: dict[str, Any], files: dict[str, dict[str, Any]]) -> bytes:
    """The canonical bytes of release.json (sorted keys, no timestamps).

    Raises:
        ReleaseError: nothing to release (an empty file table) or metadata that does not form a release.json.
    """
    if not files:
        raise ReleaseError("the release would hold no files; run `invoke build` first")
    doc = json.loads(json.dumps({"format": RELEASE_FORMAT, **metadata, "files": files}, default=str))
    return ReleaseDocument.model_validate(doc).canonical()


def check_recorded(files: dict[str, dict[str, Any]], recorded: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Refuse (IntegrityError, exit 3) unless the hashed release files are exactly what the stage manifests record.

    Args:
        files: release path -> {sha256, size} as hashed while collecting.
        recorded: component arc dir -> (stage name, file table relative to the component).
    """
    for arc, (stage, table) in sorted(recorded.items()):
        problems = []
        prefix = f"{arc}/"
        packed = {rel[len(prefix):]: rec for rel, rec in files.items() if rel.startswith(prefix)}
        packed.pop(MANIFEST, None)
        for rel, rec in sorted(table.items()):
            got = packed.get(rel)
            if got is None:
                problems.append(f"{rel}: missing")
            elif (got["sha256"], got["size"]) != (rec.sha256, rec.size):
                problems.append(f"{rel}: sha256 {got['sha256'][:12]}… != recorded {rec.sha256[:12]}…")
        problems += [f"{rel}: not in the manifest" for rel in sorted(set(packed) - set(table))]
        if problems:
            raise integrity_error(Path(arc), problems,
                                  fix=f"nothing was released; re-run `invoke build --force {stage}`")


def pack_release(
    *,
    name: str,
    components: dict[str, Path],
    metadata: dict[str, Any],
    output_dir: Path,
    recorded: dict[str, tuple[str, dict[str, Any]]] | None = None,
) -> ReleaseResult:
    """Assemble `<output_dir>/<name>.tar` (+ `.sha256`: the sha256 of its release.json, the release's identity) from
    component dirs and release metadata.

    Args:
        recorded: component arc dir -> (stage, manifest file table): the packed files must match it exactly.

    Raises:
        ReleaseError: a component is missing or holds a symlink; IntegrityError: a file differs from `recorded`
            (before or while it is packed; nothing is written).
    """
    recorded = recorded or {}
    files = collect_files(components)
    table = file_table(files, recorded)
    check_recorded(table, recorded)
    layout = {"dirs": sorted(set(_dirs_of(list(files))) | set(collect_empty_dirs(components))),
              "executable": sorted(rel for rel, src in files.items() if src.stat().st_mode & 0o111)}
    document = release_document({"name": name, **metadata, **layout}, table)
    tarball = Path(output_dir) / f"{name}{RELEASE_SUFFIX}"
    for p in (tarball, tarball.with_name(tarball.name + ".sha256")):
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise ReleaseError(f"{p} exists and is not a regular file; remove it or choose another --output", path=p)
        remove_stale_temps(p)  # a partial tarball or sidecar of a killed release
    try:
        write_tarball(tarball, document=document, files=files, table=table)
    except _Changed as exc:
        arc = next((a for a in recorded if exc.rel.startswith(f"{a}/")), None)
        got = exc.got if exc.got.startswith("(") else f"{exc.got[:12]}…"
        problem = f"sha256 {got} != {table[exc.rel]['sha256'][:12]}… (changed while it was packed)"
        if arc is None:  # hashed just before packing (a manifest, or no stage record)
            raise IntegrityError(f"{files[exc.rel]}: {problem}; nothing was released; re-run `invoke release`",
                                 path=files[exc.rel]) from None
        raise integrity_error(Path(arc), [f"{exc.rel[len(arc) + 1:]}: {problem}"],
                              fix=f"nothing was released; re-run `invoke build --force {recorded[arc][0]}`") from None
    digest = hashlib.sha256(document).hexdigest()
    sha_path = tarball.with_name(tarball.name + ".sha256")
    tmp = sha_path.with_name(f".tmp-{sha_path.name}-{os.getpid()}")
    tmp.write_text(f"{digest}  {name}/{RELEASE_JSON}\n")
    os.replace(tmp, sha_path)
    return ReleaseResult(name, tarball, digest, sha_path, json.loads(document))


# ---------------------------------------------------------------------------------------------------------------
# From a spec: the stage outputs a check-only lookup returns, and their manifests.


def release_output_dir(output: str | Path | None) -> Path:
    """Where the tarball goes: `output` as named (absolute, or relative to the output tree), default `releases/`.

    Any directory the user names is accepted; refused only: a relative path that a symlink inside the output tree
    redirects out of it, and a path that exists but is not a directory.

    Raises:
        ReleaseError: as above (one line).
    """
    root = output_root()
    named = Path(output).expanduser() if output else Path(RELEASES_DIR)
    lexical = Path(os.path.normpath(root / named))
    if not named.is_absolute() and lexical.is_relative_to(root) and not lexical.resolve().is_relative_to(root):
        raise ReleaseError(f"--output {output}: a symlink inside the output tree {root} points out of it; "
                           "name the real directory instead", path=lexical)
    if lexical.exists() and not lexical.is_dir():
        raise ReleaseError(f"--output {output}: {lexical} exists and is not a directory; name a directory",
                           path=lexical)
    return lexical


def release_metadata(spec: BuildSpec, *, out: BuildOutputs, version: str,
                     components: dict[str, Path]) -> dict[str, Any]:
    """release.json fields other than the file table: spec, revisions, toolchain, GPU, quality, planner figures."""

    def revision(entry, download) -> dict[str, Any] | None:
        if entry is None:
            return None
        return {"repo_id": entry.repo_id, "requested": entry.revision,
                "resolved": download.manifest.sha if download else None}

    layout, checkpoint = _finished(out)
    engine = out.engine.manifest if out.engine else None
    results = out.results()
    return {
        "version": version,
        "build_id": out.build_id,
        "target": spec.target,
        "runtime": spec.runtime,
        # what serves it: engines pin TensorRT-LLM, TensorRT and the SM (their manifests); a runtime-pytorch HF
        # checkpoint pins only the TensorRT-LLM release its LLM-API options are written for (no SM)
        "serving": {"runtime": spec.runtime, "tensorrt_llm": TRTLLM_VERSION,
                    "sm_pinned": runtime_of(spec).compiles},
        "spec": spec.model_dump(mode="json"),
        "spec_key": layout.spec_key,
        "summary": spec.summary(),
        "revisions": {"model": revision(spec.model, out.download),
                      "draft": revision(spec.draft_model, out.draft_download)},
        "toolchain": {"engine": engine.toolchain if engine else None,
                      "calibrate": checkpoint.manifest.toolchain},
        "gpu": engine.gpu.model_dump(mode="json") if engine else {"planned": spec.hardware.gpu, "built_on": None},
        "quality_gate": checkpoint.manifest.quality.model_dump(mode="json"),
        "plan": plan_capacity(spec).as_dict(),
        "components": {arc: sorted(_component_manifests(arc, src)) for arc, src in sorted(components.items())},
        "stage_keys": {role: r.manifest.key for role, r in sorted(results.items())},
        # The download manifests live in the cache, not in a released directory: embed them.
        "source_manifests": {role: r.manifest.model_dump(mode="json", exclude={"files"}) | {
            "files": {n: {"sha256": f.sha256, "size": f.size} for n, f in r.manifest.files.items()}}
            for role, r in (("model", out.download), ("draft", out.draft_download)) if r},
    }


def _finished(out: BuildOutputs) -> tuple[BuildLayout, StageResult[CheckpointManifest]]:
    """The layout and target checkpoint every finished build has (ReleaseError when `out` has none)."""
    if out.layout is None or out.checkpoint is None:
        raise ReleaseError("the build has no calibrated checkpoint to release; run `invoke build` with this spec first")
    return out.layout, out.checkpoint


def _component_manifests(arc: str, source: Path) -> list[str]:
    source = Path(source)
    if source.is_file():
        return []
    return [f"{arc}/{p.relative_to(source).as_posix()}" for p in source.rglob(MANIFEST)]


def _components(spec: BuildSpec, out: BuildOutputs) -> tuple[dict[str, Path], dict[str, tuple[str, dict]]]:
    """Release components in the output-tree layout (arc dir -> source dir) and what each manifest records."""
    root = output_root()
    backend = runtime_of(spec)
    results = {role: getattr(out, role) for role in (*backend.release_roles, "triton_repo")}
    components: dict[str, Path] = {}
    recorded: dict[str, tuple[str, dict]] = {}
    for role, res in results.items():
        if res is None:
            continue
        # Keep the output-tree layout (engines/<build-id>/..., triton_repo/<name>/): the repository's gpt_model_path
        # is relative (../../../engines/...), so an unpacked release is itself a valid PIPELINE_ROOT.
        try:
            arc = Path(res.path).resolve().relative_to(root).as_posix()
        except ValueError:
            raise ReleaseError(f"{res.path} is outside the output tree {root}; set PIPELINE_ROOT to the build's",
                               path=res.path) from None
        components[arc] = Path(res.path)
        recorded[arc] = (res.manifest.stage, res.manifest.files)
    _, ckpt = _finished(out)
    tokenizer = backend.checkpoint.tokenizer_dir(ckpt.path)
    if tokenizer == ckpt.path:  # a Hugging Face checkpoint holds its tokenizer at its root
        return components, recorded
    prefix = tokenizer.relative_to(ckpt.path).as_posix() + "/"
    components["tokenizer"] = tokenizer
    recorded["tokenizer"] = ("calibrate", {rel[len(prefix):]: rec for rel, rec in ckpt.manifest.files.items()
                                           if rel.startswith(prefix)})
    return components, recorded


def release(
    spec: BuildSpec,
    *,
    output: str | Path | None = None,
    version: str | None = None,
) -> ReleaseResult:
    """Package the finished build of `spec` as `<output>/<release name>.tar` (+ `.sha256`), named by
    `pipeline.core.layout.release_name(spec, version)`.

    The build is located check-only (nothing is built), then every packed file is hashed and compared with its
    stage manifest.

    Args:
        output: any directory (absolute, or relative to the output tree); default `releases/`.
        version: a safe name (letters, digits, `._+-`); default the pipeline's version.

    Raises:
        PipelineError: no finished build (the message says what to run), a bad version or output directory.
        IntegrityError: a stage output differs from its manifest (exit 3); nothing is written.
    """

    version = check_name(version or __version__, what="--version", fix="use e.g. 1.0.0 or 2024.06.1-rc1")
    out_dir = release_output_dir(output)
    out = locate_outputs(spec)
    name = release_name(spec, version)
    components, recorded = _components(spec, out)
    metadata = release_metadata(spec, out=out, version=version, components=components)
    return pack_release(name=name, components=components, metadata=metadata, output_dir=out_dir, recorded=recorded)
