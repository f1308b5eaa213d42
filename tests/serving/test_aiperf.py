"""bench --second-opinion aiperf: its argv, payload and dataset (pure), its export parsed, install and route errors.

tests/data/aiperf_0.13_profile_export.json is a real AIPerf 0.13.0 export, recorded against the tiny-llama fp8 CPU
reference server's ensemble with the argv `profile_argv` builds (8 of `bench.prompts`, 16 tokens each, concurrency
2, --request-rate 4):

    aiperf profile --model ensemble --url http://127.0.0.1:PORT --endpoint-type template
      --custom-endpoint /v2/models/ensemble/generate_stream --streaming --extra-inputs payload_template:payload.jinja
      --extra-inputs response_field:text_output --input-file requests.jsonl --custom-dataset-type single_turn
      --dataset-sampling-strategy sequential --request-count 8 --concurrency 2 --request-rate 4
      --arrival-pattern poisson --random-seed 0 --tokenizer .../preprocessing/tokenizer --request-timeout-seconds 120
      --output-artifact-dir artifacts --ui none --no-server-metrics --no-gpu-telemetry
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jinja2
import pytest

from pipeline.core.errors import BenchError, HostError, RunError
from pipeline.serving import aiperf
from pipeline.serving.bench import BenchReport, RequestSample, check_failures, summarize

EXPORT = Path(__file__).resolve().parents[1] / "data" / "aiperf_0.13_profile_export.json"


def test_the_recorded_export_parses_into_our_units():
    level = aiperf.parse_export(json.loads(EXPORT.read_text()))
    assert level.aiperf_version == "0.13.0"
    assert (level.requests, level.errors, level.output_tokens) == (8, 0, 112)
    assert level.ttft_ms_p50 == pytest.approx(35.337, abs=1e-3)
    assert level.ttft_ms_p99 == pytest.approx(54.396, abs=1e-3)
    assert level.tpot_ms_p50 == pytest.approx(4.952, abs=1e-3)  # its inter_token_latency p50
    assert level.output_tokens_per_s == pytest.approx(49.662, abs=1e-3)


def test_an_export_of_another_layout_is_refused():
    with pytest.raises(RunError, match=r"^aiperf wrote no profile_export_aiperf.json document \(no aiperf_version\); "
                                       r"is it aiperf==0\.13\.\*\?$"):
        aiperf.parse_export({"time_to_first_token": {}})
    doc = json.loads(EXPORT.read_text())
    doc["time_to_first_token"]["unit"] = "s"
    with pytest.raises(RunError, match=r"^aiperf export: time_to_first_token is not in ms .*; is it aiperf==0\.13"):
        aiperf.parse_export(doc)


def test_a_run_whose_requests_all_failed_has_no_latencies():
    doc = {"aiperf_version": "0.13.0", "error_request_count": {"unit": "requests", "avg": 3.0}}
    level = aiperf.parse_export(doc)
    assert (level.requests, level.errors, level.ttft_ms_p50, level.output_tokens_per_s) == (0, 3, None, None)


def _render(template: str, **values) -> dict:
    """As AIPerf's template endpoint renders it (Jinja, autoescape on) and parses it."""
    return json.loads(jinja2.Environment(autoescape=True).from_string(template).render(**values))


def test_the_payload_asks_for_exact_greedy_lengths_like_our_requests():
    text = 'Say "hi" & <go>\n'
    assert _render(aiperf.payload_template(None), text=text, max_tokens=7) == {
        "text_input": text, "max_tokens": 7, "min_tokens": 7, "stream": True, "temperature": 0.0, "top_k": 1,
        "exclude_input_in_output": True}
    assert _render(aiperf.payload_template(0), text="x", max_tokens=3)["num_draft_tokens"] == 0  # --speculation off


def test_the_dataset_is_single_turn_jsonl_in_order():
    lines = aiperf.dataset_jsonl(["first", "second é"], [4, 9]).splitlines()
    assert [json.loads(line) for line in lines] == [{"text": "first", "output_length": 4},
                                                    {"text": "second é", "output_length": 9}]
    with pytest.raises(ValueError):
        aiperf.dataset_jsonl(["a", "b"], [1])


def test_profile_argv_closed_loop_and_at_a_rate(tmp_path):
    target = aiperf.Target("127.0.0.1:8000", "ensemble", "/repo/preprocessing/tokenizer")
    files = aiperf.LevelFiles(requests=tmp_path / "r.jsonl", template=tmp_path / "p.jinja", artifacts=tmp_path / "a")
    argv = aiperf.profile_argv("aiperf", target, aiperf.Load(concurrency=4, requests=16, request_rate=None, seed=3),
                               files, request_timeout_s=120.0)
    assert argv == [
        "aiperf", "profile", "--model", "ensemble", "--url", "http://127.0.0.1:8000", "--endpoint-type", "template",
        "--custom-endpoint", "/v2/models/ensemble/generate_stream", "--streaming",
        "--extra-inputs", f"payload_template:{tmp_path / 'p.jinja'}", "--extra-inputs", "response_field:text_output",
        "--input-file", str(tmp_path / "r.jsonl"), "--custom-dataset-type", "single_turn",
        "--dataset-sampling-strategy", "sequential", "--request-count", "16", "--concurrency", "4",
        "--random-seed", "3", "--tokenizer", "/repo/preprocessing/tokenizer", "--request-timeout-seconds", "120",
        "--output-artifact-dir", str(tmp_path / "a"), "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry"]
    rated = aiperf.profile_argv("aiperf", target, aiperf.Load(concurrency=4, requests=16, request_rate=2.5, seed=3),
                                files, request_timeout_s=120.0)
    assert rated[rated.index("--request-rate"):][:4] == ["--request-rate", "2.5", "--arrival-pattern", "poisson"]


def test_its_environment_turns_hf_offline_off_and_points_the_hub_at_a_closed_port():
    env = aiperf.aiperf_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}


def test_a_failed_run_is_quoted_by_its_first_error_line():
    out = ("02:11:36.426 ERROR    Failed to handle command profile_configure: Failed to load tokenizer 'x' "
           "(base_component_service.py:522)\n02:11:36.428 ERROR    Failed for SystemController (x.py:1)\n"
           "Log File: /tmp/a/logs/aiperf.log\n")
    assert aiperf.failure_line(out) == "Failed to handle command profile_configure: Failed to load tokenizer 'x'"
    assert aiperf.failure_line("usage: aiperf\nbad flag\n") == "bad flag"
    assert aiperf.failure_line("") == "no output"


def _report(**kw) -> BenchReport:
    return BenchReport("127.0.0.1:1", kw.pop("model", "ensemble"), kw.pop("streaming", True), 8, 4, 1, 3.0,
                       min_tokens=kw.pop("min_tokens", True), **kw)


def test_routes_it_cannot_drive_are_refused_before_the_run():
    with pytest.raises(BenchError, match=r"^--second-opinion aiperf drives Triton's HTTP generate_stream with "
                                         r"text_input and min_tokens; model 'tensorrt_llm_bls' is not streamed"):
        aiperf.Aiperf.check(_report(model="tensorrt_llm_bls", streaming=False), http_url="127.0.0.1:2",
                            tokenizer_dir="/t")
    with pytest.raises(BenchError, match=r"model 'tensorrt_llm' is not such a route"):
        aiperf.Aiperf.check(_report(model="tensorrt_llm", min_tokens=False), http_url="127.0.0.1:2",
                            tokenizer_dir="/t")
    with pytest.raises(BenchError, match=r"needs the server's HTTP address with --url: pass --http-url"):
        aiperf.Aiperf.check(_report(), http_url=None, tokenizer_dir="/t")
    with pytest.raises(BenchError, match=r"counts tokens with the build's tokenizer, and none is here"):
        aiperf.Aiperf.check(_report(), http_url="127.0.0.1:2", tokenizer_dir=None)
    aiperf.Aiperf.check(_report(), http_url="127.0.0.1:2", tokenizer_dir="/t")


def test_side_by_side_table_and_a_failed_second_opinion_exits_5():
    lv = summarize(2, [RequestSample(ok=True, latency_s=0.2, ttft_s=0.03, output_tokens=16)], 0.2, gpus=1,
                   price_per_gpu_hour=3.0)
    lv.aiperf = aiperf.parse_export(json.loads(EXPORT.read_text())).model_dump()
    report = _report(levels=[lv])
    text = aiperf.format_side_by_side(report)
    assert text.splitlines()[0] == ("second opinion: NVIDIA AIPerf 0.13.0 on the same requests, in order, closed "
                                    "loop; each cell ours / aiperf")
    assert "30.0 / 35.3" in text and "11.33 / 4.95" in text and "80.0 / 49.7" in text and "8/0" in text
    report.second_opinion_error = "aiperf failed (exit 1): boom"
    with pytest.raises(RunError, match=r"^second opinion: aiperf failed \(exit 1\): boom$") as info:
        check_failures(report)
    assert info.value.exit_code == 5


def test_an_override_that_is_no_file_exits_4_in_one_line(monkeypatch, capsys, tmp_path):
    import tasks

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIPELINE_AIPERF", str(tmp_path / "nowhere" / "aiperf"))
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", second_opinion="aiperf")
    assert info.value.code == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: PIPELINE_AIPERF={tmp_path / 'nowhere' / 'aiperf'} is not a file; point it at the aiperf "
                   "executable or unset it"], err


def test_a_failed_install_exits_4_and_leaves_no_venv(monkeypatch, capsys, tmp_path):
    import tasks

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PIPELINE_AIPERF", raising=False)

    def no_pypi(argv, **kwargs):
        if "pip" in argv:
            return subprocess.CompletedProcess(argv, 1, "", "ERROR: No matching distribution found for aiperf==0.13.*")
        Path(argv[-1], "bin").mkdir(parents=True)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr("pipeline.core.tool_venv.subprocess.run", no_pypi)
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", second_opinion="aiperf")
    assert info.value.code == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: installing aiperf==0.13.* failed: ERROR: No matching distribution found for "
                       "aiperf==0.13.*; check network access to PyPI or set PIPELINE_AIPERF=/path/to/aiperf"), err
    assert not (tmp_path / "cache" / "aiperf-venv").exists()


def test_an_unknown_second_opinion_and_http_url_without_url_exit_2(monkeypatch, capsys, tmp_path):
    import tasks

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", second_opinion="genai-perf")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: --second-opinion 'genai-perf': the only second opinion is "
                                               "'aiperf'; drop the flag for ours alone")
    monkeypatch.setenv("PIPELINE_AIPERF", __file__)  # any file: located, never run
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", second_opinion="aiperf",
                         http_url="127.0.0.1:8000")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --http-url names the HTTP address of the server at --url; pass --url too, or drop both so that "
        "bench starts the server")


def test_located_needs_a_finished_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path))
    monkeypatch.delenv("PIPELINE_AIPERF", raising=False)
    exe = tmp_path / "aiperf-venv" / "bin" / "aiperf"
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    assert aiperf.AIPERF.located() is None  # no installed.ok: an interrupted install
    (tmp_path / "aiperf-venv" / "installed.ok").write_text("aiperf==0.13.*\n")
    assert aiperf.AIPERF.located() == str(exe)
    with pytest.raises(HostError):
        monkeypatch.setenv("PIPELINE_AIPERF", str(tmp_path / "missing"))
        aiperf.AIPERF.located()
