"""The scripts under benchmarks/ call the pipeline with arguments its functions still accept.

A benchmark runs for minutes on a tiny model, so none runs here; instead every call to a name imported from
`pipeline` (in the script or in Python source it holds in a string, e.g. a child process's code) is bound against
that function's signature.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _trees(path: Path) -> list[ast.Module]:
    """The script's syntax tree, plus those of string constants that are Python importing from `pipeline`."""
    tree = ast.parse(path.read_text())
    out = [tree]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "from pipeline" in node.value:
            try:
                out.append(ast.parse(node.value))
            except SyntaxError:
                continue  # prose that mentions an import
    return out


def _pipeline_calls(tree: ast.Module) -> list[tuple[str, str, ast.Call]]:
    """(module, attribute, call) for each call of a name bound by `from pipeline... import name`."""
    names = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pipeline"
        for alias in node.names
    }
    return [
        (*names[node.func.id], node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    ]


def _bind_error(module: str, attr: str, call: ast.Call) -> str | None:
    """Why `call` does not bind to `module.attr`'s signature; None when it does or cannot be checked statically."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None  # *args / **kwargs
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        return None
    try:
        inspect.signature(fn).bind(*[object()] * len(call.args), **{k.arg: object() for k in call.keywords})
    except TypeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_calls_bind_to_pipeline_signatures(script: Path) -> None:
    problems = [
        f"{script.name}:{call.lineno}: {module}.{attr}(...): {err}"
        for tree in _trees(script)
        for module, attr, call in _pipeline_calls(tree)
        if (err := _bind_error(module, attr, call))
    ]
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_stale_keyword() -> None:
    tree = ast.parse("from pipeline.stages.calibrate.stage import run_calibrate\nrun_calibrate(1, source_dir=2)\n")
    ((module, attr, call),) = _pipeline_calls(tree)
    assert "source_dir" in (_bind_error(module, attr, call) or "")
