"""mypy over the package with the `[tool.mypy]` configuration of pyproject.toml: the whole package type-checks, and
`core/` and `planning/` are held to mypy's `--strict` flags.

mypy's incremental cache lives in `.mypy_cache/` of the checkout: the first run checks every module (a minute or
two), later runs only what changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
STRICT_MODULES = ["pipeline.core.*", "pipeline.planning.*"]
# `mypy --strict` less its global-only flags (warn_unused_configs, warn_redundant_casts: set globally)
STRICT_FLAGS = {"disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls",
                "disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs",
                "disallow_untyped_decorators", "warn_unused_ignores", "warn_return_any", "no_implicit_reexport",
                "strict_equality", "extra_checks"}


def _mypy_config() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["mypy"]


def _mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


def _strict_options(config: dict) -> dict:
    (override,) = [o for o in config["overrides"] if o["module"] == STRICT_MODULES]
    return {k: v for k, v in override.items() if k != "module"}


def test_the_package_type_checks():
    proc = _mypy("--config-file", str(PYPROJECT), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout


def test_core_and_planning_are_strict_and_no_module_is_left_unchecked():
    config = _mypy_config()
    assert config["packages"] == ["pipeline"]
    assert "ignore_missing_imports" not in config and "ignore_errors" not in config
    assert config["warn_unused_configs"] is True and config["warn_redundant_casts"] is True
    strict = _strict_options(config)
    assert STRICT_FLAGS <= {k for k, v in strict.items() if v is True} | {"check_untyped_defs"}
    assert config["check_untyped_defs"] is True
    for override in config["overrides"]:
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        if override.get("ignore_missing_imports"):
            assert not any(m.startswith("pipeline") for m in modules), modules
        assert not (override.get("ignore_errors") and any(m.startswith("pipeline") for m in modules)), modules


def test_the_strict_options_refuse_an_untyped_function(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("")
    (tmp_path / "probe" / "low.py").write_text("def twice(x):\n    return 2 * x\n\n\n"
                                               "def table() -> dict:\n    return {}\n")
    options = "".join(f"{k} = {str(v).lower()}\n" for k, v in _strict_options(_mypy_config()).items())
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\npackages = probe\n\n[mypy-probe.*]\n{options}")
    proc = _mypy("--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "low.py:1: error: Function is missing a type annotation  [no-untyped-def]" in proc.stdout
    assert 'low.py:5: error: Missing type parameters for generic type "dict"  [type-arg]' in proc.stdout
