"""What each runtime × target is: one frozen row per pair, written once in `RUNTIMES`, readable by every layer.

    runtime  target     checkpoint       compiles  GPU  repository  serves
    engine   trtllm     TensorRT-LLM     yes       yes  ensemble    Triton `tensorrtllm` / trtllm-serve (tensorrt)
    pytorch  trtllm     unified HF       no        yes  llmapi      trtllm-serve (pytorch)
    engine   reference  TensorRT-LLM     no        no   ensemble    CPU PyTorch behind the Triton contract
    pytorch  reference  unified HF       no        no   llmapi      CPU transformers behind the Triton contract

Rows are data, with a few answers derived from it alone (no I/O, no imports above `core`). What a pair *does*
(package, export, deploy runtime) is chosen from its row by the layer that does it:
`pipeline.stages.package.repository`, `pipeline.stages.calibrate.formats`, `pipeline.ops.deploy.runtime`, and
`pipeline.backends`, which gathers them for the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Mapping, Protocol

from pipeline.core.errors import DeployError, SpecError


RepoKind = Literal["engine", "llmapi", "reference"]  # a repository's kind in the launch plan


class Pair(Protocol):
    """What names a row: a spec, a manifest."""

    @property
    def runtime(self) -> str: ...
    @property
    def target(self) -> str: ...


@dataclass(frozen=True, eq=False)
class CheckpointFormat:
    """What calibrate exports: a TP/PP-sharded TensorRT-LLM checkpoint or an unsharded unified HF checkpoint."""

    name: str  # trtllm | hf: the exporter `pipeline.stages.calibrate.formats` runs
    runtime: str  # the runtime that loads it
    dirname: str  # its directory under engines/<build-id>/
    sharded: bool  # rank files per TP×PP rank (False: the loader shards at load)
    export_label: str  # the calibrate progress line's words
    key_factors: Mapping[str, str]  # what the format adds to calibrate's key (empty: the engine path's keys)
    export_tier: str | None  # the round-trip tolerance tier of a quantized export (None: by precision)
    tokenizer_subdir: str  # where the checkpoint keeps its tokenizer files ("": at its root)
    copy_kind: str  # the export's host-copy term (`pipeline.stages.resources.EXPORT_COPY_BYTES_PER_PARAM`)
    copy_kind_large: str  # the same without the round-trip's exact float32 copy
    tokenizer_needed_by: str  # who reads the copied tokenizer (its error message)

    def tokenizer_dir(self, checkpoint: Path) -> Path:
        """Where the checkpoint `checkpoint` holds its tokenizer files."""
        return Path(checkpoint) / self.tokenizer_subdir if self.tokenizer_subdir else Path(checkpoint)

    def export_copy_kind(self, *, roundtrip: bool) -> str:
        return self.copy_kind if roundtrip else self.copy_kind_large


@dataclass(frozen=True)
class RuntimeTarget:
    """One (runtime, target) pair: what it builds, how its repository looks, where and how it is served."""

    name: str
    runtime: str  # the spec's runtime (recorded in manifests)
    target: str  # the spec's target (recorded in manifests)
    checkpoint: CheckpointFormat
    stages: tuple[str, ...]  # the build stages after `check`, in order
    compiles: bool  # builds TensorRT engines (trtllm-build)
    gpu: bool  # serves on GPUs; False: the CPU reference
    llmapi: bool  # served through the LLM API (LLM-API options, the draft inside the target's LLM, no engines)
    layout: str  # the repository `package` renders: ensemble | llmapi
    repo_kind: RepoKind
    repo_suffix: str  # appended to repository and release names
    package_from: str  # the build output the repository serves: engine | checkpoint
    release_roles: tuple[str, str]  # the build outputs a release ships beside the repository (target, draft)
    no_compile: str  # why there is no compile stage (empty when it compiles)
    no_force_compile: str  # the `--force compile` error (empty when it compiles)
    check_note: str | None  # the `check` stage's line when there is nothing to preflight (None: run the preflight)
    deploy_platforms: tuple[str, ...]  # where `deploy` renders it
    # deploy --serve-mode -> the served runtime (`pipeline.ops.deploy.runtime.SERVED`); the first is the default
    serve_modes: tuple[tuple[str, str], ...]
    refused_modes: tuple[tuple[str, str], ...]  # deploy --serve-mode -> why this pair refuses it

    @property
    def repo_note(self) -> str | None:
        """A word for the package lines (`llmapi`), or None."""
        return "llmapi" if self.layout == "llmapi" else None

    def gpus(self, world_size: int) -> int:
        """The GPUs a build of this pair holds at `world_size` ranks (0: the CPU reference)."""
        return world_size if self.gpu else 0

    def deploys_on(self, platform: str) -> bool:
        return platform in self.deploy_platforms

    def served_as(self, serve_mode: str | None) -> str:
        """The served runtime `deploy --serve-mode serve_mode` runs (None: the default).

        Raises:
            DeployError: a serve mode this pair refuses.
        """
        if serve_mode is None:
            return self.serve_modes[0][1]
        modes, refused = dict(self.serve_modes), dict(self.refused_modes)
        if serve_mode in refused:
            raise DeployError(refused[serve_mode])
        return modes[serve_mode]


TRTLLM_CHECKPOINT = CheckpointFormat(
    name="trtllm", runtime="engine", dirname="checkpoint", sharded=True, export_label="checkpoint export",
    key_factors=MappingProxyType({}), export_tier=None, tokenizer_subdir="tokenizer", copy_kind="engine", copy_kind_large="engine",
    tokenizer_needed_by="the Triton repo")
# a runtime-pytorch export differs in format; the engine runtime's keys (and build ids) stay as they were
HF_CHECKPOINT = CheckpointFormat(
    name="hf", runtime="pytorch", dirname="hf_checkpoint", sharded=False, export_label="Hugging Face checkpoint export",
    key_factors=MappingProxyType({"runtime": "pytorch"}), export_tier="hf_export", tokenizer_subdir="", copy_kind="pytorch",
    copy_kind_large="pytorch-large", tokenizer_needed_by="the PyTorch backend")

_NO_COMPILE_PYTORCH = "no-op, nothing to compile: runtime pytorch loads the Hugging Face checkpoint at serve time"
_NO_FORCE_PYTORCH = "--force compile: runtime pytorch has nothing to compile; use --force calibrate or package"
_TRITON_ON_PYTORCH = ("--serve-mode triton: a runtime-pytorch release is deployed with trtllm-serve; drop --serve-mode "
                      "(or pass --serve-mode trtllm-serve)")
_SERVE_ON_REFERENCE = ("--serve-mode trtllm-serve needs TensorRT-LLM engines or a checkpoint on GPUs; a --target "
                       "reference build is served by tritonserver: drop --serve-mode")
_STAGES = ("download", "calibrate", "package")

RUNTIMES: tuple[RuntimeTarget, ...] = (
    RuntimeTarget(
        name="engine-triton", runtime="engine", target="trtllm", checkpoint=TRTLLM_CHECKPOINT,
        stages=("download", "calibrate", "compile", "package"), compiles=True, gpu=True, llmapi=False,
        layout="ensemble", repo_kind="engine", repo_suffix="", package_from="engine",
        release_roles=("engine", "draft_engine"), no_compile="", no_force_compile="", check_note=None,
        deploy_platforms=("k8s", "slurm"), serve_modes=(("triton", "triton"), ("trtllm-serve", "trtllm-serve-engine")),
        refused_modes=()),
    RuntimeTarget(
        name="pytorch-llmapi", runtime="pytorch", target="trtllm", checkpoint=HF_CHECKPOINT, stages=_STAGES,
        compiles=False, gpu=True, llmapi=True, layout="llmapi", repo_kind="llmapi", repo_suffix="",
        package_from="checkpoint", release_roles=("checkpoint", "draft_checkpoint"), no_compile=_NO_COMPILE_PYTORCH,
        no_force_compile=_NO_FORCE_PYTORCH,
        check_note="spec ok; runtime pytorch, target trtllm (Hugging Face checkpoint, no engines)",
        deploy_platforms=("k8s", "slurm", "dynamo"), serve_modes=(("trtllm-serve", "trtllm-serve-pytorch"),),
        refused_modes=(("triton", _TRITON_ON_PYTORCH),)),
    RuntimeTarget(
        name="engine-reference", runtime="engine", target="reference", checkpoint=TRTLLM_CHECKPOINT, stages=_STAGES,
        compiles=False, gpu=False, llmapi=False, layout="ensemble", repo_kind="reference", repo_suffix="-reference",
        package_from="checkpoint", release_roles=("checkpoint", "draft_checkpoint"),
        no_compile="target reference: no engines",
        no_force_compile="--force compile: target=reference has no compile stage; use --target trtllm",
        check_note="spec ok; reference target (PyTorch backend, no engines)",
        deploy_platforms=("slurm",),  # a demo of the engine-path scripts on CPU nodes
        serve_modes=(("triton", "triton-reference"),), refused_modes=(("trtllm-serve", _SERVE_ON_REFERENCE),)),
    RuntimeTarget(
        name="pytorch-reference", runtime="pytorch", target="reference", checkpoint=HF_CHECKPOINT, stages=_STAGES,
        compiles=False, gpu=False, llmapi=True, layout="llmapi", repo_kind="reference", repo_suffix="-reference",
        package_from="checkpoint", release_roles=("checkpoint", "draft_checkpoint"), no_compile=_NO_COMPILE_PYTORCH,
        no_force_compile=_NO_FORCE_PYTORCH,
        check_note="spec ok; runtime pytorch, target reference (Hugging Face checkpoint, no engines)",
        deploy_platforms=(), serve_modes=(("triton", "triton-reference"),),
        refused_modes=(("trtllm-serve", _SERVE_ON_REFERENCE),)),
)
_BY_PAIR = {(r.runtime, r.target): r for r in RUNTIMES}
_FORMATS = {f.runtime: f for f in (TRTLLM_CHECKPOINT, HF_CHECKPOINT)}


def runtime_named(runtime: str, target: str) -> RuntimeTarget:
    """The row of a recorded (runtime, target) pair, e.g. a manifest's.

    Raises:
        SpecError: a pair with no row.
    """
    try:
        return _BY_PAIR[(runtime, target)]
    except KeyError:
        raise SpecError(f"runtime {runtime!r} with target {target!r} has no backend; use runtime engine|pytorch "
                        "and target trtllm|reference") from None


def runtime_of(spec: Pair) -> RuntimeTarget:
    """The row that builds and serves `spec` (a `BuildSpec`, or anything naming a runtime and a target)."""
    return runtime_named(spec.runtime, spec.target)


def checkpoint_format(runtime: str) -> CheckpointFormat:
    """What calibrate exports for `runtime` (engine: TensorRT-LLM checkpoint; pytorch: unified HF checkpoint).

    Raises:
        SpecError: an unknown runtime.
    """
    try:
        return _FORMATS[runtime]
    except KeyError:
        raise SpecError(f"runtime {runtime!r} is not one of {', '.join(_FORMATS)}") from None
