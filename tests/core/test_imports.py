"""What loads at import time: a light spec, a light task collection (the layers and cycles: tests/test_layers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
