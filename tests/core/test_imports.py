"""The package layering: core <- planning <- stages <- serving <- ops <- cli, no import circle, a light spec."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
LAYERS = ["core", "planning", "stages", "serving", "ops", "cli"]  # a package imports only those before it
# `backends` is the seam every layer asks (`backend_for(spec)`): at import time it needs only `core`; its methods
# reach stage and serving code when called.
SEAM = "backends"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PIPELINE.rglob("*.py"):
        if "templates" in p.relative_to(PIPELINE).parts:
            continue  # model code for tritonserver, not part of the package's import graph
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(path: Path, *, module_level: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = []
    for node in tree.body if module_level else [tree]:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        nodes.extend(ast.walk(node))
    found = set()
    for n in nodes:
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("pipeline"):
            found |= {f"{n.module}.{a.name}" for a in n.names} | {n.module}
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names if a.name.startswith("pipeline")}
    return found


def test_packages_import_only_lower_layers():
    wrong = []
    for name, path in _modules().items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in LAYERS:
            continue
        mine = LAYERS.index(parts[1])
        for imp in _imports(path, module_level=False):
            other = imp.split(".")[1] if imp.count(".") else None
            if other in LAYERS and LAYERS.index(other) > mine:
                wrong.append(f"{name} imports {imp}")
    assert not wrong, wrong


def test_the_backend_seam_needs_only_core_at_import_time():
    wrong = [f"{name} imports {imp}" for name, path in _modules().items() if name.split(".")[1:2] == [SEAM]
             for imp in _imports(path, module_level=True) if imp.split(".")[1] not in ("core", SEAM)]
    assert not wrong, wrong


def test_no_import_circle_between_modules():
    mods = _modules()
    # a submodule naming its own package (`from pipeline.x import y` inside pipeline.x) is no circle: Python runs
    # the package's __init__ first
    graph = {m: {i for i in _imports(p, module_level=True) if i in mods and not (m == i or m.startswith(i + "."))}
             for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, "import circle: " + " -> ".join([*trail, m, n])
            if n not in state:
                visit(n, [*trail, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_importing_the_spec_loads_no_planner_torch_or_tiny_model():
    code = ("import json, sys; import pipeline.core.spec; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('pipeline', 'torch', 'transformers')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
    assert all(m == "pipeline" or m.startswith(("pipeline.core", "pipeline.backends")) for m in loaded), loaded


def test_the_task_collection_loads_only_what_every_task_needs():
    """`trtllm-pipeline TASK` imports the collection first: each task's own modules (serving, deploy, release,
    calibrate, compile, package, the download stage) load when that task runs, not at every start-up."""
    # a module behind importlib's LazyLoader sits in sys.modules as a `_LazyModule` until it is first used
    code = ("import json, sys; import pipeline.cli.console; "
            "print(json.dumps(sorted(m for m, mod in list(sys.modules.items()) if type(mod).__name__ != '_LazyModule' "
            "and m.startswith(('pipeline', 'torch', 'transformers', 'huggingface_hub', 'tritonclient')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
    packages = {"pipeline.serving", "pipeline.serving.llmapi", "pipeline.ops", "pipeline.ops.deploy",
                "pipeline.stages.compile", "pipeline.stages.package", "pipeline.stages.download"}
    task_only = ("pipeline.serving.", "pipeline.ops.", "pipeline.stages.build", "pipeline.stages.calibrate.stage",
                 "pipeline.stages.compile.", "pipeline.stages.package.install", "pipeline.stages.package.package",
                 "pipeline.stages.download.stage", "torch", "transformers", "huggingface_hub", "tritonclient")
    eager = [m for m in loaded if m not in packages and m.startswith(task_only)]
    assert not eager, eager
