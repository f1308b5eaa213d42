"""CPU reference (target reference): the build's checkpoint served on CPU with PyTorch behind the same Triton
contract, for tests and demos without a GPU. Runtime engine: the TensorRT-LLM checkpoint in the ensemble layout
(Python backend in place of `tensorrtllm`); runtime pytorch: the HF checkpoint in the `llmapi` layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.backends.base import CheckpointFormat
from pipeline.backends.engine_triton import EnsembleRepository
from pipeline.backends.formats import HF_CHECKPOINT, TRTLLM_CHECKPOINT
from pipeline.backends.pytorch_llmapi import _NO_COMPILE, _NO_FORCE_COMPILE, LlmapiRepository
from pipeline.core.errors import DeployError

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec
    from pipeline.ops.deploy.runtime import Runtime
    from pipeline.planning.placement import Placement


@dataclass(frozen=True)
class _Reference:
    name: str
    runtime: str
    checkpoint: CheckpointFormat
    llmapi: bool
    no_compile: str
    no_force_compile: str
    target: str = "reference"
    stages: tuple[str, ...] = ("download", "calibrate", "package")
    compiles: bool = False
    gpu: bool = False
    repo_kind: str = "reference"
    repo_suffix: str = "-reference"
    package_from: str = "checkpoint"
    release_roles: tuple[str, str] = ("checkpoint", "draft_checkpoint")

    def deploy_runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str,
                       serve_mode: str | None) -> Runtime:
        from pipeline.ops.deploy.runtime import reference_runtime

        if serve_mode == "trtllm-serve":
            raise DeployError("--serve-mode trtllm-serve needs TensorRT-LLM engines or a checkpoint on GPUs; a "
                              "--target reference build is served by tritonserver: drop --serve-mode")
        return reference_runtime()


@dataclass(frozen=True)
class EngineReference(EnsembleRepository, _Reference):
    """runtime engine, target reference: the TensorRT-LLM checkpoint, dequantized, in the ensemble layout."""

    name: str = "engine-reference"
    runtime: str = "engine"
    checkpoint: CheckpointFormat = TRTLLM_CHECKPOINT
    llmapi: bool = False
    no_compile: str = "target reference: no engines"
    no_force_compile: str = "--force compile: target=reference has no compile stage; use --target trtllm"

    def check_note(self, spec: BuildSpec) -> str | None:
        return "spec ok; reference target (PyTorch backend, no engines)"

    def deploys_on(self, platform: str) -> bool:
        return platform == "slurm"  # a demo of the engine-path scripts on CPU nodes


@dataclass(frozen=True)
class PytorchReference(LlmapiRepository, _Reference):
    """runtime pytorch, target reference: the HF checkpoint, dequantized by transformers, in the llmapi layout."""

    name: str = "pytorch-reference"
    runtime: str = "pytorch"
    checkpoint: CheckpointFormat = HF_CHECKPOINT
    llmapi: bool = True
    no_compile: str = _NO_COMPILE
    no_force_compile: str = _NO_FORCE_COMPILE

    def deploys_on(self, platform: str) -> bool:
        return False
