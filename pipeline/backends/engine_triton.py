"""Engine + Triton: trtllm-build engines from a TensorRT-LLM checkpoint, served by Triton's C++ `tensorrtllm`
backend (ensemble, BLS draft-target), or by `trtllm-serve --backend tensorrt`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.backends.base import CheckpointFormat, PackageInputs
from pipeline.backends.formats import TRTLLM_CHECKPOINT

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec
    from pipeline.ops.deploy.runtime import Runtime
    from pipeline.planning.placement import Placement


def package_ensemble(backend: Any, spec: BuildSpec, inputs: PackageInputs, *, force: bool, check_only: bool,
                     verify: bool) -> Any:
    """The Triton ensemble repository (preprocessing, tensorrt_llm, postprocessing, ensemble[, draft, BLS])."""
    from pipeline.stages.package.package import package_repo

    return package_repo(
        spec, target=backend.target, output=inputs.output, engine_dir=inputs.engine,
        draft_engine_dir=inputs.draft_engine, checkpoint_dir=inputs.checkpoint,
        draft_checkpoint_dir=inputs.draft_checkpoint, tokenizer_dir=inputs.tokenizer,
        draft_tokenizer_dir=inputs.draft_tokenizer, build_id=inputs.build_id, name=inputs.name,
        spec_key=inputs.spec_key, force=force, check_only=check_only, verify=verify,
    )


class EnsembleRepository:
    """Packaging of the backends served through the Triton ensemble layout."""

    def package(self, spec: BuildSpec, inputs: PackageInputs, *, force: bool = False, check_only: bool = False,
                verify: bool = False) -> Any:
        return package_ensemble(self, spec, inputs, force=force, check_only=check_only, verify=verify)

    def repo_note(self) -> str | None:
        return None


@dataclass(frozen=True)
class EngineTriton(EnsembleRepository):
    """runtime engine, target trtllm."""

    name: str = "engine-triton"
    runtime: str = "engine"
    target: str = "trtllm"
    checkpoint: CheckpointFormat = TRTLLM_CHECKPOINT
    stages: tuple[str, ...] = ("download", "calibrate", "compile", "package")
    compiles: bool = True
    gpu: bool = True
    llmapi: bool = False
    repo_kind: str = "engine"
    repo_suffix: str = ""
    package_from: str = "engine"
    release_roles: tuple[str, str] = ("engine", "draft_engine")
    no_compile: str = ""
    no_force_compile: str = ""

    def check_note(self, spec: BuildSpec) -> str | None:
        return None

    def deploys_on(self, platform: str) -> bool:
        return True

    def deploy_runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str,
                       serve_mode: str | None) -> Runtime:
        from pipeline.ops.deploy.runtime import engine_runtime, engine_serve_runtime, launched_ranks

        if serve_mode == "trtllm-serve":
            return engine_serve_runtime(spec, served_name, launched=launched_ranks(placement, platform))
        return engine_runtime(spec, placement)
