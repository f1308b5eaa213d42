"""The package step of a build: the repository layout its runtime × target row names, rendered from its inputs.

    ensemble  preprocessing, tensorrt_llm, postprocessing, ensemble[, draft, BLS]  (`package.package_repo`)
    llmapi    one `tensorrt_llm` model over the HF checkpoint (`llmapi_package.package_llmapi_repo`)

Each layout loads its renderer when it packages: the CLI imports this module at start-up.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from pipeline.core.errors import SpecError
from pipeline.core.runtimes import RuntimeTarget, runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.stages.package.inputs import PackageInputs


class Layout(Protocol):
    def package(self, spec: BuildSpec, row: RuntimeTarget, inputs: PackageInputs, *, force: bool, check_only: bool,
                verify: bool) -> Any:
        """Render, validate and publish the repository (a `PackageResult`)."""
        ...


class EnsembleLayout:
    """The Triton ensemble repository: engines (or the CPU reference's checkpoint) behind pre/postprocessing."""

    def package(self, spec: BuildSpec, row: RuntimeTarget, inputs: PackageInputs, *, force: bool, check_only: bool,
                verify: bool) -> Any:
        from pipeline.stages.package.package import package_repo

        return package_repo(spec, inputs, target=row.target, force=force, check_only=check_only, verify=verify)


class LlmapiLayout:
    """The `llmapi` repository over the HF checkpoint; the draft runs inside the target's LLM."""

    def package(self, spec: BuildSpec, row: RuntimeTarget, inputs: PackageInputs, *, force: bool, check_only: bool,
                verify: bool) -> Any:
        """Raises:
            SpecError: the spec has a draft but no draft checkpoint is given.
            PackageError: no checkpoint is given (see `package_llmapi_repo`).
        """
        from pipeline.stages.package.llmapi_options import llm_api_options
        from pipeline.stages.package.llmapi_package import package_llmapi_repo

        draft = inputs.draft_checkpoint if spec.draft_model else None
        if spec.draft_model and draft is None:
            what = "the EAGLE-3 head's download" if spec.quantized_draft is None else "--draft-checkpoint-dir"
            raise SpecError(f"the spec has a draft: pass {what} with --checkpoint-dir")
        return package_llmapi_repo(spec, replace(inputs, draft_checkpoint=draft),
                                   options=llm_api_options(spec, draft_dir=draft), target=row.target, force=force,
                                   check_only=check_only, verify=verify)


LAYOUTS: dict[str, Layout] = {"ensemble": EnsembleLayout(), "llmapi": LlmapiLayout()}


def package(spec: BuildSpec, inputs: PackageInputs, *, force: bool = False, check_only: bool = False,
            verify: bool = False) -> Any:
    """Package `spec`'s build into the repository layout of its runtime × target (a `PackageResult`)."""
    row = runtime_of(spec)
    return LAYOUTS[row.layout].package(spec, row, inputs, force=force, check_only=check_only, verify=verify)
