"""Backends: what one runtime × target does, gathered into one object per `pipeline.core.runtimes` row for the CLI.

    engine  × trtllm     engine-triton       ensemble repository, Triton's `tensorrtllm` / trtllm-serve (tensorrt)
    pytorch × trtllm     pytorch-llmapi      llmapi repository, trtllm-serve (pytorch)
    engine  × reference  engine-reference    ensemble repository, CPU PyTorch behind the Triton contract
    pytorch × reference  pytorch-reference   llmapi repository, CPU transformers behind the Triton contract

The data (compiles, GPU, layout, release roles, ...) is the row's; each behaviour is chosen from the row by the
layer that does it (the package layout in `pipeline.stages.package.repository`, the exporter in
`pipeline.stages.calibrate.formats`, the served runtime in `pipeline.ops.deploy.runtime`). This package sits above
`stages`, `ops` and `serving` and is imported by nothing below it; the deploy runtime loads when asked (the CLI
imports this package at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.core.runtimes import RUNTIMES, RuntimeTarget, runtime_named
from pipeline.core.spec import BuildSpec
from pipeline.planning.placement import Placement
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.repository import package

if TYPE_CHECKING:
    from pipeline.ops.deploy.runtime import Runtime

__all__ = ["BACKENDS", "Backend", "PackageInputs", "backend_for", "backend_named"]


@dataclass(frozen=True)
class Backend:
    """One runtime × target: its row's data, and what it does."""

    row: RuntimeTarget

    def __getattr__(self, name: str) -> Any:
        """The row's data (`compiles`, `stages`, `repo_suffix`, ...)."""
        if name == "row":  # not set yet (copy, pickle): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.row, name)

    def package(self, spec: BuildSpec, inputs: PackageInputs, *, force: bool = False, check_only: bool = False,
                verify: bool = False) -> Any:
        """Render, validate and publish the repository (a `PackageResult`)."""
        return package(spec, inputs, force=force, check_only=check_only, verify=verify)

    def repo_note(self) -> str | None:
        """A word for the package lines (`llmapi`), or None."""
        return self.row.repo_note

    def deploy_runtime(self, spec: BuildSpec, served_name: str, *, placement: Placement, platform: str,
                       serve_mode: str | None = None) -> Runtime:
        """What runs on the deployed nodes (`serve_mode`: triton | trtllm-serve | None for the default)."""
        from pipeline.ops.deploy.runtime import runtime_for

        return runtime_for(spec, served_name, placement=placement, platform=platform, serve_mode=serve_mode)


BACKENDS: dict[tuple[str, str], Backend] = {(r.runtime, r.target): Backend(r) for r in RUNTIMES}


def backend_named(runtime: str, target: str) -> Backend:
    """The backend of a recorded (runtime, target) pair, e.g. a manifest's.

    Raises:
        SpecError: a pair no backend serves.
    """
    return BACKENDS[(runtime_named(runtime, target).runtime, target)]


def backend_for(spec: BuildSpec) -> Backend:
    """The backend that builds and serves `spec`."""
    return backend_named(spec.runtime, spec.target)
