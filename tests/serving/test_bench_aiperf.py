"""`invoke bench --second-opinion aiperf` on the tiny-llama fp8 CPU reference server: AIPerf replays every level's
requests over HTTP generate_stream, and both tools' figures agree within a loose factor.

Runs only where AIPerf is installed already ($PIPELINE_AIPERF, or the cache's aiperf-venv): a test never installs it.
"""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import HostError
from pipeline.serving.aiperf import AIPERF


def _installed() -> str | None:
    try:
        return AIPERF.located()
    except HostError:
        return None


EXE = _installed()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(EXE is None, reason="AIPerf is not installed (set PIPELINE_AIPERF=/path/to/aiperf)")]
TTFT_FACTOR = 3.0  # the two clients differ (gRPC vs HTTP streams, its own process per level) on a shared CPU
TOKENS_FACTOR = 2.0  # it re-tokenizes the streamed text: fewer tokens than the server generated


def _within(ours: float, theirs: float, factor: float) -> bool:
    return ours / factor <= theirs <= ours * factor


def test_invoke_bench_second_opinion_aiperf_agrees_on_ttft_and_throughput(tiny_models, tmp_path, monkeypatch,
                                                                          capsys):
    import tasks
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    monkeypatch.setenv("PIPELINE_AIPERF", EXE)
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    repo = package_repo(spec, PackageInputs(checkpoint=tiny_models["tiny-llama"], build_id="bench-aiperf")).path
    out_json = tmp_path / "report.json"
    tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", repo=str(repo),
                     concurrency="1,2", requests="8", max_tokens="16", second_opinion="aiperf",
                     json_file=str(out_json))
    out = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert report["failed"] == 0 and report["second_opinion_error"] is None
    assert "second opinion: NVIDIA AIPerf 0.13" in out and "each cell ours / aiperf" in out
    for lv in report["levels"]:
        theirs = lv["aiperf"]
        assert (theirs["requests"], theirs["errors"]) == (8, 0) and theirs["aiperf_version"].startswith("0.13.")
        assert _within(lv["ttft_ms_p50"], theirs["ttft_ms_p50"], TTFT_FACTOR), (lv, theirs)
        assert _within(lv["output_tokens_per_s"], theirs["output_tokens_per_s"], TOKENS_FACTOR), (lv, theirs)
        assert 8 * 16 / TOKENS_FACTOR <= theirs["output_tokens"] <= 8 * 16
