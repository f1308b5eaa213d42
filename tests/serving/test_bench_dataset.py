"""bench traffic as users have it: `--dataset` (JSONL, ShareGPT), `--request-rate` (Poisson arrivals), the SLO
figures (P99 TTFT, P95 TPOT) and length distributions; a real run against the CPU reference server."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import BenchError
from pipeline.serving.bench import (
    BenchReport,
    RequestSample,
    WorkloadOptions,
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
    ('{"conversations": [{"from": "human", "value": 5}]}', "line 2: a human turn's 'value' is not a string"),
    ('{"prompt": "a \\ud800 b"}', "line 2: 'prompt' holds a lone surrogate (character 2), not text"),
    ('{"prompt": "\\udfff"}', "line 2: 'prompt' holds a lone surrogate (character 0)"),
    ('{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x\\ud83d"}]}',
     "line 2: the reply holds a lone surrogate (character 1)"),
    ('{"prompt": "a", "output_len": 1e3}', "line 2: output_len=1000.0: expected an integer"),
    ('{"prompt": "a", "output_len": true}', "line 2: output_len=True: expected an integer"),
    ('{"prompt": "a", "output_len": ' + "9" * 5000 + "}", "line 2 holds an integer of more than 100 digits"),
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
    monkeypatch.setattr(ds, "MAX_RECORD_BYTES", 24)
    with pytest.raises(BenchError, match="line 2: over the 24-byte cap of one record"):
        load_dataset(_jsonl(tmp_path, '{"prompt": "short"}', '{"prompt": "more than 24 bytes"}'))
    monkeypatch.setattr(ds, "MAX_RECORD_BYTES", 1 << 20)  # an array's record is capped too (see tests/core)
    monkeypatch.setattr(ds, "MAX_PROMPT_CHARS", 4)
    with pytest.raises(BenchError, match="record 1: a prompt of 5 characters is over the 4-character cap"):
        load_dataset(_array(tmp_path, {"prompt": "short"}))


def _array(tmp_path, *records, name: str = "sharegpt.json"):
    """The ShareGPT file as published: one JSON array, indented."""
    path = tmp_path / name
    path.write_text(json.dumps(list(records), indent=2))
    return path


def test_a_json_array_reads_like_jsonl_and_skips_conversations_without_a_prompt(tmp_path):
    conv = {"id": "x", "conversations": [{"from": "human", "value": "Name three colours"},
                                         {"from": "gpt", "value": "red green and blue"}]}
    empty = {"id": "y", "conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "?"}]}
    records = (conv, empty, {"conversations": []}, {"prompt": "Hello", "output_len": 3})
    want = [DatasetRequest("Name three colours", 4), DatasetRequest("Hello", 3)]
    assert load_dataset(_array(tmp_path, *records), tokenizer=_WordTokenizer()) == want
    jsonl = _jsonl(tmp_path, *map(json.dumps, records))
    assert load_dataset(jsonl, tokenizer=_WordTokenizer()) == want


@pytest.mark.parametrize("text, needle", [
    ('[{"prompt": "a"}, {"prompt": ', "not a JSON array of objects after record 1 (parse error: premature EOF)"),
    ('[{"prompt": "a"}, 7]', "record 2: expected a JSON object, got int"),
    ('[{"prompt": "a"}, {"prompt": "b", "output_len": -1}]', "record 2: output_len=-1"),
    ('  \n [{"prompt": "a"}] x', "not a JSON array of objects after record 1"),
])
def test_a_malformed_json_array_is_refused_with_its_record(tmp_path, text, needle):
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(BenchError) as info:
        load_dataset(tmp_path / "bad.json")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_large_array_is_streamed_and_sampled_without_holding_the_file(tmp_path):
    import tracemalloc

    path = tmp_path / "big.json"
    with path.open("w") as f:  # ~24 MB, ShareGPT-shaped
        f.write("[")
        for i in range(6000):
            turns = [{"from": "human", "value": f"question {i} " + "x" * 2000},
                     {"from": "gpt", "value": "word " * 400}]
            f.write(("," if i else "") + json.dumps({"id": str(i), "conversations": turns}))
        f.write("]")
    tracemalloc.start()
    try:
        sample = load_dataset(path, sample=5, seed=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < path.stat().st_size / 8, peak  # records are parsed one by one; only the sample is kept
    idx = [int(r.prompt.split()[1]) for r in sample]
    assert len(idx) == 5 and idx == sorted(idx) and idx[-1] > 1000  # a sample of the whole file, in file order
    assert load_dataset(path, sample=5, seed=1) == sample and load_dataset(path, sample=5, seed=2) != sample


def test_poisson_arrivals_are_seeded_start_at_zero_and_have_the_rate():
    a = poisson_arrivals(4000, 4.0, seed=7)
    assert a == poisson_arrivals(4000, 4.0, seed=7) and a != poisson_arrivals(4000, 4.0, seed=8)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert len(a) / a[-1] == pytest.approx(4.0, rel=0.06)  # ~4 requests per second


def test_every_level_and_arm_replays_one_seeded_sample(tmp_path):
    from pipeline.serving.bench import workload_sha256

    lines = [json.dumps({"prompt": f"prompt {i}", "output_len": i + 1}) for i in range(20)]
    path = _jsonl(tmp_path, *lines)
    plans = plan_workload(WorkloadOptions(concurrency=[1, 2, 4], requests_per_level=5, max_tokens=9, dataset=path,
                                          request_rate=4.0, seed=3, speculation="both"))
    assert len(plans) == 6 and all((p.texts, p.max_tokens, p.arrivals) == (plans[0].texts, plans[0].max_tokens,
                                                                            plans[0].arrivals) for p in plans)
    assert plans[0].texts != [f"prompt {i}" for i in range(5)]  # a sample of the file, not its first lines
    assert plans[0].max_tokens == [int(t.split()[1]) + 1 for t in plans[0].texts]  # each its own output length
    assert {p.workload_sha256 for p in plans} == {workload_sha256(plans[0].texts, plans[0].max_tokens)}
    other = plan_workload(WorkloadOptions(concurrency=[1], requests_per_level=5, dataset=path, seed=4))[0]
    assert other.workload_sha256 != plans[0].workload_sha256
    assert plans[0].arrivals == poisson_arrivals(5, 4.0, 3)


def test_a_dataset_smaller_than_a_level_cycles_in_file_order(tmp_path):
    path = _jsonl(tmp_path, '{"prompt": "one", "output_len": 5}', '{"prompt": "two"}', '{"prompt": "three"}')
    plans = plan_workload(WorkloadOptions(concurrency=[1, 2], requests_per_level=4, max_tokens=9, dataset=path))
    assert [p.texts for p in plans] == [["one", "two", "three", "one"]] * 2
    assert [p.max_tokens for p in plans] == [[5, 9, 9, 5]] * 2 and plans[0].arrivals is None


def test_shared_prefix_levels_share_a_hash_and_keep_their_cold_prefixes_cold():
    plans = plan_workload(WorkloadOptions(concurrency=[1, 2], requests_per_level=4, shared_prefix_tokens=8,
                                          shared_prefix_share=0.5))
    assert plans[0].workload_sha256 == plans[1].workload_sha256
    assert [t for t in plans[0].texts if t in plans[1].texts] == plans[0].texts[1::2]  # the shared ones only


def test_sharegpt_replies_that_are_not_strings_set_no_length(tmp_path):
    """A reply whose value is a number, a list or null is no text to count: the request keeps no output length."""
    for value in (5, ["a"], None, {"x": 1}):
        conv = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": value}]}
        path = _jsonl(tmp_path, json.dumps(conv))
        assert load_dataset(path, tokenizer=_WordTokenizer()) == [DatasetRequest("hi", None)]


def test_dataset_lengths_are_checked_when_every_request_asks_the_same(tmp_path):
    """All requests with one output_len (not --max-tokens): still each prompt + its output_len within max_seq_len."""
    path = _jsonl(tmp_path, '{"prompt": "a b", "output_len": 4094}', '{"prompt": "c", "output_len": 4094}')
    with pytest.raises(BenchError, match="dataset request 0: prompt 3 \\+ output_len 4094 tokens exceed the build's "
                                         "max_seq_len 4096"):
        plan_workload(WorkloadOptions(concurrency=[1], requests_per_level=2, max_tokens=32, dataset=path),
                      tokenizer=_WordTokenizer(), max_input_len=2048, max_seq_len=4096)
    fits = _jsonl(tmp_path, '{"prompt": "a b", "output_len": 4093}', name="fits.jsonl")
    plan_workload(WorkloadOptions(concurrency=[1], requests_per_level=1, dataset=fits), tokenizer=_WordTokenizer(),
                  max_seq_len=4096)


def test_dataset_options_are_checked_before_anything_is_sent(tmp_path):
    path = _jsonl(tmp_path, '{"prompt": "a b c", "output_len": 5}', '{"prompt": "a", "output_len": 9}')
    with pytest.raises(BenchError, match="--dataset and --shared-prefix-tokens both choose the prompts"):
        plan_workload(WorkloadOptions(dataset=path, shared_prefix_tokens=8))
    with pytest.raises(BenchError, match="--request-rate 0: expected requests per second"):
        plan_workload(WorkloadOptions(dataset=path, request_rate=0.0))
    with pytest.raises(BenchError, match="dataset request 1: prompt 2 \\+ output_len 9 tokens exceed the build's "
                                         "max_seq_len 10"):
        plan_workload(WorkloadOptions(concurrency=[1], requests_per_level=2, dataset=path), tokenizer=_WordTokenizer(),
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
    from pipeline.stages.package.inputs import PackageInputs

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    repo = package_repo(spec, PackageInputs(checkpoint=tiny_models["tiny-llama"], build_id="bench-dataset")).path
    conv = {"conversations": [{"from": "human", "value": "Tell me about the sea."},
                              {"from": "gpt", "value": "The sea is large and deep and blue."}]}
    data = _jsonl(tmp_path, '{"prompt": "Once upon a time", "output_len": 6}',
                  '{"prompt": "The quick brown fox jumps over the lazy dog. Then", "output_len": 3}',
                  json.dumps(conv), '{"prompt": "Hello"}')
    out_json = tmp_path / "report.json"
    with TritonServer(repo, ready_timeout_s=300) as server:
        tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", url=server.grpc_url,
                         repo=str(repo), dataset=str(data), request_rate="4", concurrency="1,2", requests="6",
                         max_tokens="4", json_file=str(out_json))
    out = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert report["failed"] == 0 and report["request_rate"] == 4.0 and report["dataset"] == str(data)
    assert (report["model"], report["precision"], report["min_tokens"]) == ("tiny-llama", "fp8", True)
    assert report["ttft_ms_p99"] > 0 and report["tpot_ms_p95"] > 0
    assert f"SLO figures: TTFT p99 {report['ttft_ms_p99']:.1f} ms" in out
    assert "output lengths from the dataset (else --max-tokens 4), min=max (min_tokens sent)" in out
    # both levels replay the same 6 requests: the file's 4 in order, then its first 2 again
    hashes = {lv["workload_sha256"] for lv in report["levels"]}
    assert len(hashes) == 1 and len(report["levels"]) == 2 and all(lv["requests"] == 6 for lv in report["levels"])
    assert report["input_len"]["count"] == 12 and report["input_len"]["max"] > report["input_len"]["min"]
    # each request got exactly the output length it asked for: 6, 3, the reply's length, 4 (--max-tokens), 6, 3
    reply = load_tokenizer(tokenizer_dir_of(repo)).encode(conv["conversations"][1]["value"], add_special_tokens=False)
    asked = [6, 3, len(reply.ids), 4, 6, 3] * 2
    assert report["output_len"] == length_stats(asked)
    assert sum(lv["output_tokens"] for lv in report["levels"]) == sum(asked)
    assert "acceptance_rate" in report and "prefix_cache_hit_ratio" in report


def test_a_surrogate_pair_and_unicode_line_separators_are_text(tmp_path):
    """A valid escaped pair is one character; U+2028 / U+0085 inside a string do not end a JSONL line."""
    path = _jsonl(tmp_path, '{"prompt": "\\ud83d\\ude00 ok"}', '{"prompt": "a\u2028b\u0085c"}')
    assert [r.prompt for r in load_dataset(path)] == ["\U0001F600 ok", "a\u2028b\u0085c"]
