"""The typed records inside stage manifests: exact fields, the JSON they write, and what they refuse."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pipeline.core.artifacts import write_manifest
from pipeline.core.manifests import (
    CheckpointManifest,
    HfCheckpointRecord,
    RoundtripCheck,
    RoundtripSkipped,
    TrtllmCheckpointRecord,
)
from pipeline.core.upstream import OUTSIDE, Upstream

ENGINE_EXPORT = {"quantization": {"quant_algo": "FP8"}, "mapping": {"world_size": 1}, "dtype": "bfloat16",
                 "tokenizer_files": ["tokenizer.json"]}
HF_EXPORT = {"format": "hf", "hf_quant_config": {"quant_algo": "FP8"}, "dtype": "bfloat16",
             "tokenizer_files": ["tokenizer.json"]}
MEASURED = {"max_rel_logit_err": 1e-3, "top1_agreement": 1.0, "ppl_rel_diff_pct": 0.01, "tokens": 64, "passed": True,
            "tolerance": {"max_rel_logit_err": 1e-2, "min_top1": 0.98, "max_ppl_rel_diff_pct": 0.1}}


def _checkpoint_manifest(**over) -> dict:
    return {
        "key": "k" * 64, "files": {}, "build_id": "tiny-llama-fp8-0123456789ab", "role": "target",
        "factors": {"stage": "calibrate"},
        "model": {"name": "tiny-llama", "repo_id": "local/tiny-llama", "sha": "s", "revision": "main",
                  "source_dir": "/m"},
        "tokenizer": {"file": "tokenizer.json", "sha256": "t"},
        "recipe": {"precision": "fp8", "kv_cache": "fp8", "modelopt_config": "FP8_DEFAULT_CFG+FP8_KV_CFG",
                   "quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "export_dtype": "bfloat16",
                   "awq_block_size": None},
        "calibration": {"source": "bundled", "fingerprint": "f" * 64, "samples": 2, "requested_samples": 2,
                        "seq_len": 64, "tokens": 128, "batch_size": 1, "seed": 0},
        "parallelism": {"tp": 1, "pp": 1, "world_size": 1},
        "checkpoint": ENGINE_EXPORT,
        "quality": {"ppl_base": 10.0, "ppl_quant": 10.1, "ppl_delta_pct": 1.0, "kl_mean": 0.01,
                    "top1_agreement": 0.95, "tokens": 100, "threshold_pct": 5.0, "passed": True, "enforced": True,
                    "heldout_fingerprint": "h" * 64},
        "roundtrip": MEASURED,
        "toolchain": {"python": "3.11"}, "device": {"type": "cpu", "name": "x86_64", "count": 2},
        "timings": {"total_s": 1.0}, "peak_memory": {"host_max_rss_bytes": 1}, "argv": ["invoke"],
    } | over


def test_checkpoint_manifest_reads_each_record_by_shape_and_writes_the_same_json(tmp_path):
    raw = _checkpoint_manifest()
    m = CheckpointManifest.model_validate(raw)
    assert isinstance(m.checkpoint, TrtllmCheckpointRecord) and isinstance(m.roundtrip, RoundtripCheck)
    assert m.quality.ppl_delta_pct == 1.0 and m.recipe.quant_algo == "FP8" and m.calibration.samples == 2
    write_manifest(tmp_path, m.model_dump(mode="json"))
    assert json.loads((tmp_path / "manifest.json").read_text()) == raw | {"stage": "calibrate"}
    assert CheckpointManifest.read(tmp_path) == m

    hf = CheckpointManifest.model_validate(_checkpoint_manifest(
        checkpoint=HF_EXPORT, roundtrip={"passed": None, "skipped": "9.0 B parameters"}))
    assert isinstance(hf.checkpoint, HfCheckpointRecord) and hf.checkpoint.format == "hf"
    assert isinstance(hf.roundtrip, RoundtripSkipped) and hf.roundtrip.passed is None
    assert hf.model_dump(mode="json")["roundtrip"] == {"passed": None, "skipped": "9.0 B parameters"}


@pytest.mark.parametrize("field, value", [
    ("quality", {"ppl_base": 1.0}),  # fields missing
    ("recipe", {**_checkpoint_manifest()["recipe"], "extra": 1}),  # an unknown field
    ("checkpoint", {**ENGINE_EXPORT, "format": "hf"}),  # neither export shape
    ("roundtrip", {**MEASURED, "skipped": "both"}),
])
def test_checkpoint_manifest_refuses_records_of_another_shape(field, value):
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(_checkpoint_manifest(**{field: value}))


def test_records_are_frozen():
    m = CheckpointManifest.model_validate(_checkpoint_manifest())
    with pytest.raises(ValidationError):
        m.quality.passed = False


def test_input_record_names_key_source_only_for_an_outside_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    rec = Upstream.of_dir(outside).record()
    assert rec.key_source == OUTSIDE and rec.model_dump(mode="json")["key_source"] == OUTSIDE

    staged = tmp_path / "staged"
    staged.mkdir()
    write_manifest(staged, {"key": "abc"})
    rec = Upstream.of_dir(staged).record()
    assert rec.key == "abc" and rec.manifest_sha256 and rec.key_source is None
    assert set(rec.model_dump(mode="json")) == {"path", "key", "manifest_sha256"}


# --- precision search records: consistent, hashed, for the spec they are read for ---------------------------------

def _search(**over) -> dict:
    cands = [{"precision": "fp8", "kv_cache": "fp8", "ppl_delta_pct": 0.4, "passed": True, "build_id": "b-fp8"},
             {"precision": "int4_awq", "kv_cache": "fp8", "ppl_delta_pct": 3.0, "passed": False, "build_id": "b-int4"}]
    return {"model": "tiny-llama", "gpu": "h100-sxm", "runtime": "engine", "threshold_pct": 1.0, "candidates": cands,
            "refused": {}, "not_tried": [], "passing": ["fp8"], "chosen": "fp8", **over}


def _write_raw(path, record: dict) -> None:
    """A record written by hand, with a sidecar that matches it (what a hand edit plus `sha256sum` leaves)."""
    import hashlib

    data = json.dumps(record).encode()
    path.write_bytes(data)
    path.with_name(path.name + ".sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")


def test_a_precision_search_record_round_trips_with_its_sha256_sidecar(tmp_path):
    from pipeline.core.manifests import PrecisionSearch

    path = tmp_path / "precision_search.json"
    PrecisionSearch.model_validate(_search()).write(path)
    import hashlib
    assert (tmp_path / "precision_search.json.sha256").read_text().split() == [
        hashlib.sha256(path.read_bytes()).hexdigest(), "precision_search.json"]
    assert PrecisionSearch.read(path).passing == ["fp8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precision_search.json", "precision_search.json.sha256"]
    assert PrecisionSearch.read(tmp_path / "absent.json") is None


@pytest.mark.parametrize("over, why", [
    ({"candidates": [], "passing": [], "chosen": "bf16"}, "no candidates were tried"),
    ({"passing": ["bf16"], "chosen": "bf16"}, r"passing \['bf16'\] is not the candidates that passed \['fp8'\]"),
    ({"threshold_pct": float("nan")}, "threshold_pct nan is not a positive finite number"),
    ({"chosen": "int4_awq"}, "chosen 'int4_awq' is not the cheapest passing candidate"),
    ({"threshold_pct": 5.0}, r"int4_awq: delta 3.0 % failed a 5.0 % gate"),
])
def test_an_inconsistent_precision_search_record_is_refused_with_exit_3(tmp_path, over, why):
    from pipeline.core.errors import IntegrityError
    from pipeline.core.manifests import PrecisionSearch

    path = tmp_path / "precision_search.json"
    _write_raw(path, _search(**over))  # json writes NaN as `NaN`, which the reader parses
    with pytest.raises(IntegrityError, match=f"precision search {path} is not a consistent record .*{why}.*; re-run "
                                             "`invoke build --precision auto`") as err:
        PrecisionSearch.read(path)
    assert err.value.exit_code == 3
    with pytest.raises(ValidationError):  # and never written
        PrecisionSearch.model_validate(_search(**over))


def test_a_precision_search_record_that_differs_from_its_sidecar_or_has_none_is_refused(tmp_path):
    from pipeline.core.errors import IntegrityError
    from pipeline.core.manifests import PrecisionSearch

    path = tmp_path / "precision_search.json"
    PrecisionSearch.model_validate(_search()).write(path)
    path.write_text(path.read_text().replace('"fp8"', '"bf16"'))  # a hand edit, sidecar untouched
    with pytest.raises(IntegrityError, match="differs from its sha256 sidecar"):
        PrecisionSearch.read(path)
    (tmp_path / "precision_search.json.sha256").unlink()
    with pytest.raises(IntegrityError, match="has no readable sha256 sidecar precision_search.json.sha256; re-run"):
        PrecisionSearch.read(path)


def test_a_precision_search_record_names_how_it_differs_from_a_spec():
    from pipeline.core.manifests import PrecisionSearch
    from pipeline.core.spec import resolve_spec

    record = PrecisionSearch.model_validate(_search())
    spec = resolve_spec(model="tiny-llama", precision="fp8", gpu="h100-sxm", max_ppl_delta_pct=1.0)
    assert record.differences(spec) == []
    other = resolve_spec(model="tiny-llama", precision="fp8", gpu="h200", max_ppl_delta_pct=2.0)
    assert record.differences(other) == ["gpu h100-sxm (this spec: h200)", "threshold 1.0 (this spec: 2.0)"]
