"""Quality verdicts on disk: `precision: auto` records and target checkpoints' quality gates, per model."""

from __future__ import annotations

from pipeline.core.artifacts import write_manifest
from pipeline.core.manifests import CheckpointManifest, PrecisionCandidate, PrecisionSearch
from pipeline.stages.calibrate.quality_records import quality_verdicts
from tests.core.test_manifests import _checkpoint_manifest


def _gate(engines, build, *, precision, passed, role="target", model="tiny-llama", dirname="checkpoint"):
    raw = _checkpoint_manifest(role=role, recipe={**_checkpoint_manifest()["recipe"], "precision": precision})
    raw["model"]["name"] = model
    raw["quality"]["passed"] = passed
    directory = engines / build / dirname
    directory.mkdir(parents=True)
    write_manifest(directory, CheckpointManifest.model_validate(raw).model_dump(mode="json"))


def test_verdicts_come_from_auto_records_and_checkpoint_gates_of_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    engines = tmp_path / "engines"
    assert quality_verdicts("tiny-llama") == {}
    _gate(engines, "a", precision="fp8", passed=True)
    _gate(engines, "b", precision="int4_awq", passed=False, dirname="hf_checkpoint")  # runtime pytorch's export
    _gate(engines, "c", precision="w4a8_awq", passed=True, role="draft")  # a draft's gate says nothing of the target
    _gate(engines, "d", precision="int8_sq", passed=True, model="llama-8b")  # another model
    (engines / "e" / "checkpoint").mkdir(parents=True)
    (engines / "e" / "checkpoint" / "manifest.json").write_text("{corrupt")  # skipped, never fatal
    assert quality_verdicts("tiny-llama") == {"fp8": True, "int4_awq": False}
    cands = [PrecisionCandidate(precision="int4_awq", kv_cache="fp8", ppl_delta_pct=0.5, passed=True, build_id="f")]
    PrecisionSearch(model="tiny-llama", gpu="h100-sxm", runtime="engine", threshold_pct=1.0, candidates=cands,
                    refused={}, not_tried=[], passing=["int4_awq"], chosen="int4_awq").write(engines / "a" /
                                                                                              "precision_search.json")
    assert quality_verdicts("tiny-llama") == {"fp8": True, "int4_awq": True}  # one passing gate wins
