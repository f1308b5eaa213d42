"""Triton model repository for a build: packaged templates (pipeline/templates/triton), strict rendering,
validation and the package stage. See `pipeline.triton.package` for the layout."""

from .install import InstallResult, install_repo
from .package import PackageResult, package_repo, repo_name
from .render import render
from .repo_check import validate_repo

__all__ = ["InstallResult", "PackageResult", "install_repo", "package_repo", "render", "repo_name", "validate_repo"]
