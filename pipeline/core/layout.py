"""One build layout: a build id (plus the spec's key for what depends on the whole spec) -> every output path.

    engines/<build-id>/checkpoint/          calibrate (target); the draft's is engines/<draft-build-id>/checkpoint/
    engines/<build-id>/hf_checkpoint/       calibrate for runtime pytorch: a quantized Hugging Face checkpoint
                                            (hf_quant_config.json, tokenizer at its root); the draft's likewise
    engines/<build-id>/engine/, draft_engine/   compile (target trtllm)
    triton_repo/<build-id>-<spec-key8>[-reference]/   package
    releases/<model>-<precision>-<spec-key8>[-reference]-v<version>.tar   release (`release_file`)
    engines/.refs/<stage>/<spec identity>.json   the build refs (`pipeline.core.refs`)

A build id is `<model>-<precision>-<calibrate key12>`; the repository name adds the first 8 hex digits of the spec's
key, `BuildSpec.identity("package")`: the hash of exactly the package stage's spec factors, so two specs sharing a
checkpoint (e.g. with and without a draft) never share a repository, and what never changes an artifact (GPU price,
node count, GPUs per host, memory fractions, the registry file's path) never renames one. A release file is named
from the same key (no stage output is read), so `deploy` from a spec names the file `release` writes. Every name is
checked to be one safe path component.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.runtimes import RuntimeTarget, runtime_of, runtime_named, checkpoint_format
from pipeline.core.artifacts import check_name, engines_dir, triton_repo_dir
from pipeline.core.errors import ReleaseError

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

SPEC_KEY_CHARS = 8
PENDING = "<build-id>"  # stands in a plan's paths for the id calibration will give the build
RELEASE_SUFFIX = ".tar"  # uncompressed: FP8/BF16 weights barely compress (see README, Release)
LEGACY_SUFFIX = ".tar.gz"  # releases written before the uncompressed format (verify still reads them)
RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def checkpoint_dir(build_id: str) -> Path:
    return engines_dir() / check_name(build_id, what="build id", fix="fix the model name") / "checkpoint"


def precision_search_file(build_id: str) -> Path:
    """The `precision: auto` record of the build whose precision it chose."""
    return checkpoint_dir(build_id).parent / "precision_search.json"


def runtime_checkpoint_dir(build_id: str, runtime: str) -> Path:
    """The calibrate output of `build_id` for `runtime` (engine: TensorRT-LLM checkpoint; pytorch: HF)."""
    return engines_dir() / check_name(build_id, what="build id", fix="fix the model name") / \
        checkpoint_format(runtime).dirname


def repo_name(build_id: str, backend: RuntimeTarget, spec_key: str | None = None) -> str:
    """`<build-id>[-<spec-key8>][-reference]`: the repository directory name of a build served by `backend`."""
    name = build_id + (f"-{spec_key[:SPEC_KEY_CHARS]}" if spec_key else "") + backend.repo_suffix
    return check_name(name, what="repository name", fix="use a build id of letters, digits and . _ + -")


def release_name_ok(name: object) -> bool:
    """Whether `name` may name a release file: letters, digits and `._-`, at most 128, no `..` (so no `/` either)."""
    return isinstance(name, str) and bool(RELEASE_NAME.match(name)) and ".." not in name


def release_key(spec: BuildSpec) -> str:
    """The key a release of `spec` is named by: the package stage's spec identity (what the release holds)."""
    return spec.identity("package")


def release_name(spec: BuildSpec, version: str) -> str:
    """`<model>-<precision>-<release-key8>[-reference]-v<version>`: the release of `spec` (its tarball's stem and the
    directory inside it).

    Raises:
        PipelineError: a version that is not a safe name; ReleaseError: a name with `+` or over 128 characters.
    """
    check_name(version, what="--version", fix="use e.g. 1.0.0 or 2024.06.1-rc1")
    ref = runtime_of(spec).repo_suffix
    name = f"{spec.model.name}-{spec.quantization.precision}-{release_key(spec)[:SPEC_KEY_CHARS]}{ref}-v{version}"
    if not release_name_ok(name):
        raise ReleaseError(f"release name {name!r} is not a safe file name (letters, digits and . _ -, at most 128 "
                           "characters); choose a --version of letters, digits and . _ - (e.g. 1.0.0)", actual=name)
    return name


def release_file(spec: BuildSpec, version: str) -> str:
    """The release tarball's file name for `spec` at `version` (what `release` writes and `deploy` fetches)."""
    return release_name(spec, version) + RELEASE_SUFFIX


@dataclass(frozen=True)
class BuildLayout:
    """Where every output of one build is (paths only; nothing is read or written)."""

    build_id: str
    target: str
    spec_key: str
    draft_build_id: str | None = None
    runtime: str = "engine"

    @property
    def checkpoint(self) -> Path:
        return runtime_checkpoint_dir(self.build_id, self.runtime)

    @property
    def draft_checkpoint(self) -> Path | None:
        return runtime_checkpoint_dir(self.draft_build_id, self.runtime) if self.draft_build_id else None

    @property
    def precision_search(self) -> Path:
        """What `precision: auto` tried and measured (`manifests.PrecisionSearch`), when the build chose so."""
        return precision_search_file(self.build_id)

    @property
    def tokenizer(self) -> Path:
        """The tokenizer files: `tokenizer/` of a TensorRT-LLM checkpoint, the root of a Hugging Face one."""
        return checkpoint_format(self.runtime).tokenizer_dir(self.checkpoint)

    @property
    def engine(self) -> Path:
        return checkpoint_dir(self.build_id).parent / "engine"

    @property
    def draft_engine(self) -> Path | None:
        return checkpoint_dir(self.build_id).parent / "draft_engine" if self.draft_build_id else None

    @property
    def repo_name(self) -> str:
        return repo_name(self.build_id, runtime_named(self.runtime, self.target), self.spec_key)

    @property
    def triton_repo(self) -> Path:
        return triton_repo_dir() / self.repo_name
