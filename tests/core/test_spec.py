"""The build spec's own fields: the runtime choice and what it changes in the spec key."""

from __future__ import annotations

import hashlib
import json
import re

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


SERVING_TARGET = {"replicas": 3, "ttft_ms": 500, "tpot_ms": 40.0,
                  "traffic": {"input_len": 2048, "output_len": 512, "prefix_share": 0.5, "rate": 20},
                  "estimate": {"ttft_ms": 450.0, "tpot_ms": 30.0, "tokens_per_s": 2600.0,
                               "cost_per_1m_output_tokens_usd": 1.3}}


def _spec_file(tmp_path, target):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "tiny-llama", "serving_target": target}))
    return path


def test_serving_target_loads_and_changes_no_identity(tmp_path):
    spec = resolve_spec(spec_file=_spec_file(tmp_path, SERVING_TARGET))
    t = spec.serving_target
    assert (t.replicas, t.ttft_ms, t.traffic.rate, t.traffic.prefix_share, t.estimate.tokens_per_s) == (
        3, 500.0, 20.0, 0.5, 2600.0)
    plain = resolve_spec(model="tiny-llama")
    assert plain.serving_target is None and "serving_target" not in plain.model_dump()
    for stage in ("calibrate", "compile", "package"):
        assert spec.identity(stage) == plain.identity(stage)


@pytest.mark.parametrize("path, value, needle", [
    (("ttft_ms",), float("nan"), "serving_target.ttft_ms=nan: Input should be a finite number"),
    (("tpot_ms",), float("inf"), "serving_target.tpot_ms=inf: Input should be a finite number"),
    (("tpot_ms",), 0, "serving_target.tpot_ms=0: Input should be greater than 0"),
    (("replicas",), 0, "serving_target.replicas=0: Input should be greater than or equal to 1"),
    (("replicas",), 2.5, "serving_target.replicas=2.5"),
    (("traffic", "rate"), -1, "serving_target.traffic.rate=-1: Input should be greater than 0"),
    (("traffic", "prefix_share"), 1.5, "serving_target.traffic.prefix_share=1.5"),
    (("traffic", "input_len"), None, "serving_target.traffic.input_len: Field required"),
    (("estimate", "cost_per_1m_output_tokens_usd"), float("nan"), "cost_per_1m_output_tokens_usd=nan"),
    (("estimate", "speed"), 1, "serving_target.estimate.speed=1: Extra inputs are not permitted"),
    (("ttft_ms",), 1e300, "serving_target.ttft_ms=1e+300: Input should be less than or equal to 3600000"),
    (("tpot_ms",), True, "serving_target.tpot_ms=True: Input should be a valid number"),
    (("replicas",), 10**6, "serving_target.replicas=1000000: Input should be less than or equal to 10000"),
    (("traffic", "rate"), 1e300, "serving_target.traffic.rate=1e+300: Input should be less than or equal to"),
    (("traffic", "output_len"), 10**7, "serving_target.traffic.output_len=10000000: Input should be less than"),
    (("estimate", "tokens_per_s"), 1e300, "serving_target.estimate.tokens_per_s=1e+300: Input should be less"),
    (("estimate", "ttft_ms"), float("-inf"), "serving_target.estimate.ttft_ms=-inf: Input should be a finite"),
])
def test_bad_serving_target_is_one_line(tmp_path, path, value, needle):
    import copy

    target = copy.deepcopy(SERVING_TARGET)
    where = target
    for key in path[:-1]:
        where = where[key]
    if value is None:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    with pytest.raises(SpecError, match=re.escape(needle)):
        resolve_spec(spec_file=_spec_file(tmp_path, target))


@pytest.mark.parametrize("text, needle", [
    ("limits: {max_batch_size: 100000000}", "limits.max_batch_size=100000000: Input should be less than or equal"),
    ("limits: {max_seq_len: .inf}", "limits.max_seq_len=inf: Input should be a valid integer"),
    ("limits: {max_num_tokens: 1.0e+30}", "limits.max_num_tokens=1e+30: Input should be a valid integer"),
    ("quantization: {calib_seed: -1}", "quantization.calib_seed=-1: Input should be greater than or equal to 0"),
    ("quantization: {max_ppl_delta_pct: .nan}", "quantization.max_ppl_delta_pct=nan: Input should be a finite"),
    ("speculation: {draft_len: 1000}", "speculation.draft_len=1000: Input should be less than or equal to 64"),
    ("speculation: {draft_gpu_device_ids: [-1]}", "speculation.draft_gpu_device_ids.0=-1: Input should be greater"),
    ("serving: {max_tokens_in_paged_kv_cache: " + "9" * 20 + "}", "serving.max_tokens_in_paged_kv_cache=99999"),
    ("hardware: {gpu_price_per_hour: .inf}", "hardware.gpu_price_per_hour=inf: Input should be a finite number"),
    ("parallelism: {tp: " + "9" * 5000 + "}", "is not valid YAML (line 2): integer of more than 100 digits"),
    ("? [a, b]\n: 1", "is not valid YAML (line 2): complex key"),
])
def test_spec_file_numbers_are_finite_and_bounded(tmp_path, text, needle):
    path = tmp_path / "spec.yaml"
    path.write_text("model: tiny-llama\n" + text + "\n")
    with pytest.raises(SpecError, match=re.escape(needle)) as err:
        resolve_spec(spec_file=path)
    assert err.value.exit_code == 2 and "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_flag_value_of_thousands_of_digits_is_one_short_line():
    with pytest.raises(SpecError, match=r"^parallelism\.tp='9{29}\.\.\.\(long\): ") as err:
        resolve_spec(model="tiny-llama", tp="9" * 5000)
    assert len(str(err.value)) < 200


def test_a_resolved_spec_is_frozen_and_its_notes_are_a_separate_record():
    import pydantic

    from pipeline.stages.check import resolve_checked_spec

    spec = resolve_checked_spec(model="llama-70b", precision="fp8", gpu_count=8)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.runtime = "pytorch"
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.notes.placement_reason = "mine"
    assert spec.placement_reason.startswith("tp=") and spec.limit_reasons["max_batch_size"]
    # the notes never name an artifact nor travel with the spec's document
    bare = spec.model_copy(update={"notes": type(spec.notes)()})
    assert bare.identity() == spec.identity()
    assert "notes" not in spec.model_dump() and "warnings" not in spec.model_dump()
    # a changed note is a copy; the spec it came from is untouched
    noted = spec.with_notes(warnings=["w"])
    assert noted.warnings == ["w"] and spec.warnings != ["w"]


def test_a_spec_file_is_read_once_however_many_placements_are_tried(tmp_path, monkeypatch):
    from pipeline.core import spec as spec_module
    from pipeline.stages import check

    path = tmp_path / "s.yaml"
    path.write_text("model: llama-70b\nquantization:\n  precision: fp8\n")
    reads = []
    real = spec_module.load_spec_file
    monkeypatch.setattr(check, "load_spec_file", lambda p: reads.append(p) or real(p))
    spec = check.resolve_checked_spec(spec_file=str(path), gpu_count=8)
    assert spec.placement_reason  # TP was chosen among several candidates, each resolved from the file's data
    assert reads == [str(path)]


def test_the_spec_class_validates_itself_wherever_a_spec_is_validated():
    from pipeline.core.spec import BuildSpec, ParallelSpec

    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="auto")
    assert spec.draft_model.name == "llama-1b" and any("speculation" in w for w in spec.warnings)
    # a document read back (a release's or a deploy source's spec) is checked by the same rules
    document = spec.model_dump(mode="json")
    assert BuildSpec.model_validate(document).identity() == spec.identity()
    document["parallelism"]["tp"] = 3
    with pytest.raises(SpecError, match=r"^parallelism\.tp=3: target llama-70b has 64 attention heads"):
        BuildSpec.model_validate(document)
    # a revision is checked again (its warnings replace the old ones); model_copy is an unchecked what-if
    with pytest.raises(SpecError, match=r"^parallelism\.tp=3"):
        spec.revised(parallelism=ParallelSpec(tp=3))
    assert spec.model_copy(update={"parallelism": ParallelSpec(tp=3)}).parallelism.tp == 3
    plain = spec.revised(draft_model=None, speculation=spec.speculation.model_copy(update={"draft": None}))
    assert plain.draft_model is None and not any("speculation" in w for w in plain.warnings)
    with pytest.raises(SpecError, match=r"^hardware\.gpu="):
        spec.revised(hardware=spec.hardware.model_copy(update={"gpu": "a100"}))
    # fields left unset stay unset (the SLO search reads which ones the user gave)
    assert "runtime" not in spec.revised(draft_model=None).model_fields_set
    assert resolve_spec(model="llama-70b", precision="fp8", tp=3, validate=False).parallelism.tp == 3


def test_a_dumped_spec_reads_back_by_its_given_values_and_the_rules():
    from pipeline.core.spec import spec_from_document

    spec = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    document = spec.model_dump(mode="json")
    assert document["speculation"]["draft_tp"] == 1  # a dump sets every field, engine-only ones too
    assert spec_from_document(document).identity() == spec.identity()
    document["quantization"]["precision"] = "int8_sq"
    with pytest.raises(SpecError, match=r"no PyTorch-backend kernels"):
        spec_from_document(document)
