"""The one flag table (pipeline.cli.flags): every task's flags come from it, every row is used, every number is
bounded, and the CLI's functions stay short of long argument lists."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from pipeline.cli.console import TASKS, namespace
from pipeline.cli.flags import OPTIONS, SPEC_FLAGS, TASK_FLAGS, option, parse_flags, parse_value
from pipeline.core.errors import BuildError, DeployError, SpecError

ROOT = Path(__file__).resolve().parents[2]


def test_each_task_takes_exactly_its_table_flags():
    for name, d in TASKS.items():
        task = namespace.tasks[name.replace("_", "-")]
        got = {a.attr_name or a.name for a in task.get_arguments()}
        want = {*TASK_FLAGS[name], *(SPEC_FLAGS if d.spec else ())}
        assert {g.rstrip("_") for g in got} == want, name


def test_every_row_is_used_and_every_number_is_bounded():
    used = {*SPEC_FLAGS} | {f"{task}.{flag}" for task, flags in TASK_FLAGS.items() for flag in flags} | \
        {flag for flags in TASK_FLAGS.values() for flag in flags}
    assert set(OPTIONS) <= used, sorted(set(OPTIONS) - used)
    for key, opt in OPTIONS.items():
        assert opt.help, key
        if opt.kind in (int, float) and opt.field is None:
            assert opt.maximum is not None and math.isfinite(opt.maximum) and opt.minimum <= opt.maximum, key


def test_values_are_typed_defaulted_and_refused_in_one_line():
    f = parse_flags("bench", {"requests": "3", "budget": "2.5", "concurrency": "1,2", "json_": True})
    assert (f["requests"], f["budget"], f["concurrency"], f["json"]) == (3, 2.5, ["1,2"], True)
    assert (f["max_tokens"], f["seed"], f["no_stream"], f["url"]) == (32, 0, False, None)  # bench's own default
    assert parse_flags("smoke", {})["max_tokens"] == 24
    with pytest.raises(SpecError, match=r"^--input-len='x': expected an integer >= 1$"):
        parse_value(option("plan", "input_len"), "input_len", "x")
    with pytest.raises(BuildError, match=r"^--from 'x' is not a stage; stages: check, download"):
        parse_flags("build", {"from_": "x"})
    with pytest.raises(DeployError, match=r"^--mpi 'openmpi': use one of pmix, "):
        parse_flags("deploy", {"mpi": "openmpi"})
    with pytest.raises(TypeError, match="unknown flag"):
        parse_flags("plan", {"no_such_flag": 1})


def test_no_function_takes_more_than_8_parameters_and_no_lazy_modules():
    files = [*(ROOT / "pipeline").rglob("*.py"), ROOT / "tasks.py"]
    for path in files:
        text = path.read_text()
        assert "LazyLoader" not in text and "_lazy(" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                count -= bool(a.args) and a.args[0].arg in ("self", "cls")
                assert count <= 8, (str(path.relative_to(ROOT)), node.name, count)
