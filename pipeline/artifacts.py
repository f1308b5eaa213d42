"""Output-tree helpers shared by every stage: safe paths, atomic directories, hashes, manifests, stage keys, locks.

Stages write into a temporary sibling and rename it into place, so nothing half-written is ever visible under the
final name; each finished stage directory holds `manifest.json` whose `key` is the hash of exactly its inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from .errors import PipelineError

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def output_root() -> Path:
    """Root of the output tree (holds `engines/` and `triton_repo/`): $PIPELINE_ROOT or the current directory."""
    return Path(os.environ.get("PIPELINE_ROOT", ".")).resolve()


def engines_dir() -> Path:
    return output_root() / "engines"


def triton_repo_dir() -> Path:
    return output_root() / "triton_repo"


def cache_dir() -> Path:
    """Download/generation cache: $PIPELINE_CACHE or ~/.cache/trtllm-pipeline."""
    default = Path.home() / ".cache" / "trtllm-pipeline"
    return Path(os.environ.get("PIPELINE_CACHE", default)).expanduser().resolve()


def safe_join(base: Path, *parts: str) -> Path:
    """Join under `base`, refusing any result that escapes it (.., absolute parts, symlinks out)."""
    base = Path(base).resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise PipelineError(f"path {'/'.join(parts)!r} escapes the output tree {base}; use a name inside it")
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_table(root: Path, *, exclude: tuple[str, ...] = (MANIFEST,)) -> dict[str, dict[str, Any]]:
    """relative path -> {sha256, size} for every regular file below `root` (sorted, manifest excluded)."""
    root = Path(root)
    table = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not p.is_symlink() and rel not in exclude:
            table[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    return table


def stage_key(factors: dict[str, Any]) -> str:
    """Stable hash of a stage's input factors (JSON, sorted keys)."""
    blob = json.dumps(factors, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def write_manifest(directory: Path, data: dict[str, Any]) -> Path:
    path = Path(directory) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        raise PipelineError(f"{path} is corrupt; delete {Path(directory)} and re-run the stage") from None


def is_current(directory: Path, key: str) -> bool:
    """True when `directory` holds a finished stage output whose manifest key equals `key`."""
    m = read_manifest(directory) if Path(directory).is_dir() else None
    return bool(m) and m.get("key") == key


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory next to `final`; on success it replaces `final`, on error it vanishes."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def stage_lock(directory: Path, timeout: float = -1) -> Iterator[None]:
    """Serialize concurrent builds of the same stage output (a lock file beside the directory)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory.parent / f".{directory.name}.lock"), timeout=timeout):
        yield
