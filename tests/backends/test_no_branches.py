"""The rule of the runtime × target rows: no `runtime`/`target` string comparisons outside `pipeline.core.runtimes`.

Runs the check of issue 23 (`git grep -nE PATTERN pipeline/`) and fails on every site outside
pipeline/core/runtimes.py; outside a git checkout the same pattern is matched over the same files in Python.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATTERN = r"runtime ==|target ==|\.runtime ==|\.target ==|runtime !=|target !="
SELECTOR = "pipeline/core/runtimes.py"


def _git_grep() -> list[str] | None:
    """`git grep -nE PATTERN pipeline/` lines, or None outside a git checkout."""
    if shutil.which("git") is None:
        return None
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True)
    if inside.returncode != 0:
        return None
    found = subprocess.run(["git", "grep", "-nE", PATTERN, "--", "pipeline/"], cwd=ROOT, capture_output=True,
                           text=True)
    assert found.returncode in (0, 1), found.stderr  # 1: no match
    return found.stdout.splitlines()


def _scan(root: Path) -> list[str]:
    """The same search over the files under root/pipeline (what git grep reads in a checkout)."""
    rx = re.compile(PATTERN)
    hits = []
    for path in sorted((root / "pipeline").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(root).as_posix()
        hits += [f"{rel}:{n}:{line}" for n, line in enumerate(lines, 1) if rx.search(line)]
    return hits


def _outside_selector(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith(SELECTOR + ":")]


def test_no_runtime_or_target_comparison_outside_the_selector():
    lines = _git_grep()
    if lines is None:
        lines = _scan(ROOT)
    offending = _outside_selector(lines)
    assert not offending, "ask the `pipeline.core.runtimes` row (or `pipeline.backends`) instead of comparing strings:\n" + "\n".join(
        offending)


def test_the_rule_catches_a_comparison(tmp_path):
    (tmp_path / "pipeline" / "core").mkdir(parents=True)
    (tmp_path / "pipeline" / "serving").mkdir()
    (tmp_path / "pipeline" / "serving" / "serve.py").write_text('if spec.runtime == "pytorch":\n    pass\n')
    (tmp_path / "pipeline" / "core" / "runtimes.py").write_text('ok = target == "trtllm"\n')
    hits = _scan(tmp_path)
    assert len(hits) == 2
    assert _outside_selector(hits) == ['pipeline/serving/serve.py:1:if spec.runtime == "pytorch":']
