"""Triton model repository for a build: packaged templates (pipeline/templates/triton), strict rendering,
validation and the package stage. See `pipeline.triton.package` for the layout."""

from .package import PackageResult, package_repo, repo_name, rewrite_engine_paths
from .render import render
from .validate import validate_repo

__all__ = ["PackageResult", "package_repo", "render", "repo_name", "rewrite_engine_paths", "validate_repo"]
