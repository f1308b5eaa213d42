"""The backend interface: what one (runtime, target) pair does differently, asked by the stages and tasks.

A backend owns its stage list, its calibrate export format, its package step, its serve/deploy runtime, what a
release ships and the resource terms that depend on it. The rest of the pipeline asks it and never compares
`runtime`/`target` strings; `pipeline.backends.backend_for` is the one place that picks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec
    from pipeline.ops.deploy.runtime import Runtime
    from pipeline.planning.placement import Placement


@runtime_checkable
class CheckpointFormat(Protocol):
    """What calibrate exports: a TP/PP-sharded TensorRT-LLM checkpoint or an unsharded unified HF checkpoint."""

    runtime: str  # the runtime that loads it
    dirname: str  # its directory under engines/<build-id>/
    sharded: bool  # rank files per TP×PP rank (False: the loader shards at load)
    export_label: str  # the calibrate progress line's words
    key_factors: dict[str, str]  # what the format adds to calibrate's key ({} keeps the engine path's keys)
    export_tier: str | None  # the round-trip tolerance tier of a quantized export (None: by precision)

    def tokenizer_dir(self, checkpoint: Path) -> Path:
        """Where the checkpoint holds its tokenizer files."""
        ...

    def copy_tokenizer(self, src: Path, checkpoint: Path) -> list[str]:
        """Copy the tokenizer files of the HF model dir `src` into the checkpoint; the names copied."""
        ...

    def export(self, model: Any, out: Path, *, tp: int, pp: int, dtype: str, exact: bool, quant_algo: str | None,
               kv_algo: str | None) -> tuple[Any, dict[str, Any]]:
        """Export `model` (weights in `dtype`) into `out` and check it: (the fake-quant model the export corresponds
        to, the manifest's `checkpoint` fields). `exact=False`: too large for an exact float32 reference copy."""
        ...

    def load(self, checkpoint: Path) -> Any:
        """The exported checkpoint as a transformers model on CPU (the round-trip check)."""
        ...

    def export_copy_kind(self, *, roundtrip: bool) -> str:
        """The export's host-copy term (`pipeline.stages.resources.EXPORT_COPY_BYTES_PER_PARAM`)."""
        ...


@dataclass(frozen=True)
class PackageInputs:
    """Directories and names the package step reads (None: not given; the backend says which it needs)."""

    checkpoint: Path | None = None
    draft_checkpoint: Path | None = None
    engine: Path | None = None
    draft_engine: Path | None = None
    tokenizer: Path | None = None
    draft_tokenizer: Path | None = None
    output: Path | None = None
    build_id: str | None = None
    name: str | None = None
    spec_key: str | None = None


@runtime_checkable
class Backend(Protocol):
    """One way of building and serving a spec (see the module docstring)."""

    name: str
    runtime: str  # the spec's runtime (recorded in manifests)
    target: str  # the spec's target (recorded in manifests)
    checkpoint: CheckpointFormat
    stages: tuple[str, ...]  # the build stages after `check`, in order
    compiles: bool  # builds TensorRT engines (trtllm-build)
    gpu: bool  # serves on GPUs; False: the CPU reference
    llmapi: bool  # served by TensorRT-LLM's PyTorch backend through the LLM API (LLM-API options, no engines)
    repo_kind: str  # the repository `package` makes: engine | llmapi | reference
    repo_suffix: str  # appended to repository and release names
    package_from: str  # the build output the repository serves: engine | checkpoint
    release_roles: tuple[str, str]  # the build outputs a release ships beside the repository (target, draft)
    no_compile: str  # why there is no compile stage (empty when it compiles)
    no_force_compile: str  # the `--force compile` error (empty when it compiles)

    def check_note(self, spec: BuildSpec) -> str | None:
        """The `check` stage's line when there is nothing to preflight (None: run the compile preflight)."""
        ...

    def package(self, spec: BuildSpec, inputs: PackageInputs, *, force: bool = False, check_only: bool = False,
                verify: bool = False) -> Any:
        """Render, validate and publish the repository (a `PackageResult`)."""
        ...

    def repo_note(self) -> str | None:
        """A word for the package lines (`llmapi`), or None."""
        ...

    def deploys_on(self, platform: str) -> bool:
        """Whether `deploy` renders this build for `platform`."""
        ...

    def deploy_runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str,
                       serve_mode: str | None) -> Runtime:
        """What runs on the deployed nodes (`serve_mode`: triton | trtllm-serve | None for the default)."""
        ...
