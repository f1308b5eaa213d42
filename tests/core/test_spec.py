"""The build spec's own fields: the runtime choice and what it changes in the spec key."""

from __future__ import annotations

import hashlib
import json

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec


def test_runtime_defaults_to_engine_and_leaves_the_spec_key_unchanged():
    spec = resolve_spec(model="tiny-llama", target="reference")
    assert spec.runtime == "engine"
    data = spec.model_dump(mode="json")
    data.pop("runtime")
    assert spec.fingerprint() == hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def test_pytorch_runtime_changes_the_spec_key():
    engine = resolve_spec(model="tiny-llama", target="reference")
    pytorch = resolve_spec(model="tiny-llama", target="reference", runtime="pytorch")
    assert pytorch.runtime == "pytorch"
    assert pytorch.fingerprint() != engine.fingerprint()
    assert "runtime=pytorch" in pytorch.summary()


def test_runtime_from_spec_file(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("model: tiny-llama\nruntime: pytorch\ntarget: reference\n")
    assert resolve_spec(spec_file=f).runtime == "pytorch"


def test_unknown_runtime_rejected():
    with pytest.raises(SpecError, match=r"runtime='onnx'"):
        resolve_spec(model="tiny-llama", runtime="onnx")


def test_runtime_in_spec_file_must_be_a_string(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("model: tiny-llama\nruntime: 1\n")
    with pytest.raises(SpecError, match=r"runtime=1: expected a string"):
        resolve_spec(spec_file=f)
