"""Verify a release tarball, an unpacked release, or a Triton repo against its hashes and against this host.

Hashes: every file listed in `release.json` (or in a stage `manifest.json` file table) must be present with the
recorded sha256, and the table must be complete: an extra file or model directory, a symlink, or a listed path
outside the tree fails verification (exit 3). A tarball is read once, as a stream, never extracted, and each byte is
hashed once: every member's sha256 is computed in that pass, and the release's identity (the `.sha256` sidecar, a
pinned digest) is release.json's sha256, every header, padding byte and the end of the archive being compared with
the canonical tarball of that release.json before the bytes that follow are read. `release.json` must be its first
file, and each member's type (regular files and directories only), mode (no setuid/setgid or world-writable bit) and
declared size are checked against it before the member's bytes are read, so a member that declares more than the
record holds is refused at once. Only the small metadata members are read into memory, each capped at
`MAX_METADATA_BYTES`. Earlier (format-1) releases, whose sidecar pins the tarball's own sha256, and their compressed
(`.tar.gz`) forms verify as before: the tarball is hashed in the same pass. A malformed `release.json` or manifest
fails with one line.
Host: engines only run with the TensorRT-LLM/TensorRT
version that built them, on the GPU architecture they were built for, so a serving host with a different toolchain
or SM is refused with the diff (exit 2) before tritonserver fails in an obscure way.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.core.artifacts import MANIFEST, SYMLINK, check_files
from pipeline.core.errors import (CorruptArtifactError, HashMismatchError, HostMismatchError, PackageError,
                                  PipelineError, SpecError, VerifyError)
from pipeline.core.manifests import CheckpointManifest, EngineManifest, FileRecord, ReleaseDocument
from pipeline.core.refs import mismatches
from pipeline.core.spec import spec_from_document
from pipeline.core.untrusted import open_regular, parse_json, read_bytes
from pipeline.ops.release import RELEASE_JSON, tar_end, tar_header, tar_members
from pipeline.stages.compile.preflight import probe_host as compile_probe
from pipeline.stages.package import llmapi_yaml, pbtxt

_CHUNK = 4 << 20
MAX_LISTED = 20
MAX_METADATA_BYTES = 16 << 20  # release.json, manifest.json, config.json: read into memory, so capped
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")  # gzip, bzip2, xz: what tarfile's "r|*" also opens
__all__ = ["HashMismatchError", "HostInfo", "HostMismatchError", "VerifyReport", "probe_serving_host", "verify"]


@dataclass(frozen=True)
class HostInfo:
    """The serving host's toolchain and GPU (None where unknown: that check is skipped)."""

    tensorrt_llm: str | None = None
    tensorrt: str | None = None
    sm: int | None = None  # compute capability x10 (90 = SM 9.0)

    @property
    def known(self) -> bool:
        return any(v is not None for v in (self.tensorrt_llm, self.tensorrt, self.sm))


@dataclass
class VerifyReport:
    path: Path
    kind: str  # "tarball" | "release" | "triton_repo" | "stage_dir"
    files_checked: int = 0
    mismatches: list[str] = field(default_factory=list)
    host_checked: bool = False
    host_diff: list[str] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.host_diff

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "ok": self.ok,
            "files_checked": self.files_checked,
            "mismatches": self.mismatches,
            "host_checked": self.host_checked,
            "host_diff": self.host_diff,
            "engines": self.engines,
            "notes": self.notes,
        }


class _AnyManifest(BaseModel):
    """What verify needs of any stage manifest: its file table (the rest is the stage's own business)."""

    model_config = ConfigDict(extra="allow")

    files: dict[str, FileRecord] | None = None
    models: list[str] | None = None  # a repository manifest: its model directories


def _field_error(what: str, exc: ValidationError) -> CorruptArtifactError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(document)"
    return CorruptArtifactError(f"{what}: field '{loc}': {err['msg']}; it is not a release or manifest written by this "
                       "pipeline (re-download or rebuild it)")


def _parse_release(raw: bytes, what: str) -> ReleaseDocument:
    try:
        return ReleaseDocument.model_validate_json(raw)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            raise CorruptArtifactError(f"{what} is not valid JSON; re-download or rebuild the release") from None
        raise _field_error(what, exc) from None


def _json_object(raw: bytes | None) -> dict[str, Any] | None:
    """A small JSON member as a dict; None when absent or not a JSON object (its hash is checked anyway)."""
    try:
        data = parse_json(raw, what="a release member", fix="") if raw else None
    except (ValueError, UnicodeDecodeError, PipelineError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------------------------------------------------
# Host probe.


def probe_serving_host() -> HostInfo:
    """This host's TensorRT-LLM/TensorRT versions and GPU SM, without importing tensorrt_llm.

    TensorRT-LLM and the GPU come from the compile stage's probe (package metadata + nvidia-smi/NVML); the
    TensorRT version from package metadata.
    """
    import importlib.metadata as md

    probe = compile_probe()
    tensorrt = None
    for name in ("tensorrt", "tensorrt-cu13", "tensorrt_cu13"):
        try:
            tensorrt = md.version(name)
            break
        except md.PackageNotFoundError:
            continue
    sm = probe.gpus[0].sm if probe.gpus else None
    return HostInfo(probe.trtllm_version if probe.trtllm_installed else None, tensorrt, sm)


# ---------------------------------------------------------------------------------------------------------------
# Engine toolchain records.


def engine_record(manifest: dict[str, Any] | None, config: dict[str, Any] | None) -> dict[str, Any]:
    """What an engine was built with: TRT-LLM/TensorRT versions and SM, from its manifest (config.json fallback)."""
    m = manifest if isinstance(manifest, dict) else {}
    tc = m.get("toolchain") or m.get("versions")
    tc = tc if isinstance(tc, dict) else {}
    gpu = m.get("gpu")
    gpu = gpu if isinstance(gpu, dict) else {}
    trtllm = tc.get("tensorrt_llm") or tc.get("trtllm") or (config if isinstance(config, dict) else {}).get("version")
    sm = tc.get("sm") or gpu.get("sm") or m.get("sm")
    try:
        sm = int(sm) if sm else None
    except (TypeError, ValueError):
        sm = None
    return {"tensorrt_llm": trtllm if isinstance(trtllm, str) else None,
            "tensorrt": tc.get("tensorrt") if isinstance(tc.get("tensorrt"), str) else None, "sm": sm}


def host_diff(record: dict[str, Any], host: HostInfo) -> list[str]:
    """Human-readable differences between an engine record and the host (fields known on both sides only)."""
    diff = []
    for key, label in (("tensorrt_llm", "TensorRT-LLM"), ("tensorrt", "TensorRT")):
        want, have = record.get(key), getattr(host, key)
        if want and have and str(want) != str(have):
            diff.append(f"{label}: {record.get('built', 'engine built with')} {want}, host has {have}")
    if record.get("sm") and host.sm and int(record["sm"]) != int(host.sm):
        diff.append(f"GPU: engine built for SM {record['sm'] / 10:.1f}, host GPU is SM {host.sm / 10:.1f}")
    return diff


# ---------------------------------------------------------------------------------------------------------------
# Hash checks.


def _compare(expected: dict[str, Any], actual: dict[str, str]) -> list[str]:
    """Problems of release files hashed as `actual` (path -> sha256) against the release's table."""
    problems = []
    for rel, rec in sorted(expected.items()):
        got = actual.get(rel)
        if got is None:
            problems.append(f"{rel}: missing")
        elif got != rec.sha256:
            problems.append(f"{rel}: sha256 {got[:12]}… != recorded {rec.sha256[:12]}…")
    for rel in sorted(set(actual) - set(expected)):
        problems.append(f"{rel}: not in the release")
    return problems


def _engines_in_release(doc: ReleaseDocument) -> list[str]:
    """Release-relative engine dirs (those holding rank*.engine)."""
    dirs = {rel.rsplit("/", 1)[0] for rel in doc.files if re.search(r"(^|/)rank\d+\.engine$", rel)}
    dirs |= {arc for arc in doc.components if arc.endswith(("/engine", "/draft_engine"))}
    return sorted(dirs)


def runtime_records(doc: ReleaseDocument) -> list[dict[str, Any]]:
    """A runtime-pytorch release's serving record: the TensorRT-LLM release it is written for, no TensorRT or SM
    (the PyTorch backend loads the HF checkpoint on any supported GPU)."""
    serving = (doc.model_extra or {}).get("serving")
    if not isinstance(serving, dict) or serving.get("runtime") != "pytorch":
        return []
    trtllm = serving.get("tensorrt_llm")
    path = f"engines/{(doc.model_extra or {}).get('build_id')}/hf_checkpoint"
    return [{"path": path, "tensorrt_llm": trtllm if isinstance(trtllm, str) else None,
             "tensorrt": None, "sm": None, "built": "HF checkpoint and LLM-API options written for"}]


def _read_capped(path: Path, what: str) -> bytes:
    """A metadata file of an unpacked release or repo: a regular file of at most `MAX_METADATA_BYTES`."""
    return read_bytes(path, cap=MAX_METADATA_BYTES, what=what, error=CorruptArtifactError,
                      fix="it is not a release or manifest written by this pipeline")


def _check_host(report: VerifyReport, records: list[dict[str, Any]], host: HostInfo | None) -> None:
    if not records:
        return
    host = host if host is not None else probe_serving_host()
    if not host.known:
        report.notes.append("host toolchain/GPU unknown (no TensorRT-LLM or GPU here): host check skipped")
        return
    report.host_checked = True
    absent = [label for key, label in (("tensorrt_llm", "TensorRT-LLM"), ("tensorrt", "TensorRT"), ("sm", "GPU"))
              if getattr(host, key) is None and any(rec.get(key) for rec in records)]
    if absent:  # e.g. a GPU host verifying outside the serving image: say what was not compared
        report.notes.append(f"no {', '.join(absent)} on this host: not compared with the engine "
                            "(run verify inside the serving image)")
    for rec in records:
        for d in host_diff(rec, host):
            report.host_diff.append(f"{rec['path']}: {d}")


def _sidecar_digest(path: Path) -> str:
    with open_regular(path, what=str(path), fix="give the .sha256 file `invoke release` wrote",
                      error=VerifyError) as f:
        words = f.read(4096).split()
    return words[0].decode(errors="replace") if words else ""


class _Tap:
    """Read-through wrapper over the tarball, for one pass: while `sha` is set, every byte is hashed on a worker thread
    (a format-1 release, pinned by the tarball's sha256; at most `_AHEAD` chunks wait); the bytes at or past `skip`
    are kept until taken (headers, padding and end of a format-2 release, compared with their canonical form)."""

    _AHEAD = 4

    def __init__(self, raw, pool: ThreadPoolExecutor):
        self._raw, self._pool = raw, pool
        self.sha: Any = hashlib.sha256()
        self._pending: deque[Future] = deque()
        self.pos = 0  # bytes read
        self.skip = 0  # bytes before this offset are not kept (a member's contents: hashed as that member)
        self._kept = bytearray()  # the bytes read from offset `skip` on, less those taken

    def read(self, n: int = -1) -> bytes:
        b = self._raw.read(n)
        if b:
            if self.sha is not None:
                if len(self._pending) >= self._AHEAD:
                    self._pending.popleft().result()
                self._pending.append(self._pool.submit(self.sha.update, b))
            self._kept += memoryview(b)[max(self.skip - self.pos, 0):]
            self.pos += len(b)
        return b

    def take(self, n: int) -> bytes:
        """The next `n` kept bytes (fewer where not read yet); the kept bytes then start at `skip` + `n`."""
        out = bytes(self._kept[:n])
        del self._kept[:n]
        self.skip += len(out)
        return out

    def read_kept(self, n: int) -> None:
        """Read on until `n` bytes are kept or the file ends (once tarfile is done with it)."""
        while len(self._kept) < n and self.read(_CHUNK):
            pass

    def skip_to(self, offset: int) -> None:
        """Keep no byte before `offset` (from the last taken one: what lies between is a member's contents)."""
        del self._kept[:offset - self.skip]
        self.skip = offset

    def hexdigest(self) -> str:
        """The sha256 of the whole file, read to its end (while hashing)."""
        self.skip = 1 << 62  # keep nothing more
        self._kept.clear()
        while self.read(_CHUNK):
            pass
        while self._pending:
            self._pending.popleft().result()
        return self.sha.hexdigest()

    def stop_hashing(self) -> None:
        while self._pending:
            self._pending.popleft().result()
        self.sha = None


class _Layout:
    """Checks that a format-2 tarball is byte for byte the canonical tarball of its release.json (`tar_members`):
    every header, padding and the end-of-archive, each before the member's contents are read. The tarball is then a
    function of release.json, so release.json's sha256 pins it whole."""

    def __init__(self, tap: _Tap, document: bytes, doc: ReleaseDocument):
        self._tap, self._members = tap, tar_members(document, doc)
        self._at: int | None = 0  # the next member, once broken: None (a mismatch is reported once)
        self._pad = 0  # zero bytes owed by the previous member's contents

    def member(self, rel: str) -> str | None:
        """The problem with the next member's header (None: canonical). Its contents are skipped by the tap."""
        if self._at is None:
            return None
        if self._at == len(self._members):
            return self._broken(f"{rel}: not in the release")
        info = self._members[self._at]
        want = bytes(self._pad) + tar_header(info)
        if self._tap.take(len(want)) != want:
            return self._broken(f"{rel}: header differs from the one `invoke release` writes (expected {info.name} "
                                "next)")
        self._at += 1
        self._tap.skip_to(self._tap.skip + info.size)
        self._pad = -info.size % 512
        return None

    def _broken(self, problem: str) -> str:
        self._at = None
        self._tap.skip_to(1 << 62)  # nothing more to compare: keep no byte
        return problem

    def end(self) -> str | None:
        """The problem with what follows the last member (None: exactly the end-of-archive `invoke release` writes)."""
        if self._at is None:
            return None
        if self._at < len(self._members):
            return f"{self._members[self._at].name}: missing (the tarball ends before it)"
        want = bytes(self._pad) + tar_end(self._tap.skip + self._pad)
        self._tap.read_kept(len(want) + 1)
        if self._tap.take(len(want) + 1) != want:
            return "the end of the archive differs from the one `invoke release` writes (trailing or missing bytes)"
        return None


def _member_problem(member: tarfile.TarInfo, rel: str) -> str | None:
    """Why `member` can never be part of a release: its type or its permission bits."""
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        return f"{rel}: setuid/setgid mode {member.mode:o} (a release holds plain files)"
    if member.mode & stat.S_IWOTH:
        return f"{rel}: world-writable mode {member.mode:o} (a release holds plain files)"
    if member.isdir():
        return None
    if member.issparse():
        return f"{rel}: a sparse member (a release holds plain files)"
    if not member.isfile():
        kind = "a link" if member.issym() or member.islnk() else "a device or special file"
        return f"{rel}: {kind}, not a regular file (links and devices are never part of a release)"
    return None


def _verify_tarball(path: Path, report: VerifyReport, sha256: str | None = None,
                    ) -> tuple[ReleaseDocument, dict[str, str], dict[str, bytes]]:
    """One streaming pass: every member's type, mode and declared size against release.json (the first file member)
    before its bytes are read, and every member's sha256. The pins (the `.sha256` sidecar, `sha256`) are checked
    against release.json's sha256 (format 2: the tarball must then be its canonical tarball, `_Layout`) or, for an
    earlier format-1 release, against the tarball's own sha256, computed in the same pass.

    Raises:
        CorruptArtifactError: unreadable, release.json missing, late or oversized, or members that declare more
            bytes than release.json records (refused before they are read; exit 3).
    """
    sha_file = path.with_name(path.name + ".sha256")
    pinned = [(sha_file.name, _sidecar_digest(sha_file))] if sha_file.is_file() else []
    pinned += [("--sha256", sha256)] if sha256 else []
    doc: ReleaseDocument | None = None
    identity = ""  # what the pins are compared with: release.json's sha256 (format 2) or the tarball's (format 1)
    layout: _Layout | None = None
    budget = 0  # bytes release.json records: what the file members may declare in total
    hashes: dict[str, str] = {}
    small: dict[str, bytes] = {}  # manifest.json / config.json contents for the host check
    prefix = None
    try:
        with open_regular(path, what=str(path), fix="pass a release .tar, an unpacked release or a Triton repo",
                          error=VerifyError) as raw, ThreadPoolExecutor(1) as pool:
            compressed = os.pread(raw.fileno(), 6, 0).startswith(_COMPRESSED)
            tap = _Tap(raw, pool)
            # typeshed's `_Fileobj` also asks for write/tell/seek/close; a stream ("r|") TarFile only reads a file
            # object it is given
            with tarfile.open(fileobj=tap, mode="r|*", bufsize=_CHUNK) as tar:  # type: ignore[call-overload]
                for member in tar:
                    name = member.name
                    if prefix is None:
                        prefix = name.split("/", 1)[0]
                    rel = name[len(prefix) + 1 :] if name.startswith(prefix + "/") else name
                    if layout is not None and (problem := layout.member(rel)):
                        report.mismatches.append(problem)
                    if not name.startswith(prefix + "/") and name != prefix:
                        report.mismatches.append(f"{name}: outside the release directory {prefix}/")
                        continue
                    if rel.startswith("/") or ".." in rel.split("/"):
                        report.mismatches.append(f"{name}: a path that leaves the release directory")
                        continue
                    if problem := _member_problem(member, rel):
                        report.mismatches.append(problem)
                        continue
                    if member.isdir():
                        continue
                    if doc is None:
                        raw_doc = _release_member(path, tar, member, rel)
                        doc = _parse_release(raw_doc, f"{path}: {RELEASE_JSON}")
                        budget = sum(rec.size for rec in doc.files.values())
                        if doc.format == 1:
                            tap.skip_to(1 << 62)  # pinned by the tarball's sha256: no layout to compare
                            continue
                        identity = hashlib.sha256(raw_doc).hexdigest()
                        tap.stop_hashing()
                        if compressed:
                            raise CorruptArtifactError(
                                f"{path}: a compressed format-{doc.format} release; `invoke release` writes an "
                                "uncompressed .tar (re-download that)", path=path)
                        layout = _Layout(tap, raw_doc, doc)
                        for head in (doc.name, rel):  # the release directory and release.json, read already
                            if problem := layout.member(head):
                                report.mismatches.append(problem)
                        continue
                    if rel == RELEASE_JSON:
                        report.mismatches.append(f"{rel}: a second {RELEASE_JSON}")
                        continue
                    budget -= member.size
                    if budget < 0:
                        raise CorruptArtifactError(
                            f"{path}: its members declare more bytes than {RELEASE_JSON} records ({rel} declares "
                            f"{member.size}); it is not a release made by `invoke release`, re-download or rebuild it",
                            path=path)
                    rec = doc.files.get(rel)
                    if rec is not None and rec.size != member.size:
                        report.mismatches.append(f"{rel}: {member.size} bytes != recorded {rec.size}")
                        continue
                    keep = rel.endswith(("/" + MANIFEST, "/config.json")) and member.size <= MAX_METADATA_BYTES
                    hashes[rel], data = _hash_member(tar, member, keep)
                    if keep:
                        small[rel] = data
            if layout is not None and (problem := layout.end()):
                report.mismatches.append(problem)
            identity = identity or tap.hexdigest()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise CorruptArtifactError(f"{path} is not a readable release tarball ({exc}); re-download or rebuild it") from None
    if doc is None:
        raise VerifyError(f"{path} has no {RELEASE_JSON}; it is not a release made by `invoke release`")
    what = f"{RELEASE_JSON} sha256" if layout is not None else "sha256"
    for source, want in pinned:
        if want != identity:
            report.mismatches.append(f"{path.name}: {what} {identity[:12]}… != {source} {want[:12]}…")
    return doc, hashes, small


def _release_member(path: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str) -> bytes:
    """The bytes of release.json, which must be the tarball's first file (the table that bounds what follows).

    Raises:
        VerifyError: another file comes first (exit 2); CorruptArtifactError: oversized (exit 3).
    """
    if rel != RELEASE_JSON:
        raise VerifyError(f"{path} has no {RELEASE_JSON} as its first file ({rel} comes first); it is not a release "
                          "made by `invoke release`", path=path)
    if member.size > MAX_METADATA_BYTES:
        raise CorruptArtifactError(f"{path}: {RELEASE_JSON} is {member.size} bytes, over the "
                                   f"{MAX_METADATA_BYTES >> 20} MiB limit; it is not a release made by "
                                   "`invoke release`", path=path)
    return _contents(tar, member).read()


def _contents(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """The contents of a regular file member (`_member_problem` lets no other kind through)."""
    f = tar.extractfile(member)
    if f is None:
        raise CorruptArtifactError(f"{member.name}: not a regular file (links and devices are never part of a "
                                   "release)")
    return f


def _hash_member(tar: tarfile.TarFile, member: tarfile.TarInfo, keep: bool) -> tuple[str, bytes]:
    """The member's sha256 (and its bytes when `keep`: small metadata for the host check)."""
    f = _contents(tar, member)
    h = hashlib.sha256()
    buf = bytearray()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        if keep:
            buf += chunk
    return h.hexdigest(), bytes(buf)


def _symlinks(root: Path) -> list[str]:
    """Every symlink below `root` (never followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out.append(f"{p.relative_to(root).as_posix()}: {SYMLINK}")
    return sorted(out)


def _verify_unpacked(path: Path, report: VerifyReport) -> ReleaseDocument:
    doc = _parse_release(_read_capped(path / RELEASE_JSON, str(path / RELEASE_JSON)), str(path / RELEASE_JSON))
    report.mismatches += check_files(path, doc.files, full=True, ignore=(RELEASE_JSON,))  # symlinks included
    return doc


def verify(path: str | Path, *, host: HostInfo | None = None, check_host: bool = True,
           sha256: str | None = None) -> VerifyReport:
    """Verify a release tarball, an unpacked release dir, a Triton repo with manifests, or one stage output dir.

    Args:
        sha256: the release's identity as its `.sha256` file holds it (pinned by `deploy`): release.json's sha256, or
            an earlier (format-1) release's tarball sha256; checked in the same pass as the members.
        host: the serving host's toolchain/GPU; probed (compile stage probe, package metadata, nvidia-smi) if None.
        check_host: refuse engines built for another toolchain/GPU than `host`.

    Raises:
        HashMismatchError: any file differs from, is missing from, or is extra to its recorded hashes, or is a
            symlink (exit 3).
        HostMismatchError: an engine's TensorRT-LLM/TensorRT version or SM differs from the host's (exit 4).
        CorruptArtifactError: unreadable tarball, malformed or oversized release.json or manifest (exit 3).
        VerifyError: the path is not something verifiable (exit 2).
    """
    path = Path(path)
    if not path.exists():
        raise VerifyError(f"{path} does not exist; pass a release .tar, an unpacked release or a Triton repo")
    if sha256 is not None and (not path.is_file() or not re.fullmatch(r"[0-9a-f]{64}", sha256)):
        raise VerifyError(f"--sha256 {sha256!r}: give the 64 lowercase hex digits of a release's .sha256 file "
                          "(its release.json's sha256), with a tarball path")
    records: list[dict[str, Any]] = []
    if path.is_file():
        report = VerifyReport(path, "tarball")
        doc, hashes, small = _verify_tarball(path, report, sha256)
        report.mismatches += _compare(doc.files, hashes)
        report.files_checked = len(doc.files)
        for d in _engines_in_release(doc):
            rec = engine_record(_json_object(small.get(f"{d}/{MANIFEST}")), _json_object(small.get(f"{d}/config.json")))
            records.append({"path": d, **rec})
        records += runtime_records(doc)
        foreign = _foreign_outputs(doc, {arc: _json_object(small.get(f"{arc}/{MANIFEST}")) for arc in doc.components})
    elif (path / RELEASE_JSON).is_file():
        report = VerifyReport(path, "release")
        doc = _verify_unpacked(path, report)
        foreign = _foreign_outputs(doc, {arc: _small_json(path / arc / MANIFEST) for arc in doc.components})
        report.files_checked = len(doc.files)
        for d in _engines_in_release(doc):
            records.append({"path": d, **_engine_record_on_disk(path / d)})
        records += runtime_records(doc)
    else:
        report, foreign = _verify_manifest_tree(path, records), []
    report.engines = records
    if report.mismatches:
        shown = "; ".join(report.mismatches[:MAX_LISTED])
        more = f" (+{len(report.mismatches) - MAX_LISTED} more)" if len(report.mismatches) > MAX_LISTED else ""
        raise HashMismatchError(
            f"{path}: {len(report.mismatches)} file(s) differ from the recorded hashes: {shown}{more}; "
            "the artifact is corrupt or modified, re-download or rebuild it",
            report,
        )
    if foreign:
        raise CorruptArtifactError(
            f"{path}: {'; '.join(foreign[:MAX_LISTED])}: packed from another build's output than the release's spec; "
            "rebuild (invoke build) and release again", path=path)
    if check_host:
        _check_host(report, records, host)
        if report.host_diff:
            raise HostMismatchError(
                f"{path}: release does not match this host: {'; '.join(report.host_diff)}; rebuild it on a "
                "host with this toolchain/GPU or serve it from the image/GPU it was built for",
                report,
            )
    return report


_STAGE_MANIFESTS: dict[str, type[CheckpointManifest] | type[EngineManifest]] = {
    "calibrate": CheckpointManifest, "compile": EngineManifest}


def _foreign_outputs(doc: ReleaseDocument, manifests: dict[str, dict[str, Any] | None]) -> list[str]:
    """Each checkpoint or engine of the release (arc dir -> its manifest) that records another model, precision or
    KV dtype than the spec in release.json (`refs.mismatches`), e.g. "engines/x/checkpoint: precision bf16 (this
    spec: fp8)". A release without a spec this pipeline reads (older formats) is not compared."""
    try:
        spec = spec_from_document((doc.model_extra or {}).get("spec"))
    except (ValidationError, SpecError):
        return []
    out = []
    for arc, data in sorted(manifests.items()):
        stage = (data or {}).get("stage")
        kind = _STAGE_MANIFESTS.get(stage) if isinstance(stage, str) else None
        if kind is None:
            continue
        try:
            m = kind.model_validate(data)
        except ValidationError:
            continue  # its bytes are checked against release.json; its fields are not ours to judge here
        role = ("draft_" if m.role == "draft" else "") + ("checkpoint" if kind is CheckpointManifest else "engine")
        out += [f"{arc}: {d}" for d in mismatches(role, m, spec)]
    return out


def _small_json(path: Path) -> dict[str, Any] | None:
    if path.is_symlink():
        return None
    try:
        return _json_object(read_bytes(path, cap=MAX_METADATA_BYTES, what=str(path), fix=""))
    except (OSError, PipelineError):
        return None


def _engine_record_on_disk(engine_dir: Path) -> dict[str, Any]:
    return engine_record(_small_json(engine_dir / MANIFEST), _small_json(engine_dir / "config.json"))


def _manifest(d: Path) -> _AnyManifest:
    """The stage manifest in `d`, as far as verify reads it."""
    where = str(d / MANIFEST)
    try:
        m = _AnyManifest.model_validate_json(_read_capped(d / MANIFEST, where))
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            raise CorruptArtifactError(f"{where} is not valid JSON; rebuild the stage output") from None
        raise _field_error(where, exc) from None
    return m


def _engine_path(cfg: Path) -> str:
    """The `gpt_model_path` of a model config (engine or reference checkpoint dir; "" if none or unparsable)."""

    try:
        model = pbtxt.read(cfg)
    except PackageError:
        return ""
    return pbtxt.parameter(model, "gpt_model_path")


def _verify_manifest_tree(path: Path, records: list[dict[str, Any]]) -> VerifyReport:
    """A Triton repo or stage output: every manifest's file table must match its directory exactly (no extra file,
    model dir or symlink); engines (or checkpoints) named by gpt_model_path are checked the same way."""
    manifests = sorted(path.rglob(MANIFEST))
    if not manifests:
        raise VerifyError(
            f"{path} has neither {RELEASE_JSON} nor any {MANIFEST}; pass a release or a repo built by this pipeline"
        )
    kind = "triton_repo" if any(path.glob("*/config.pbtxt")) else "stage_dir"
    report = VerifyReport(path, kind)
    checked_dirs: set[Path] = set()
    report.mismatches += _symlinks(path)

    def check_dir(d: Path, label: str) -> None:
        if d.resolve() in checked_dirs:
            return
        checked_dirs.add(d.resolve())
        manifest = _manifest(d)
        table = manifest.files
        if manifest.models is not None:
            report.mismatches += [f"{label}/{m.name}: a model directory the manifest does not list"
                                  for m in sorted(d.iterdir()) if m.is_dir() and m.name not in manifest.models]
        if table is None:
            report.notes.append(f"{label}: manifest has no file table; not hash-checked")
            return
        nested = [p.parent.relative_to(d).as_posix() + "/" for p in d.rglob(MANIFEST) if p.parent != d]
        problems = check_files(d, table, full=True)
        report.mismatches += [f"{label}/{p}" for p in problems
                              if not p.endswith(SYMLINK)  # every symlink below the root is listed once
                              and not any(p.startswith(n) for n in nested)]  # another manifest's files
        report.files_checked += len(table)

    for mpath in manifests:
        d = mpath.parent
        check_dir(d, d.relative_to(path).as_posix() or ".")
    if kind == "triton_repo" and path.resolve() not in checked_dirs:
        report.mismatches.append(f"{path}: the repository itself has no {MANIFEST}; nothing vouches for its models")
    for cfg in sorted(path.glob("*/config.pbtxt")):
        engine = _engine_path(cfg)
        if engine:
            edir = Path(engine)
            if not edir.is_absolute():
                edir = (cfg.parent / edir).resolve()
            if not edir.is_dir():
                report.notes.append(f"{cfg.parent.name}: engine dir {edir} not on this host; not checked")
                continue
            if (edir / MANIFEST).is_file():
                report.mismatches += _symlinks(edir)
                check_dir(edir, str(edir))
            if any(edir.glob("rank*.engine")):
                records.append({"path": str(edir), **_engine_record_on_disk(edir)})
    for label, ckpt in _llmapi_dirs(path, report):
        if not ckpt.is_dir():
            report.notes.append(f"{label}: {ckpt} not on this host; not checked")
        elif any(ckpt.is_relative_to(d) for d in checked_dirs):
            continue  # inside a checked directory (a tokenizer in the checkpoint)
        elif not (ckpt / MANIFEST).is_file():
            report.notes.append(f"{label}: {ckpt} has no {MANIFEST}; not hash-checked")
        else:
            report.mismatches += _symlinks(ckpt)
            check_dir(ckpt, str(ckpt))
    return report


def _llmapi_dirs(repo: Path, report: VerifyReport) -> list[tuple[str, Path]]:
    """(model.yaml key, directory) for each directory an `llmapi` (runtime pytorch) repository's model.yaml names:
    the HF checkpoint (`model`), the draft (`speculative_model_dir`), the tokenizer. [] for other repositories."""
    if not llmapi_yaml.is_llmapi_repo(repo):
        return []
    yaml_path = repo / llmapi_yaml.MODEL_YAML
    try:
        data = llmapi_yaml.read(yaml_path)
    except PackageError as exc:
        report.mismatches.append(str(exc))
        return []
    out = []
    for key, value in llmapi_yaml.paths(data).items():
        p = Path(value).expanduser()
        out.append((f"model.yaml {key}", (p if p.is_absolute() else yaml_path.parent / p).resolve()))
    return out
