"""bench traffic as users have it: `--dataset` (JSONL, ShareGPT), `--request-rate` (Poisson arrivals), the SLO
figures (P99 TTFT, P95 TPOT) and length distributions; a real run against the CPU reference server."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import BenchError
from pipeline.serving.bench import (
    BenchReport,
    RequestSample,
    format_report,
    length_stats,
    plan_workload,
    poisson_arrivals,
    summarize,
)
from pipeline.serving.dataset import DatasetRequest, load_dataset


def _jsonl(tmp_path, *lines: str, name: str = "prompts.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


class _WordTokenizer:
    """Counts words as tokens (enough to check how lengths are taken)."""

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text, add_special_tokens=True):
        return self._Enc(list(range(len(text.split()) + (1 if add_special_tokens else 0))))


def test_prompt_lines_with_and_without_output_len(tmp_path):
    path = _jsonl(tmp_path, '{"prompt": "Hello there", "output_len": 12}', "", '{"prompt": "What is KV reuse?"}')
    assert load_dataset(path) == [DatasetRequest("Hello there", 12), DatasetRequest("What is KV reuse?", None)]


def test_sharegpt_takes_the_first_human_turn_and_the_replys_token_length(tmp_path):
    conv = {"id": "x", "conversations": [{"from": "system", "value": "be brief"},
                                         {"from": "human", "value": "Name three colours"},
                                         {"from": "gpt", "value": "red green and blue"},
                                         {"from": "human", "value": "more"}]}
    no_human = {"conversations": [{"from": "gpt", "value": "hi"}]}
    path = _jsonl(tmp_path, json.dumps(conv), json.dumps(no_human))
    assert load_dataset(path, tokenizer=_WordTokenizer()) == [DatasetRequest("Name three colours", 4)]
    assert load_dataset(path) == [DatasetRequest("Name three colours", None)]  # no tokenizer: no length


@pytest.mark.parametrize("line, needle", [
    ('{"prompt": "a"', "line 2: not JSON"),
    ('["prompt"]', "line 2: expected a JSON object, got list"),
    ('{"text": "a"}', "line 2: no 'prompt' string"),
    ('{"prompt": "a", "output_len": 0}', "line 2: output_len=0: expected an integer within 1..1048576"),
    ('{"prompt": "a", "output_len": "9"}', "line 2: output_len='9'"),
    ('{"conversations": "hi"}', "line 2: 'conversations' must be a list"),
    ('{"conversations": [{"from": "human", "value": ""}]}', "line 2: the first human turn has no text"),
])
def test_a_malformed_line_is_refused_with_its_number(tmp_path, line, needle):
    path = _jsonl(tmp_path, '{"prompt": "fine"}', line)
    with pytest.raises(BenchError) as info:
        load_dataset(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_missing_empty_oversized_and_binary_files_are_refused(tmp_path, monkeypatch):
    import pipeline.serving.dataset as ds

    with pytest.raises(BenchError, match="no such file"):
        load_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(BenchError, match="no requests"):
        load_dataset(_jsonl(tmp_path, "", "  "))
    (tmp_path / "bin.jsonl").write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(BenchError, match="not UTF-8"):
        load_dataset(tmp_path / "bin.jsonl")
    monkeypatch.setattr(ds, "MAX_DATASET_BYTES", 10)
    with pytest.raises(BenchError, match="over the 10-byte cap"):
        load_dataset(_jsonl(tmp_path, '{"prompt": "more than ten bytes"}'))


def test_poisson_arrivals_are_seeded_start_at_zero_and_have_the_rate():
    a = poisson_arrivals(4000, 4.0, seed=7)
    assert a == poisson_arrivals(4000, 4.0, seed=7) and a != poisson_arrivals(4000, 4.0, seed=8)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert len(a) / a[-1] == pytest.approx(4.0, rel=0.06)  # ~4 requests per second


def test_plan_workload_takes_dataset_prompts_in_order_with_their_output_lengths(tmp_path):
    path = _jsonl(tmp_path, '{"prompt": "one", "output_len": 5}', '{"prompt": "two"}', '{"prompt": "three"}')
    plans = plan_workload(concurrency=[1, 2], requests_per_level=2, max_tokens=9, dataset=path, request_rate=4.0,
                          seed=3)
    assert [p.texts for p in plans] == [["one", "two"], ["three", "one"]]  # cycling through the file
    assert [p.max_tokens for p in plans] == [[5, 9], [9, 5]]
    assert plans[0].arrivals == poisson_arrivals(2, 4.0, 3) and plans[1].arrivals == poisson_arrivals(2, 4.0, 4)
    assert plan_workload(concurrency=[1], requests_per_level=1, dataset=path)[0].arrivals is None


def test_dataset_options_are_checked_before_anything_is_sent(tmp_path):
    path = _jsonl(tmp_path, '{"prompt": "a b c", "output_len": 5}', '{"prompt": "a", "output_len": 9}')
    with pytest.raises(BenchError, match="--dataset and --shared-prefix-tokens both choose the prompts"):
        plan_workload(dataset=path, shared_prefix_tokens=8)
    with pytest.raises(BenchError, match="--request-rate 0: expected requests per second"):
        plan_workload(dataset=path, request_rate=0.0)
    with pytest.raises(BenchError, match="dataset request 1: prompt 2 \\+ output_len 9 tokens exceed the build's "
                                         "max_seq_len 10"):
        plan_workload(concurrency=[1], requests_per_level=2, dataset=path, tokenizer=_WordTokenizer(),
                      max_seq_len=10)


def test_report_gives_p99_ttft_p95_tpot_and_length_distributions():
    samples = [RequestSample(ok=True, latency_s=0.1 * (i + 2), ttft_s=0.01 * (i + 1), output_tokens=11)
               for i in range(20)]
    lv = summarize(2, samples, wall_s=2.0, gpus=1, price_per_gpu_hour=3.0)
    assert lv.tpot_ms_p95 == pytest.approx(float(__import__("numpy").percentile(
        [(s.latency_s - s.ttft_s) / 10 * 1000 for s in samples], 95)), rel=1e-4)
    assert length_stats([4, 8, 12]) == {"count": 3, "mean": 8.0, "min": 4, "p50": 8.0, "p90": 11.2, "p99": 11.92,
                                        "max": 12}
    assert length_stats([]) is None
    r = BenchReport("127.0.0.1:1", "ensemble", True, 32, 8, 1, 3.0, levels=[lv], ttft_ms_p99=123.4, tpot_ms_p95=5.5,
                    request_rate=4.0, dataset="p.jsonl", input_len=length_stats([4, 8]), output_len=None,
                    acceptance_rate=0.5, prefix_cache_hit_ratio=0.75)
    text = format_report(r)
    assert "SLO figures: TTFT p99 123.4 ms, TPOT p95 5.50 ms; Poisson arrivals at 4 req/s per level" in text
    assert "input tokens: count 2, mean 6, min 4, p50 6, p90 7.6, p99 7.96, max 8" in text
    assert "output tokens: n/a" in text and "prompts from p.jsonl" in text
    d = r.as_dict()
    assert (d["ttft_ms_p99"], d["tpot_ms_p95"], d["acceptance_rate"], d["prefix_cache_hit_ratio"]) == \
        (123.4, 5.5, 0.5, 0.75)


# ------------------------------------------------------------------------------------------------- real server
@pytest.mark.slow
def test_invoke_bench_dataset_at_a_request_rate_reports_p99_ttft(tiny_models, tmp_path, monkeypatch, capsys):
    """`invoke bench --dataset prompts.jsonl --request-rate 4` against the CPU reference server of tiny-llama."""
    import tasks
    from pipeline.core.spec import resolve_spec
    from pipeline.serving.bench import tokenizer_dir_of
    from pipeline.serving.serve import TritonServer
    from pipeline.serving.token_count import load_tokenizer
    from pipeline.stages.package import package_repo

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    repo = package_repo(spec, checkpoint_dir=tiny_models["tiny-llama"], build_id="bench-dataset").path
    conv = {"conversations": [{"from": "human", "value": "Tell me about the sea."},
                              {"from": "gpt", "value": "The sea is large and deep and blue."}]}
    data = _jsonl(tmp_path, '{"prompt": "Once upon a time", "output_len": 6}',
                  '{"prompt": "The quick brown fox jumps over the lazy dog. Then", "output_len": 3}',
                  json.dumps(conv), '{"prompt": "Hello"}')
    out_json = tmp_path / "report.json"
    with TritonServer(repo, ready_timeout_s=300) as server:
        tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", url=server.grpc_url,
                         repo=str(repo), dataset=str(data), request_rate="4", concurrency="2", requests="6",
                         max_tokens="4", json_=str(out_json))
    out = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert report["failed"] == 0 and report["request_rate"] == 4.0 and report["dataset"] == str(data)
    assert report["ttft_ms_p99"] > 0 and report["tpot_ms_p95"] > 0
    assert f"SLO figures: TTFT p99 {report['ttft_ms_p99']:.1f} ms" in out
    assert report["input_len"]["count"] == 6 and report["input_len"]["max"] > report["input_len"]["min"]
    # the requests asked for 6, 3, the reply's token length, 4 (--max-tokens), 6, 3 tokens: none produced more
    reply = load_tokenizer(tokenizer_dir_of(repo)).encode(conv["conversations"][1]["value"], add_special_tokens=False)
    assert report["output_len"]["count"] == 6 and report["output_len"]["max"] <= max(6, len(reply.ids))
    assert report["output_len"]["min"] <= 3
    assert "acceptance_rate" in report and "prefix_cache_hit_ratio" in report
