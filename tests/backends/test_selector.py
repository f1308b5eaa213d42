"""backends: one behaviour object per runtime × target row, picked by `backend_for`; it reads its row and acts."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from pipeline.backends import BACKENDS, Backend, backend_for, backend_named
from pipeline.core.errors import DeployError, SpecError
from pipeline.core.runtimes import runtime_named
from pipeline.core.spec import Runtime, Target, resolve_spec
from pipeline.planning.placement import place

def _placement(spec):
    return place(spec.parallelism.tp, spec.parallelism.pp, spec.hardware)


PAIRS = list(itertools.product(get_args(Runtime), get_args(Target)))


@pytest.mark.parametrize("runtime, target", PAIRS)
def test_backend_for_picks_the_specs_row(runtime, target):
    spec = resolve_spec(model="tiny-llama", runtime=runtime, target=target, validate=False)
    backend = backend_for(spec)
    assert isinstance(backend, Backend) and backend is backend_named(runtime, target)
    assert backend.row is runtime_named(runtime, target)
    assert (backend.runtime, backend.stages, backend.repo_note()) == (runtime, backend.row.stages,
                                                                      backend.row.repo_note)
    assert sorted(BACKENDS) == sorted(PAIRS)


def test_an_unknown_pair_has_no_backend():
    with pytest.raises(SpecError, match="has no backend"):
        backend_named("engine", "cpu")


@pytest.mark.parametrize("runtime, target, mode, name", [
    ("engine", "trtllm", None, "engine"),
    ("engine", "trtllm", "trtllm-serve", "engine-trtllm-serve"),
    ("pytorch", "trtllm", None, "pytorch"),
    ("engine", "reference", None, "reference"),
])
def test_deploy_runtime_follows_the_serve_mode(runtime, target, mode, name):
    spec = resolve_spec(model="tiny-llama", runtime=runtime, target=target, validate=False)
    rt = backend_for(spec).deploy_runtime(spec, "tiny", placement=_placement(spec), platform="slurm", serve_mode=mode)
    assert rt.name == name


def test_a_refused_serve_mode_says_why():
    spec = resolve_spec(model="tiny-llama", runtime="pytorch", target="trtllm", validate=False)
    with pytest.raises(DeployError, match="deployed with trtllm-serve"):
        backend_for(spec).deploy_runtime(spec, "tiny", placement=_placement(spec), platform="k8s", serve_mode="triton")
