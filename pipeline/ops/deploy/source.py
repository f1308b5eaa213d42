"""What a deployment serves: a release (its `release.json`: spec, toolchain, file name, sha256) or a spec alone.

Only `release.json` is read (size-capped); the files themselves are verified on the serving nodes by `invoke verify`,
where the engine/toolchain mismatch refusal belongs. The file the nodes fetch is named as `invoke release` names it
(`pipeline.core.layout.release_file`, at `--release-version`); a name read back from a release is checked to be one
safe file name first. A release directory on this host (a Slurm `--release-volume`) must hold that file.
"""

from __future__ import annotations

import json
import tarfile
import zlib
from pathlib import Path

from pydantic import BaseModel, ValidationError

from pipeline import __version__
from pipeline.core.errors import DeployError, PipelineError, SpecError
from pipeline.core.layout import LEGACY_SUFFIX, RELEASE_SUFFIX, release_file, release_name_ok
from pipeline.core.spec import BuildSpec, spec_from_document
from pipeline.core.untrusted import open_regular, parse_json, read_bytes
from pipeline.ops.deploy.images import TRTLLM_VERSION
from pipeline.ops.release import RELEASE_JSON
from pipeline.ops.release_verify import MAX_METADATA_BYTES

SHA256_HEX = 64


class DeploySource(BaseModel):
    """The build a deployment serves and how the nodes get it."""

    spec: BuildSpec
    release_file: str  # the tarball's file name (what the init step fetches)
    sha256: str | None = None  # pinned when known (the release's .sha256: release.json's, or a format-1 tarball's)
    trtllm_version: str  # the engines' toolchain, the TensorRT-LLM a pytorch release is for, or the pipeline's
    origin: str  # "release" or "spec"


def _tar_release_json(path: Path, fix: str) -> bytes:
    """release.json of a release tarball (a regular file: a FIFO or device is refused before anything is read)."""
    try:
        with open_regular(path, what=f"--release {path}", fix=fix, error=DeployError) as f, \
                tarfile.open(fileobj=f, mode="r:*") as tar:
            for member in tar:
                parts = member.name.split("/")
                if len(parts) == 2 and parts[1] == RELEASE_JSON and member.isfile():
                    if member.size > MAX_METADATA_BYTES:
                        raise DeployError(f"{path}: {RELEASE_JSON} is {member.size} bytes, over the "
                                          f"{MAX_METADATA_BYTES >> 20} MiB limit; not a release of this pipeline")
                    data = tar.extractfile(member)  # None only for a member that is not a regular file
                    if data is not None:
                        return data.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        raise DeployError(f"--release {path}: not a readable release tarball; give a release made by "
                          "`invoke release`") from None
    raise DeployError(f"--release {path}: no <name>/{RELEASE_JSON} inside; give a release made by `invoke release`")


def _read_document(path: Path) -> tuple[dict, str | None]:
    """release.json and the release's pinned digest (its `.sha256` sidecar; None for a directory)."""
    fix = "give a release directory or tarball made by `invoke release`"
    if path.is_dir():
        doc_path = path / RELEASE_JSON
        try:
            raw = read_bytes(doc_path, cap=MAX_METADATA_BYTES, what=f"--release {doc_path}", fix=fix,
                             error=DeployError)
        except OSError:
            raise DeployError(f"--release {path}: no readable {RELEASE_JSON}; {fix}") from None
        digest = None
    elif path.exists():
        raw, digest = _tar_release_json(path, fix), None
        sidecar = path.with_name(path.name + ".sha256")
        try:
            first = read_bytes(sidecar, cap=4096, what=str(sidecar), fix=fix, error=DeployError).decode(
                errors="replace").split()
            digest = first[0] if first and len(first[0]) == SHA256_HEX else None
        except OSError:
            digest = None  # no sidecar: the digest is not pinned
    else:
        raise DeployError(f"--release {path} does not exist; give a release tarball or unpacked release directory")
    try:
        doc = parse_json(raw, what=f"--release {path}: {RELEASE_JSON}", fix="re-create it with `invoke release`",
                         error=DeployError)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DeployError(f"--release {path}: {RELEASE_JSON} is not JSON ({exc}); re-create it with `invoke release`")
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict) or not isinstance(doc.get("name"), str):
        raise DeployError(f"--release {path}: {RELEASE_JSON} has no spec/name; re-create it with `invoke release`")
    return doc, digest


def from_release(path: str | Path) -> DeploySource:
    """The release at `path` (tarball with its `.sha256`, or an unpacked directory)."""
    path = Path(path)
    doc, digest = _read_document(path)
    try:
        spec = spec_from_document(doc["spec"])
    except SpecError as exc:
        raise DeployError(f"--release {path}: recorded spec: {exc}; re-create the release with this pipeline "
                          "version") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise DeployError(f"--release {path}: recorded spec field {'.'.join(map(str, err['loc']))}: {err['msg']}; "
                          "re-create the release with this pipeline version") from None
    engine = ((doc.get("toolchain") or {}).get("engine") or {})
    serving = doc.get("serving") or {}  # a runtime-pytorch release has no engine: the TensorRT-LLM it is written for
    version = (engine.get("tensorrt_llm") if isinstance(engine, dict) else None) or (
        serving.get("tensorrt_llm") if isinstance(serving, dict) else None)
    name = doc["name"]
    if not release_name_ok(name):
        raise DeployError(f"--release {path}: {RELEASE_JSON} names the release {name[:80]!r}, not a safe file name "
                          "(letters, digits and . _ -, at most 128, no '/' or '..'); re-create it with `invoke release`")
    suffix = LEGACY_SUFFIX if path.name.endswith(LEGACY_SUFFIX) else RELEASE_SUFFIX
    return DeploySource(spec=spec, release_file=name + suffix, sha256=digest,
                        trtllm_version=str(version or TRTLLM_VERSION), origin="release")


def from_spec(spec: BuildSpec, version: str = __version__) -> DeploySource:
    """A spec whose release (`invoke release` of the same spec, at `version`) the nodes fetch."""
    try:
        name = release_file(spec, version)
    except PipelineError as exc:
        raise DeployError(f"--release-version {version!r}: not a version `invoke release --version` writes; use e.g. "
                          f"1.0.0 ({exc})") from None
    return DeploySource(spec=spec, release_file=name, trtllm_version=TRTLLM_VERSION, origin="spec")


def check_released(directory: str, src: DeploySource) -> None:
    """Refuse (DeployError) a release `directory` on this host that lacks `src.release_file`, naming the versions of
    this release found there; a directory not on this host (only on the cluster) is not checked."""
    path = Path(directory)
    if not path.is_dir() or (path / src.release_file).is_file():
        return
    stem = src.release_file.removesuffix(LEGACY_SUFFIX).removesuffix(RELEASE_SUFFIX)
    prefix = stem.rpartition("-v")[0] + "-v"
    found = sorted(f.name[len(prefix):].removesuffix(LEGACY_SUFFIX).removesuffix(RELEASE_SUFFIX) for f in
                   path.iterdir() if f.name.startswith(prefix) and f.name.endswith((RELEASE_SUFFIX, LEGACY_SUFFIX)))
    there = f"versions there: {', '.join(found)}" if found else "no version of this release is there"
    raise DeployError(f"--release-volume {directory}: no {src.release_file} ({there}); pass --release-version "
                      "VERSION as released, or `invoke release --output` it there")
