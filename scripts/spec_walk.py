"""Follow a build spec statically through `pipeline/`: from a function that receives it, every call that passes it
on (`f(spec)`, `f(x, spec=spec)`), resolved through the modules' imports, until it reaches a stage (a method of
the `Stage` protocol, `pipeline.stages.stage`).

What it counts, over the walk's stays (functions the spec passes through, each once, in depth-first call order):
climbs (the next stay sits in a higher layer of pyproject's import-linter contract than the one before) and returns
(the next stay is in a file the walk had left before). Calls it cannot resolve are listed, never guessed.

    python scripts/spec_walk.py [module:function [param]]   # default pipeline.cli.commands:build_command spec
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
LAYERS = ("core", "planning", "stages", "ops|serving", "backends", "cli")  # bottom first (pyproject's contract)
STAGE_METHODS = ("identity", "locate", "run", "doing")
STAGE_PROTOCOL = "pipeline.stages.stage"


@dataclass
class Module:
    name: str
    path: Path
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # "f" and "Class.method"
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module:attr"
    instances: dict[str, str] = field(default_factory=dict)  # NAME = Class() at module level -> Class
    classes: set[str] = field(default_factory=set)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in ast.walk(tree):  # module- and function-level imports alike
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}:{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(
                    ".")[0]
    return found


def index() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "templates" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        mod = Module(_module_name(path), path, imports=_imports(tree))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                mod.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                mod.classes.add(node.name)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        mod.functions[f"{node.name}.{item.name}"] = item
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                  and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)):
                mod.instances[node.targets[0].id] = node.value.func.id
        modules[mod.name] = mod
    return modules


def layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    return next((i for i, names in enumerate(LAYERS) if part in names.split("|")), -1)


@dataclass
class Walk:
    stays: list[str] = field(default_factory=list)  # "module:function", in visiting order
    stages: set[str] = field(default_factory=set)  # stage methods reached
    unresolved: list[str] = field(default_factory=list)

    def files(self) -> list[str]:
        return sorted({s.split(":")[0] for s in self.stays})

    def climbs(self) -> int:
        mods = [s.split(":")[0] for s in self.stays]
        return sum(layer(b) > layer(a) for a, b in zip(mods, mods[1:]))

    def returns(self) -> int:
        left: set[str] = set()
        count = 0
        mods = [s.split(":")[0] for s in self.stays]
        for a, b in zip(mods, mods[1:]):
            if a != b:
                left.add(a)
                count += b in left
        return count


class Walker:
    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.walk = Walk()

    def _resolve(self, mod: Module, func: ast.expr) -> tuple[str, str] | None:
        """(module, function key) of a callee expression, or None."""
        if isinstance(func, ast.Name):
            if func.id in mod.functions:
                return mod.name, func.id
            return self._imported(mod.imports.get(func.id))
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in mod.instances:
                return mod.name, f"{mod.instances[owner]}.{func.attr}"
            target = mod.imports.get(owner)
            if target and target.replace(":", ".") in self.modules:  # `from package import module`
                target = target.replace(":", ".")
            if target and ":" not in target and target in self.modules:  # module.function
                return target, func.attr
            if target and ":" in target:  # an imported instance or class: X.method
                where, name = target.split(":")
                if where in self.modules:
                    home = self.modules[where]
                    cls = home.instances.get(name, name)
                    if f"{cls}.{func.attr}" in home.functions:
                        return where, f"{cls}.{func.attr}"
        return None

    def _imported(self, target: str | None) -> tuple[str, str] | None:
        if not target or ":" not in target:
            return None
        where, name = target.split(":")
        home = self.modules.get(where)
        if home is None:
            return None
        if name in home.functions:
            return where, name
        return self._imported(home.imports.get(name))  # re-exported

    def _constructs(self, mod: Module, func: ast.expr) -> bool:
        if not isinstance(func, ast.Name):
            return False
        if func.id in mod.classes:
            return True
        target = mod.imports.get(func.id, "")
        where, _, name = target.partition(":")
        return where in self.modules and name in self.modules[where].classes

    def _is_stage(self, module: str, key: str) -> bool:
        cls, _, method = key.rpartition(".")
        if not cls or method not in STAGE_METHODS:
            return False
        return module == STAGE_PROTOCOL or "Stage" in cls

    def visit(self, module: str, key: str, param: str) -> None:
        where = f"{module}:{key}"
        if where in self.walk.stays:
            return
        self.walk.stays.append(where)
        mod = self.modules[module]
        calls = sorted((n for n in ast.walk(mod.functions[key]) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset))
        for node in calls:
            positions = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id == param]
            keywords = [k.arg for k in node.keywords if isinstance(k.value, ast.Name) and k.value.id == param]
            if not positions and not keywords:
                continue
            callee = self._resolve(mod, node.func)
            if callee is None and self._constructs(mod, node.func):
                continue  # a value object built from the spec (a report, a plan): no code path to follow
            if callee is None:
                if isinstance(node.func, ast.Attribute) and node.func.attr in STAGE_METHODS:
                    self.walk.stages.add(f"Stage.{node.func.attr}")  # a Stage object's method (the protocol)
                else:
                    self.walk.unresolved.append(f"{where}: {ast.unparse(node.func)}")
                continue
            if self._is_stage(*callee):
                self.walk.stages.add(f"{callee[0]}:{callee[1]}")
                continue
            target = self.modules[callee[0]].functions[callee[1]]
            names = [a.arg for a in (*target.args.posonlyargs, *target.args.args) if a.arg not in ("self", "cls")]
            name = next((names[i] for i in positions if i < len(names)), None) or next(
                (k for k in keywords if k), None)
            if name is not None:
                self.visit(*callee, name)


def walk_from(start: str = "pipeline.cli.commands:build_command", param: str = "spec") -> Walk:
    module, key = start.split(":")
    walker = Walker(index())
    walker.visit(module, key, param)
    return walker.walk


def main(argv: list[str]) -> int:
    w = walk_from(*argv)
    for stay in w.stays:
        print(f"  {stay}")
    print(f"stays {len(w.stays)} in {len(w.files())} files; climbs back up {w.climbs()}; returns to a file left "
          f"{w.returns()}; stages reached: {', '.join(sorted(w.stages)) or 'none'}")
    for call in w.unresolved:
        print(f"unresolved: {call}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
