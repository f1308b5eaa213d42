"""Triton model repository for a build: packaged templates (pipeline/templates/triton), strict rendering,
validation and the package stage. See `pipeline.stages.package.package` for the layout."""

from pipeline.stages.package.install import InstallResult, install_repo
from pipeline.stages.package.package import PackageResult, package_repo, repo_name
from pipeline.stages.package.render import render
from pipeline.stages.package.repo_check import validate_repo

__all__ = ["InstallResult", "PackageResult", "install_repo", "package_repo", "render", "repo_name", "validate_repo"]
