"""Triton model repository for a build: packaged templates (pipeline/templates/triton), strict rendering,
validation and the package stage (`repository`: the layout a runtime × target row names), and how a build is
launched (`launch_plan` for tritonserver, `serve_plan` for trtllm-serve; `serve` and `deploy` share them). See
`pipeline.stages.package.package` for the ensemble layout."""

import importlib

from pipeline.stages.package.render import render  # eager: the function, not its submodule, is the package's `render`

_EXPORTS = {"InstallResult": "install", "install_repo": "install", "PackageInputs": "inputs",
            "PackageResult": "package", "package_repo": "package", "repo_name": "package", "validate_repo": "repo_check"}
__all__ = ["render", *sorted(_EXPORTS)]


def __getattr__(name: str):
    """The package's names, imported on first use (importing one submodule does not load the others)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
