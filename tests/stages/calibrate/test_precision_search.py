"""`precision: auto`: the candidates are calibrated most precise first, a cheaper one only while the one before passes
the gate; the cheapest passing one is built, every delta printed and recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import QualityGateFailed
from pipeline.core.manifests import PrecisionSearch
from pipeline.core.spec import resolve_spec
from pipeline.stages.calibrate import precision_search

ROOT = Path(__file__).resolve().parents[3]


class _Calibrated:
    """What `run_calibrate` returns, as far as the search reads it."""

    def __init__(self, spec, delta):
        from types import SimpleNamespace

        build_id = f"{spec.model.name}-{spec.quantization.precision}-0123456789ab"
        self.manifest = SimpleNamespace(build_id=build_id, quality=SimpleNamespace(ppl_delta_pct=delta))
        self.path = Path("engines") / build_id / "checkpoint"


def _calibrate_with(monkeypatch, tmp_path, deltas: dict[str, float]) -> list[str]:
    """Replace the calibrate run by one measuring `deltas`."""
    calls: list[str] = []
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))

    def run(spec, *, role, source, verify):
        p = spec.quantization.precision
        calls.append(p)
        assert not spec.quantization.quality_gate and role == "target"  # recorded, judged by the search
        (tmp_path / "engines" / f"tiny-llama-{p}-0123456789ab").mkdir(parents=True, exist_ok=True)
        return _Calibrated(spec, deltas[p])

    monkeypatch.setattr(precision_search, "run_calibrate", run)
    return calls


def test_int4_is_tried_only_while_fp8_holds(monkeypatch, tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="auto", target="reference", max_ppl_delta_pct=1.0)
    calls = _calibrate_with(monkeypatch, tmp_path, {"fp8": 1.5, "int4_awq": 0.1})
    lines: list[str] = []
    with pytest.raises(QualityGateFailed) as info:
        precision_search.choose_precision(spec, say=lines.append)
    assert calls == ["fp8"]  # fp8 failed: int4 is never calibrated
    assert str(info.value) == ("precision auto: no candidate passes the quality gate (<= 1 %): the best, fp8, has a "
                               "held-out perplexity delta of +1.500 %; use --precision bf16, better calibration data "
                               "(--calib-data), or raise --max-ppl-delta")
    assert info.value.exit_code == 2 and lines == [
        "precision auto: fp8 / KV fp8: held-out perplexity delta +1.500 % fails the gate (<= 1 %)"]


def test_the_cheapest_passing_candidate_is_chosen_and_recorded(monkeypatch, tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="auto", target="reference")
    _calibrate_with(monkeypatch, tmp_path, {"fp8": 0.02, "int4_awq": 1.2})
    choice = precision_search.choose_precision(spec)
    assert choice.spec.quantization.precision == "fp8" and choice.spec.auto_precision is None
    r = choice.record
    assert [(c.precision, c.passed, c.build_id) for c in r.candidates] == [
        ("fp8", True, "tiny-llama-fp8-0123456789ab"), ("int4_awq", False, "tiny-llama-int4_awq-0123456789ab")]
    assert (r.passing, r.chosen, r.threshold_pct, r.not_tried) == (["fp8"], "fp8", 1.0, [])
    saved = PrecisionSearch.read(tmp_path / "engines" / "tiny-llama-fp8-0123456789ab" / "precision_search.json")
    assert saved == r


@pytest.mark.slow
def test_invoke_build_precision_auto_picks_a_precision_printing_each_delta(pipeline_env):
    """The user story: `invoke build --model tiny-llama --precision auto --target reference`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "invoke", "build", "--model", "tiny-llama", "--precision", "auto", "--target",
           "reference", "--calib-size", "8", "--json"]  # 8 samples: the CI-sized calibration
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    search = report["precision_search"]
    deltas = [line for line in run.stderr.splitlines() if line.startswith("precision auto: ") and "delta" in line]
    assert [c["precision"] for c in search["candidates"]] == ["fp8", "int4_awq"][:len(deltas)]
    for line, c in zip(deltas, search["candidates"]):
        assert f"{c['precision']} / KV {c['kv_cache']}: held-out perplexity delta {c['ppl_delta_pct']:+.3f} %" in line
    chosen = search["chosen"]
    assert chosen == search["passing"][-1] and f"precision={chosen} " in report["summary"]
    assert report["build_id"].startswith(f"tiny-llama-{chosen}-") and "auto" not in report["build_id"]
    assert "auto" not in Path(report["outputs"]["triton_repo"]).name
    record = PrecisionSearch.read(Path(report["outputs"]["checkpoint"]).parent / "precision_search.json")
    assert record.model_dump(mode="json") == search
    ckpt = json.loads((Path(report["outputs"]["checkpoint"]) / "manifest.json").read_text())
    assert ckpt["recipe"]["precision"] == chosen and ckpt["quality"]["passed"]

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and json.loads(again.stdout)["noop"], again.stderr[-2000:]
    assert json.loads(again.stdout)["precision_search"]["candidates"] == search["candidates"]

    # a gate below every candidate's delta: one line naming the best, nothing built for it
    best = min(c["ppl_delta_pct"] for c in search["candidates"])
    if best > 0.001:
        fail = subprocess.run(cmd[:-1] + ["--max-ppl-delta", "0.001"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert fail.returncode == 2
        assert fail.stderr.strip().splitlines()[-1].startswith(
            "error: precision auto: no candidate passes the quality gate (<= 0.001 %): the best, fp8, has a held-out "
            "perplexity delta of +")
