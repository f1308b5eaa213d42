"""Output-tree helpers shared by every stage: safe paths, atomic directories, hashes, manifests, stage keys, locks.

Stages write into a temporary sibling and rename it into place, so nothing half-written is ever visible under the
final name; each finished stage directory holds `manifest.json` whose `key` is the hash of exactly its inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from pipeline.core.errors import PipelineError
from pipeline.core.procs import pid_alive
from pipeline.core.untrusted import read_json

MANIFEST = "manifest.json"
_CHUNK = 1 << 20
# Everything that becomes a file or directory name (registry names, versions, build ids, repo names).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_TEMP_PREFIXES = (".tmp-", ".old-")
SYMLINK = "a symlink (outputs hold regular files only)"


def check_name(value: Any, *, what: str, fix: str) -> str:
    """`value` when it is a safe single path component (letters, digits, `._+-`, no `..`), else `PipelineError`."""
    if not isinstance(value, str) or not SAFE_NAME.match(value) or ".." in value:
        raise PipelineError(f"{what} {value!r} is not a safe name (letters, digits and . _ + -, starting with a "
                            f"letter or digit, no '..', at most 128 characters); {fix}", actual=value)
    return value


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
    """relative path -> {sha256, size, mtime_ns} for every regular file below `root` (sorted, manifest excluded).

    Raises:
        PipelineError: `root` holds a symlink (stage outputs are regular files only).
    """
    root = Path(root)
    table = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            raise PipelineError(f"{p} is a symlink; stage outputs hold regular files only", path=p)
        if p.is_file() and rel not in exclude:
            st = p.stat()
            table[rel] = {"sha256": sha256_file(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return table


def _inside(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts and "\\" not in rel


def check_files(root: Path, files: Mapping[str, Any], *, full: bool = False,
                ignore: tuple[str, ...] = (MANIFEST,)) -> list[str]:
    """How `root` differs from a file table (records with `sha256`, `size`, optional `mtime_ns`); [] if it matches.

    The table must be complete: a file it does not list, a symlink, or a listed path outside `root` is a problem.
    Listed files are compared by size, then by sha256 when `full`, when no mtime was recorded or when it changed.
    """
    root = Path(root)
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(dirnames + filenames):
            p = here / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                problems.append(f"{rel}: {SYMLINK}")
            elif name in filenames and rel not in files and rel not in ignore:
                problems.append(f"{rel}: not in the manifest")
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    for rel, rec in sorted(files.items()):
        if not _inside(rel):
            problems.append(f"{rel}: outside the directory")
            continue
        p = root / rel
        try:
            st = p.lstat()
        except FileNotFoundError:
            problems.append(f"{rel}: missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            if not stat.S_ISLNK(st.st_mode):  # symlinks were reported by the walk
                problems.append(f"{rel}: not a regular file")
        elif st.st_size != rec.size:
            problems.append(f"{rel}: {st.st_size} bytes, recorded {rec.size}")
        elif full or rec.mtime_ns is None or st.st_mtime_ns != rec.mtime_ns:
            got = sha256_file(p)
            if got != rec.sha256:
                problems.append(f"{rel}: sha256 {got[:12]}… != recorded {rec.sha256[:12]}…")
    return problems


def stage_key(factors: dict[str, Any]) -> str:
    """Stable hash of a stage's input factors (JSON, sorted keys)."""
    blob = json.dumps(factors, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def write_manifest(directory: Path, data: dict[str, Any]) -> Path:
    return replace_file(Path(directory) / MANIFEST,
                        lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"))


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a stage directory (None when it has none), read through `pipeline.core.untrusted`."""
    path = Path(directory) / MANIFEST
    try:
        data = read_json(path, what=str(path), fix=f"the manifest is corrupt: delete {Path(directory)} and re-run the stage")
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise PipelineError(f"{path} is corrupt; delete {Path(directory)} and re-run the stage", path=path)
    return data


def read_config_json(path: Path, error: type[PipelineError], *, missing: str, fix: str) -> dict[str, Any]:
    """A JSON object from `path`, read through `pipeline.core.untrusted` (a regular file, size and depth capped).

    Raises:
        error: `missing` when the file is absent; otherwise one line naming `path` and what is wrong, ending `fix`.
    """
    try:
        data = read_json(path, what=str(path), fix=fix, error=error)
    except FileNotFoundError:
        raise error(missing) from None
    except OSError as exc:
        raise error(f"{path} cannot be read ({exc.strerror or exc}); {fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path} is not a JSON object; {fix}")
    return data


def is_current(directory: Path, key: str) -> bool:
    """True when `directory` holds a finished stage output whose manifest key equals `key`."""
    m = read_manifest(directory) if Path(directory).is_dir() else None
    return m is not None and m.get("key") == key


def remove_stale_temps(final: Path) -> list[Path]:
    """Remove `.tmp-<name>-<pid>-*` / `.old-<name>-<pid>-*` siblings of `final` left by a process that died (e.g.
    SIGKILL mid-stage); temporaries of live processes are kept. Returns what was removed."""
    final = Path(final)
    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    for prefix in _TEMP_PREFIXES:
        for p in final.parent.glob(f"{prefix}{final.name}-*"):
            pid = p.name[len(prefix) + len(final.name) + 1 :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def _protected() -> list[Path]:
    """Directories never replaced, nor any parent of them: the output root, the working directory and its git
    checkout, this pipeline's checkout, $HOME and `/`."""
    cwd = Path.cwd().resolve()
    checkout = next((p for p in (cwd, *cwd.parents) if (p / ".git").exists()), None)
    dirs = [output_root(), cwd, Path(__file__).resolve().parents[2], Path.home().resolve(), Path("/")]
    return dirs + ([checkout] if checkout else [])


def check_replaceable(path: Path, *, marker: str, fix: str) -> None:
    """Refuse (exit 2) to replace an existing `path` unless it is a directory this pipeline wrote (it holds the
    entry `marker`, not a symlink) and is none of the protected directories nor a parent of one.

    Args:
        path: the directory about to be replaced (nothing to check when it does not exist).
        marker: what the writer always puts in it (`manifest.json`, a deploy's `deploy.json`).
        fix: what the user should do instead, e.g. "choose another --output".
    """
    path = Path(path)
    if not os.path.lexists(path):
        return
    real = path.resolve()
    if path.is_symlink() or not path.is_dir():
        why = "is not a directory this pipeline wrote"
    elif any(real == p or real in p.parents for p in _protected()):
        why = "is the output root, a checkout, $HOME or / (or a parent of one)"
    elif (real / marker).is_symlink() or not (real / marker).exists():
        why = f"was not written by this pipeline (no {marker})"
    else:
        return
    raise PipelineError(f"{path} {why}; nothing was deleted: {fix}", path=path)


def replace_file(path: Path, write: Callable[[Path], object]) -> Path:
    """Write the file `path` (a report the user named) through `write(tmp)` on a temporary beside it, then rename it
    over `path`: a reader sees the old file or the whole new one, and on failure (a full disk) the temporary is gone
    and an existing `path` untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def atomic_dir(final: Path, *, marker: str = MANIFEST,
               fix: str = "move it away or remove it yourself, then re-run") -> Iterator[Path]:
    """Yield a fresh temporary directory next to `final`; on success it replaces `final`, on error it vanishes.

    An existing `final` is replaced only when `check_replaceable(final, marker=marker, fix=fix)` allows it, checked
    before anything is written. Temporaries that a killed earlier run left beside `final` are removed first.
    """
    final = Path(final)
    check_replaceable(final, marker=marker, fix=fix)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final)
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
