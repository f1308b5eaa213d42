"""The package's layers, as import-linter enforces them, and no import cycle (every import kind counts).

The contract is the `[tool.importlinter]` table of pyproject.toml: cli > backends > ops | serving > stages >
planning > core. An import inside a function or under TYPE_CHECKING counts like one at the top of a module.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def _contract() -> dict:
    (contract,) = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    return contract


def test_the_package_keeps_its_layers(capsys):
    code = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_the_contract_names_every_layer_without_exceptions():
    contract = _contract()
    assert contract["type"] == "layers" and contract["containers"] == ["pipeline"]
    assert contract["layers"] == ["cli", "backends", "ops | serving", "stages", "planning", "core"]
    assert contract.get("exhaustive") is True and "ignore_imports" not in contract


def _planted(tmp_path: Path, importer: str, imported: str) -> Path:
    """A copy of the contract over a synthetic package `layered` whose `importer` module imports `imported`."""
    root = tmp_path / "layered"
    for layer in ("cli", "backends", "ops", "serving", "stages", "planning", "core"):
        (root / layer).mkdir(parents=True)
        (root / layer / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "core" / "x.py").write_text("")
    (root / importer.replace(".", "/")).with_suffix(".py").write_text(f"def f():\n    import layered.{imported}\n")
    contract = _contract()
    layers = ", ".join(f'"{layer}"' for layer in contract["layers"])
    config = tmp_path / "contract.toml"
    config.write_text(f'[tool.importlinter]\nroot_package = "layered"\n\n[[tool.importlinter.contracts]]\n'
                      f'name = "{contract["name"]}"\ntype = "layers"\ncontainers = ["layered"]\nlayers = [{layers}]\n'
                      f'exhaustive = true\n')
    return config


@pytest.mark.parametrize("importer, imported, ok", [
    ("core.low", "stages", False),  # up, inside a function
    ("ops.deploy", "serving", False),  # between the independent siblings
    ("stages.step", "backends", False),
    ("backends.pick", "stages", True),  # down
    ("cli.task", "core.x", True),
])
def test_an_upward_import_breaks_the_contract(tmp_path, monkeypatch, capsys, importer, imported, ok):
    config = _planted(tmp_path, importer, imported)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "layered", raising=False)
    monkeypatch.chdir(tmp_path)
    code = lint_imports(config_filename=str(config), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert (code == 0) is ok, out
    if not ok:
        assert f"layered.{importer} -> layered.{imported}" in out


def import_cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module in `package`'s import graph (Tarjan)."""
    graph = grimp.build_graph(package, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_package_has_no_import_cycle():
    assert import_cycles("pipeline") == []


def test_a_cycle_is_found(tmp_path, monkeypatch):
    (tmp_path / "circular").mkdir()
    (tmp_path / "circular" / "__init__.py").write_text("")
    (tmp_path / "circular" / "a.py").write_text("from circular import b\n")
    (tmp_path / "circular" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                 "    from circular import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "circular", raising=False)
    assert import_cycles("circular") == [["circular.a", "circular.b"]]


def _spec_walk():
    import importlib.util

    loaded = importlib.util.spec_from_file_location("spec_walk", ROOT / "scripts" / "spec_walk.py")
    module = importlib.util.module_from_spec(loaded)
    sys.modules["spec_walk"] = module  # its dataclasses look their module up
    loaded.loader.exec_module(module)
    return module


def test_builds_spec_reaches_the_stages_from_the_cli_in_few_stays_and_climbs():
    walk = _spec_walk().walk_from("pipeline.cli.commands:build_command", "spec")
    assert walk.stays[0] == "pipeline.cli.commands:build_command" and "pipeline.stages.build:build" in walk.stays
    assert {"Stage.run", "Stage.locate"} <= walk.stages, walk.stages
    assert walk.unresolved == []
    assert len(walk.stays) <= 20 and walk.climbs() <= 3, (len(walk.stays), walk.climbs(), walk.stays)


def test_the_walk_counts_climbs_and_returns():
    walk = _spec_walk().Walk(stays=["pipeline.cli.a:f", "pipeline.core.b:g", "pipeline.stages.c:h",
                                    "pipeline.core.b:k", "pipeline.cli.a:m"])
    assert (walk.climbs(), walk.returns(), walk.files()) == (2, 2, ["pipeline.cli.a", "pipeline.core.b",
                                                                    "pipeline.stages.c"])
