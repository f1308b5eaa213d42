"""The identity of a stage's input: the typed result of the stage before it, or a directory from outside the
pipeline, identified here and only here (every stage key that names an input uses `Upstream.key`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.core.artifacts import MANIFEST, read_manifest, sha256_file
from pipeline.core.manifests import InputRecord, Manifest, StageResult

OUTSIDE = "file names, sizes and *.json contents (no pipeline manifest)"


@dataclass(frozen=True)
class Upstream:
    """An input directory and its key: the manifest key of a pipeline output, or for an outside directory a hash of
    its file names, sizes and JSON files (enough to notice another export without hashing many GB of weights)."""

    path: Path
    key: str
    manifest_sha256: str | None
    source: Literal["stage", "outside"]

    @classmethod
    def of(cls, res: StageResult[Manifest]) -> Upstream:
        """The input a stage result is to the next stage."""
        path = Path(res.path)
        return cls(path, res.manifest.key, sha256_file(path / MANIFEST) if (path / MANIFEST).is_file() else None,
                   "stage")

    @classmethod
    def of_dir(cls, path: str | Path) -> Upstream:
        """A directory given by path: its pipeline manifest's key when it has one, else its outside identity."""
        path = Path(path)
        manifest = read_manifest(path) if path.is_dir() else None
        if manifest and manifest.get("key"):
            return cls(path, str(manifest["key"]), sha256_file(path / MANIFEST), "stage")
        return cls(path, outside_key(path), None, "outside")

    def record(self) -> InputRecord:
        """How a manifest records the input (path, key, manifest hash; how an outside key was made)."""
        return InputRecord(path=str(self.path), key=self.key, manifest_sha256=self.manifest_sha256,
                           key_source=OUTSIDE if self.source == "outside" else None)


def outside_key(path: Path) -> str:
    """sha256 over every file's relative path and size, and the bytes of every *.json file, below `path`."""
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(f"{p.relative_to(path).as_posix()}:{p.stat().st_size}\n".encode())
            if p.suffix == ".json":
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()
