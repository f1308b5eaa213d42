"""runtimes: one data row per (runtime, target), picked by `runtime_of`; what each one says about its build."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from pipeline.core.errors import DeployError, SpecError
from pipeline.core.runtimes import RUNTIMES, CheckpointFormat, RuntimeTarget, checkpoint_format, runtime_named, runtime_of
from pipeline.core.spec import Runtime, Target, resolve_spec

PAIRS = list(itertools.product(get_args(Runtime), get_args(Target)))


def test_every_spec_pair_has_exactly_one_row():
    assert sorted((r.runtime, r.target) for r in RUNTIMES) == sorted(PAIRS)
    assert len({r.name for r in RUNTIMES}) == len(PAIRS)


@pytest.mark.parametrize("runtime, target", PAIRS)
def test_runtime_of_picks_the_specs_pair(runtime, target):
    spec = resolve_spec(model="tiny-llama", runtime=runtime, target=target, validate=False)
    backend = runtime_of(spec)
    assert isinstance(backend, RuntimeTarget) and isinstance(backend.checkpoint, CheckpointFormat)
    assert (backend.runtime, backend.target) == (runtime, target)
    assert backend is runtime_named(runtime, target)
    assert backend.checkpoint is checkpoint_format(runtime)


@pytest.mark.parametrize("runtime, target, name, compiles, gpu, llmapi, repo_kind, suffix, ckpt_dir", [
    ("engine", "trtllm", "engine-triton", True, True, False, "engine", "", "checkpoint"),
    ("pytorch", "trtllm", "pytorch-llmapi", False, True, True, "llmapi", "", "hf_checkpoint"),
    ("engine", "reference", "engine-reference", False, False, False, "reference", "-reference", "checkpoint"),
    ("pytorch", "reference", "pytorch-reference", False, False, True, "reference", "-reference", "hf_checkpoint"),
])
def test_row_traits(runtime, target, name, compiles, gpu, llmapi, repo_kind, suffix, ckpt_dir):
    b = runtime_named(runtime, target)
    assert (b.name, b.compiles, b.gpu, b.llmapi, b.repo_kind, b.repo_suffix) == (
        name, compiles, gpu, llmapi, repo_kind, suffix)
    assert b.checkpoint.dirname == ckpt_dir
    assert ("compile" in b.stages) is compiles and b.stages[-1] == "package"
    assert b.package_from == ("engine" if compiles else "checkpoint")
    assert b.release_roles == ((("engine", "draft_engine")) if compiles else ("checkpoint", "draft_checkpoint"))
    assert bool(b.no_compile) is not compiles and bool(b.no_force_compile) is not compiles
    assert b.deploys_on("k8s") is gpu


def test_checkpoint_formats_place_the_tokenizer(tmp_path):
    assert checkpoint_format("engine").tokenizer_dir(tmp_path) == tmp_path / "tokenizer"
    assert checkpoint_format("pytorch").tokenizer_dir(tmp_path) == tmp_path
    assert checkpoint_format("engine").key_factors == {}  # engine-path keys and build ids stay as they were
    assert checkpoint_format("pytorch").key_factors == {"runtime": "pytorch"}


@pytest.mark.parametrize("runtime, target", [("engine", "cpu"), ("tensorrt", "trtllm"), ("", "")])
def test_unknown_pair_is_refused_naming_the_choices(runtime, target):
    with pytest.raises(SpecError, match="runtime engine\\|pytorch and target trtllm\\|reference") as exc:
        runtime_named(runtime, target)
    assert exc.value.exit_code == 2


def test_unknown_runtime_has_no_checkpoint_format():
    with pytest.raises(SpecError, match="'tensorrt' is not one of engine, pytorch"):
        checkpoint_format("tensorrt")


@pytest.mark.parametrize("runtime, target, default, refused", [
    ("engine", "trtllm", "triton", None),
    ("pytorch", "trtllm", "trtllm-serve-pytorch", "triton"),
    ("engine", "reference", "triton-reference", "trtllm-serve"),
    ("pytorch", "reference", "triton-reference", "trtllm-serve"),
])
def test_serve_modes_name_a_served_runtime_or_refuse(runtime, target, default, refused):
    row = runtime_named(runtime, target)
    assert row.served_as(None) == default
    if refused is not None:
        with pytest.raises(DeployError, match=f"--serve-mode {refused}"):
            row.served_as(refused)


@pytest.mark.parametrize("runtime, target", PAIRS)
def test_layout_and_notes_follow_the_row(runtime, target):
    row = runtime_named(runtime, target)
    assert row.layout == ("llmapi" if row.llmapi else "ensemble")
    assert row.repo_note == ("llmapi" if row.llmapi else None)
    assert (row.check_note is None) is row.compiles


@pytest.mark.parametrize("runtime, target", PAIRS)
def test_a_cpu_reference_holds_no_gpus(runtime, target):
    row = runtime_named(runtime, target)
    assert row.gpus(4) == (4 if row.gpu else 0)
