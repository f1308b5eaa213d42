"""One build layout: a build id (plus the spec's key for what depends on the whole spec) -> every output path.

    engines/<build-id>/checkpoint/          calibrate (target); the draft's is engines/<draft-build-id>/checkpoint/
    engines/<build-id>/engine/, draft_engine/   compile (target trtllm)
    triton_repo/<build-id>-<spec-key8>[-reference]/   package
    releases/<repo-name>-v<version>.tar.gz   release

A build id is `<model>-<precision>-<calibrate key12>`; the repository and release names add the first 8 hex digits
of the spec's key, so two specs sharing a checkpoint (e.g. with and without a draft) never share a repository or a
release file. Every name is checked to be one safe path component.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .artifacts import check_name, engines_dir, triton_repo_dir

SPEC_KEY_CHARS = 8


def checkpoint_dir(build_id: str) -> Path:
    return engines_dir() / check_name(build_id, what="build id", fix="fix the model name") / "checkpoint"


def repo_name(build_id: str, target: str, spec_key: str | None = None) -> str:
    """`<build-id>[-<spec-key8>][-reference]`: the repository directory name of a build."""
    name = build_id + (f"-{spec_key[:SPEC_KEY_CHARS]}" if spec_key else "")
    name += "-reference" if target == "reference" else ""
    return check_name(name, what="repository name", fix="use a build id of letters, digits and . _ + -")


@dataclass(frozen=True)
class BuildLayout:
    """Where every output of one build is (paths only; nothing is read or written)."""

    build_id: str
    target: str
    spec_key: str
    draft_build_id: str | None = None

    @property
    def checkpoint(self) -> Path:
        return checkpoint_dir(self.build_id)

    @property
    def draft_checkpoint(self) -> Path | None:
        return checkpoint_dir(self.draft_build_id) if self.draft_build_id else None

    @property
    def tokenizer(self) -> Path:
        return self.checkpoint / "tokenizer"

    @property
    def engine(self) -> Path:
        return self.checkpoint.parent / "engine"

    @property
    def draft_engine(self) -> Path | None:
        return self.checkpoint.parent / "draft_engine" if self.draft_build_id else None

    @property
    def repo_name(self) -> str:
        return repo_name(self.build_id, self.target, self.spec_key)

    @property
    def triton_repo(self) -> Path:
        return triton_repo_dir() / self.repo_name

    def release_name(self, version: str) -> str:
        check_name(version, what="--version", fix="use e.g. 1.0.0 or 2024.06.1-rc1")
        return f"{self.repo_name}-v{version}"
