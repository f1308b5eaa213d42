"""PyTorch + LLM API: a ModelOpt-quantized unified Hugging Face checkpoint, no engines; served by Triton's `llmapi`
model (TensorRT-LLM's LLM in the Python backend) or by `trtllm-serve --backend pytorch`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.backends.base import CheckpointFormat, PackageInputs
from pipeline.backends.formats import HF_CHECKPOINT
from pipeline.core.errors import DeployError, SpecError

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec
    from pipeline.ops.deploy.runtime import Runtime
    from pipeline.planning.placement import Placement


def package_llmapi(backend: Any, spec: BuildSpec, inputs: PackageInputs, *, force: bool, check_only: bool,
                   verify: bool) -> Any:
    """The `llmapi` repository over the HF checkpoint; the draft runs inside the target's LLM.

    Raises:
        SpecError: the spec has a draft but no draft checkpoint is given.
    """
    from pipeline.stages.package.llmapi_options import llm_api_options
    from pipeline.stages.package.llmapi_package import package_llmapi_repo

    draft = inputs.draft_checkpoint if spec.draft_model else None
    if spec.draft_model and draft is None:
        raise SpecError("the spec has a draft: pass --draft-checkpoint-dir with --checkpoint-dir")
    return package_llmapi_repo(
        spec, target=backend.target, checkpoint_dir=inputs.checkpoint, draft_dir=draft,
        options=llm_api_options(spec, draft_dir=draft), out_dir=inputs.output, build_id=inputs.build_id,
        name=inputs.name, spec_key=inputs.spec_key, force=force, check_only=check_only, verify=verify,
    )


_NO_COMPILE = "no-op, nothing to compile: runtime pytorch loads the Hugging Face checkpoint at serve time"
_NO_FORCE_COMPILE = "--force compile: runtime pytorch has nothing to compile; use --force calibrate or package"


class LlmapiRepository:
    """Packaging of the backends served through the `llmapi` layout (HF checkpoint, no engines)."""

    def check_note(self, spec: BuildSpec) -> str | None:
        return f"spec ok; runtime pytorch, target {self.target} (Hugging Face checkpoint, no engines)"

    def package(self, spec: BuildSpec, inputs: PackageInputs, *, force: bool = False, check_only: bool = False,
                verify: bool = False) -> Any:
        return package_llmapi(self, spec, inputs, force=force, check_only=check_only, verify=verify)

    def repo_note(self) -> str | None:
        return "llmapi"


@dataclass(frozen=True)
class PytorchLlmapi(LlmapiRepository):
    """runtime pytorch, target trtllm."""

    name: str = "pytorch-llmapi"
    runtime: str = "pytorch"
    target: str = "trtllm"
    checkpoint: CheckpointFormat = HF_CHECKPOINT
    stages: tuple[str, ...] = ("download", "calibrate", "package")
    compiles: bool = False
    gpu: bool = True
    llmapi: bool = True
    repo_kind: str = "llmapi"
    repo_suffix: str = ""
    package_from: str = "checkpoint"
    release_roles: tuple[str, str] = ("checkpoint", "draft_checkpoint")
    no_compile: str = _NO_COMPILE
    no_force_compile: str = _NO_FORCE_COMPILE

    def deploys_on(self, platform: str) -> bool:
        return True

    def deploy_runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str,
                       serve_mode: str | None) -> Runtime:
        from pipeline.ops.deploy.runtime import launched_ranks, pytorch_runtime

        if serve_mode == "triton":
            raise DeployError("--serve-mode triton: a runtime-pytorch release is deployed with trtllm-serve; drop "
                              "--serve-mode (or pass --serve-mode trtllm-serve)")
        return pytorch_runtime(spec, served_name, launched=launched_ranks(placement, platform))
