"""Triton model repository for a build: packaged templates (pipeline/templates/triton), strict rendering,
validation and the package stage. See `pipeline.stages.package.package` for the layout."""

import importlib

from pipeline.stages.package.render import render  # eager: the function, not its submodule, is the package's `render`

_EXPORTS = {"InstallResult": "install", "install_repo": "install", "PackageResult": "package",
            "package_repo": "package", "repo_name": "package", "validate_repo": "repo_check"}
__all__ = ["render", *sorted(_EXPORTS)]


def __getattr__(name: str):
    """The package's names, imported on first use (importing one submodule does not load the others)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
