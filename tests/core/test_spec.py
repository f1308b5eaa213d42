"""The build spec's own fields: the runtime choice and what it changes in the spec key."""

from __future__ import annotations

import hashlib
import json

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec


def test_runtime_defaults_to_engine_and_the_spec_key_hashes_exactly_the_package_factors():
    spec = resolve_spec(model="tiny-llama", target="reference")
    assert spec.runtime == "engine"
    data = spec.hash_factors("package")
    assert data["runtime"] == "engine" and data["target"] == "reference" and "models_file" not in data
    assert spec.identity() == hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def test_pytorch_runtime_changes_the_spec_key():
    engine = resolve_spec(model="tiny-llama", target="reference")
    pytorch = resolve_spec(model="tiny-llama", target="reference", runtime="pytorch")
    assert pytorch.runtime == "pytorch"
    assert pytorch.identity() != engine.identity()
    assert "runtime=pytorch" in pytorch.summary()


@pytest.mark.parametrize("where", [dict(gpu_price_per_hour=9.0), dict(nodes=2), dict(gpu_count=4),
                                   dict(gpus_per_node=4), dict(kv_cache_free_gpu_mem_fraction=0.5),
                                   dict(max_tokens_in_paged_kv_cache=4096), dict(calib_data=__file__),
                                   dict(max_ppl_delta_pct=50.0), dict(quality_gate=False)])
def test_what_never_changes_an_artifact_changes_no_spec_identity(where):
    base = resolve_spec(model="tiny-llama", precision="fp8", tp=2)
    other = resolve_spec(model="tiny-llama", precision="fp8", tp=2, **where)
    for stage in ("calibrate", "compile", "package"):
        assert other.identity(stage) == base.identity(stage), (stage, where)


@pytest.mark.parametrize("what, changes", [
    (dict(calib_size=17), {"calibrate", "compile", "package"}),
    (dict(tp=1), {"calibrate", "compile", "package"}),
    (dict(gpu="h200"), {"compile", "package"}),
    (dict(max_batch_size=16), {"compile", "package"}),
    (dict(decoupled=False), {"package"}),
    (dict(target="reference"), {"package"}),
])
def test_each_stage_identity_changes_with_exactly_its_factors(what, changes):
    base = resolve_spec(model="tiny-llama", precision="fp8", tp=2)
    other = resolve_spec(**{"model": "tiny-llama", "precision": "fp8", "tp": 2, **what})
    changed = {s for s in ("calibrate", "compile", "package") if other.identity(s) != base.identity(s)}
    assert changed == changes, what


def test_every_section_states_what_it_ignores_and_why():
    from pipeline.core.spec import SECTIONS

    for name, cls in SECTIONS.items():
        assert set(cls.IGNORED) <= set(cls.model_fields), name
        assert all(why.strip() for why in cls.IGNORED.values()), name
    with pytest.raises(SpecError, match="no stage 'serve' has spec hash factors"):
        resolve_spec(model="tiny-llama").identity("serve")


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
