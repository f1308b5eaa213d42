"""Verify a release tarball, an unpacked release, or a Triton repo against its hashes and against this host.

Hashes: every file listed in `release.json` (or in a stage `manifest.json` file table) must be present with the
recorded sha256; extra files in a release are reported too. Host: engines only run with the TensorRT-LLM/TensorRT
version that built them, on the GPU architecture they were built for, so a serving host with a different toolchain
or SM is refused with the diff (exit 2) before tritonserver fails in an obscure way.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import MANIFEST, read_manifest, sha256_file
from .errors import VerifyError
from .release import RELEASE_JSON

_CHUNK = 1 << 20
MAX_LISTED = 20


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


class HashMismatchError(VerifyError):
    """Files differ from the recorded hashes."""

    def __init__(self, message: str, report: VerifyReport):
        super().__init__(message)
        self.report = report


class HostMismatchError(VerifyError):
    """The engine was built for another toolchain or GPU architecture than this host has."""

    def __init__(self, message: str, report: VerifyReport):
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------------------------------------------------------
# Host probe.


def probe_host() -> HostInfo:
    """This host's TensorRT-LLM/TensorRT versions and GPU SM, without importing tensorrt_llm.

    TensorRT-LLM and the GPU come from the compile stage's probe (package metadata + nvidia-smi/NVML); the
    TensorRT version from package metadata.
    """
    import importlib.metadata as md

    from .compile.preflight import probe_host as compile_probe

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
    m = manifest or {}
    tc = m.get("toolchain") or m.get("versions") or {}
    gpu = m.get("gpu") or {}
    trtllm = tc.get("tensorrt_llm") or tc.get("trtllm") or (config or {}).get("version")
    sm = tc.get("sm") or (gpu.get("sm") if isinstance(gpu, dict) else None) or m.get("sm")
    return {"tensorrt_llm": trtllm, "tensorrt": tc.get("tensorrt"), "sm": int(sm) if sm else None}


def host_diff(record: dict[str, Any], host: HostInfo) -> list[str]:
    """Human-readable differences between an engine record and the host (fields known on both sides only)."""
    diff = []
    for key, label in (("tensorrt_llm", "TensorRT-LLM"), ("tensorrt", "TensorRT")):
        want, have = record.get(key), getattr(host, key)
        if want and have and str(want) != str(have):
            diff.append(f"{label}: engine built with {want}, host has {have}")
    if record.get("sm") and host.sm and int(record["sm"]) != int(host.sm):
        diff.append(f"GPU: engine built for SM {record['sm'] / 10:.1f}, host GPU is SM {host.sm / 10:.1f}")
    return diff


# ---------------------------------------------------------------------------------------------------------------
# Hash checks.


def _compare(expected: dict[str, dict[str, Any]], actual: dict[str, str], *, extra_ok: bool = False) -> list[str]:
    problems = []
    for rel, rec in sorted(expected.items()):
        got = actual.get(rel)
        if got is None:
            problems.append(f"{rel}: missing")
        elif got != rec["sha256"]:
            problems.append(f"{rel}: sha256 {got[:12]}… != recorded {rec['sha256'][:12]}…")
    if not extra_ok:
        for rel in sorted(set(actual) - set(expected)):
            problems.append(f"{rel}: not in the release")
    return problems


def _disk_hashes(root: Path, *, skip: set[str]) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel in skip or p.is_dir():
            continue
        out[rel] = "symlink" if p.is_symlink() else sha256_file(p)
    return out


def _engines_in_release(doc: dict[str, Any], files: dict[str, Any]) -> list[str]:
    """Release-relative engine dirs (those holding rank*.engine)."""
    dirs = {rel.rsplit("/", 1)[0] for rel in files if re.search(r"(^|/)rank\d+\.engine$", rel)}
    for arc in (doc.get("components") or {}):
        if arc.endswith(("/engine", "/draft_engine")):
            dirs.add(arc)
    return sorted(dirs)


def _check_host(report: VerifyReport, records: list[dict[str, Any]], host: HostInfo | None) -> None:
    if not records:
        return
    host = host if host is not None else probe_host()
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


def _verify_tarball(path: Path, report: VerifyReport) -> tuple[dict[str, Any], dict[str, str], dict[str, bytes]]:
    sha_file = path.with_name(path.name + ".sha256")
    if sha_file.exists():
        want = sha_file.read_text().split()[0] if sha_file.read_text().split() else ""
        got = sha256_file(path)
        if want != got:
            report.mismatches.append(f"{path.name}: sha256 {got[:12]}… != {sha_file.name} {want[:12]}…")
    doc: dict[str, Any] | None = None
    hashes: dict[str, str] = {}
    small: dict[str, bytes] = {}  # manifest.json / config.json contents for the host check
    prefix = None
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                name = member.name
                if prefix is None:
                    prefix = name.split("/", 1)[0]
                if not name.startswith(prefix + "/"):
                    if name != prefix:
                        report.mismatches.append(f"{name}: outside the release directory {prefix}/")
                    continue
                rel = name[len(prefix) + 1 :]
                if member.isdir():
                    continue
                if not member.isfile():
                    report.mismatches.append(f"{rel}: not a regular file (links are never part of a release)")
                    continue
                f = tar.extractfile(member)
                h = hashlib.sha256()
                keep = rel == RELEASE_JSON or rel.endswith(("/" + MANIFEST, "/config.json"))
                buf = bytearray()
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    if keep:
                        buf += chunk
                if rel == RELEASE_JSON:
                    doc = json.loads(bytes(buf))
                    continue
                hashes[rel] = h.hexdigest()
                if keep:
                    small[rel] = bytes(buf)
    except (tarfile.TarError, EOFError, OSError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VerifyError(f"{path} is not a readable release tarball ({exc}); re-download or rebuild it") from None
    if doc is None:
        raise VerifyError(f"{path} has no {RELEASE_JSON}; it is not a release made by `invoke release`")
    return doc, hashes, small


def verify(path: str | Path, *, host: HostInfo | None = None, check_host: bool = True) -> VerifyReport:
    """Verify a release tarball, an unpacked release dir, a Triton repo with manifests, or one stage output dir.

    Args:
        host: the serving host's toolchain/GPU; probed (compile stage probe, package metadata, nvidia-smi) if None.
        check_host: refuse engines built for another toolchain/GPU than `host`.

    Raises:
        HashMismatchError: any file differs from, is missing from, or is extra to its recorded hashes (exit 2).
        HostMismatchError: an engine's TensorRT-LLM/TensorRT version or SM differs from the host's (exit 2).
        VerifyError: the path is not something verifiable.
    """
    path = Path(path)
    if not path.exists():
        raise VerifyError(f"{path} does not exist; pass a release .tar.gz, an unpacked release or a Triton repo")
    records: list[dict[str, Any]] = []
    if path.is_file():
        report = VerifyReport(path, "tarball")
        doc, hashes, small = _verify_tarball(path, report)
        files = doc.get("files") or {}
        report.mismatches += _compare(files, hashes)
        report.files_checked = len(files)
        for d in _engines_in_release(doc, files):
            man = small.get(f"{d}/{MANIFEST}")
            cfg = small.get(f"{d}/config.json")
            rec = engine_record(json.loads(man) if man else None, json.loads(cfg) if cfg else None)
            records.append({"path": d, **rec})
    elif (path / RELEASE_JSON).is_file():
        report = VerifyReport(path, "release")
        try:
            doc = json.loads((path / RELEASE_JSON).read_text())
        except json.JSONDecodeError:
            raise VerifyError(f"{path / RELEASE_JSON} is corrupt; re-extract the release tarball") from None
        files = doc.get("files") or {}
        report.mismatches += _compare(files, _disk_hashes(path, skip={RELEASE_JSON}))
        report.files_checked = len(files)
        for d in _engines_in_release(doc, files):
            records.append({"path": d, **_engine_record_on_disk(path / d)})
    else:
        report = _verify_manifest_tree(path, records)
    report.engines = records
    if report.mismatches:
        shown = "; ".join(report.mismatches[:MAX_LISTED])
        more = f" (+{len(report.mismatches) - MAX_LISTED} more)" if len(report.mismatches) > MAX_LISTED else ""
        raise HashMismatchError(
            f"{path}: {len(report.mismatches)} file(s) differ from the recorded hashes: {shown}{more}; "
            "the artifact is corrupt or modified, re-download or rebuild it",
            report,
        )
    if check_host:
        _check_host(report, records, host)
        if report.host_diff:
            raise HostMismatchError(
                f"{path}: engine does not match this host: {'; '.join(report.host_diff)}; rebuild the engine on a "
                "host with this toolchain/GPU or serve it from the image/GPU it was built for",
                report,
            )
    return report


def _engine_record_on_disk(engine_dir: Path) -> dict[str, Any]:
    cfg = None
    if (engine_dir / "config.json").is_file():
        try:
            cfg = json.loads((engine_dir / "config.json").read_text())
        except json.JSONDecodeError:
            cfg = None
    return engine_record(read_manifest(engine_dir) if engine_dir.is_dir() else None, cfg)


def _manifest_files(manifest: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The file table of a stage manifest (stages call it `files` or `outputs`)."""
    for key in ("files", "outputs", "file_table"):
        table = manifest.get(key)
        if isinstance(table, dict) and all(isinstance(v, dict) and "sha256" in v for v in table.values()):
            return table
    return None


def _engine_path(cfg: Path) -> str:
    """The `gpt_model_path` of a model config (engine or reference checkpoint dir; "" if none or unparsable)."""
    from .errors import PackageError
    from .triton import pbtxt

    try:
        model = pbtxt.read(cfg)
    except PackageError:
        return ""
    return pbtxt.parameter(model, "gpt_model_path")


def _verify_manifest_tree(path: Path, records: list[dict[str, Any]]) -> VerifyReport:
    """A Triton repo or stage output: check every manifest's file table; follow gpt_model_path to engines."""
    manifests = sorted(path.rglob(MANIFEST))
    if not manifests:
        raise VerifyError(
            f"{path} has neither {RELEASE_JSON} nor any {MANIFEST}; pass a release or a repo built by this pipeline"
        )
    kind = "triton_repo" if any(path.glob("*/config.pbtxt")) else "stage_dir"
    report = VerifyReport(path, kind)
    checked_dirs: set[Path] = set()

    def check_dir(d: Path, label: str) -> None:
        if d in checked_dirs:
            return
        checked_dirs.add(d)
        m = read_manifest(d)
        table = _manifest_files(m or {})
        if table is None:
            report.notes.append(f"{label}: manifest has no file table; not hash-checked")
            return
        actual = {
            rel: (sha256_file(d / rel) if (d / rel).is_file() else None) for rel in table
        }
        for rel, rec in sorted(table.items()):
            got = actual[rel]
            if got is None:
                report.mismatches.append(f"{label}/{rel}: missing")
            elif got != rec["sha256"]:
                report.mismatches.append(f"{label}/{rel}: sha256 {got[:12]}… != recorded {rec['sha256'][:12]}…")
        report.files_checked += len(table)

    for mpath in manifests:
        d = mpath.parent
        label = d.relative_to(path).as_posix() or "."
        check_dir(d, label)
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
                check_dir(edir, str(edir))
            if any(edir.glob("rank*.engine")):
                records.append({"path": str(edir), **_engine_record_on_disk(edir)})
    return report
