"""bench: statistics, cost, metrics parsing and the report (pure); a real server run lives in test_bench_server."""

from __future__ import annotations

import json

import pytest

from pipeline.serving.bench import (
    BenchError,
    BenchReport,
    RequestSample,
    check_local,
    cost_per_1m_tokens,
    format_report,
    kv_block_counters,
    metrics_hit_ratio,
    parse_metrics,
    percentile,
    plot_report,
    prompts,
    summarize,
    write_json,
)


def test_percentile_matches_numpy_linear():
    import numpy as np

    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None
    assert percentile([4.0], 99) == 4.0


def test_cost_per_1m_tokens_formula():
    # 8 GPUs at $3.50/h producing 10,000 tok/s: 8*3.5/3600/10000*1e6 = $0.7778
    assert cost_per_1m_tokens(10_000, gpus=8, price_per_gpu_hour=3.5) == pytest.approx(0.77778, rel=1e-4)
    assert cost_per_1m_tokens(0, gpus=1, price_per_gpu_hour=3.5) is None


def test_summarize_level():
    samples = [
        RequestSample(ok=True, latency_s=1.0, ttft_s=0.1, output_tokens=10, reused_blocks=1, total_blocks=4,
                      accepted_draft_tokens=6, draft_tokens=8),
        RequestSample(ok=True, latency_s=2.0, ttft_s=0.2, output_tokens=19, reused_blocks=3, total_blocks=4,
                      accepted_draft_tokens=2, draft_tokens=8),
        RequestSample(ok=False, error="boom"),
    ]
    lv = summarize(2, samples, wall_s=2.0, gpus=1, price_per_gpu_hour=3.6)
    assert (lv.requests, lv.errors, lv.output_tokens, lv.first_error) == (3, 1, 29, "boom")
    assert lv.output_tokens_per_s == pytest.approx(14.5)
    assert lv.ttft_ms_p50 == pytest.approx(150.0)
    assert lv.tpot_ms_p50 == pytest.approx(100.0)  # both requests: 0.9/9 and 1.8/18 s per token
    assert lv.latency_ms_p99 == pytest.approx(1990.0)
    assert lv.cost_per_1m_output_tokens_usd == pytest.approx(3.6 / 3600 / 14.5 * 1e6, rel=1e-3)
    assert lv.acceptance_rate == pytest.approx(0.5)
    assert lv.prefix_cache_hit_ratio == pytest.approx(4 / 12, abs=1e-4)  # reused / (reused + newly allocated) blocks


def test_draft_kv_metrics_do_not_count_toward_the_targets_hit_ratio():
    text = ('nv_trt_llm_kv_cache_block_metrics{model="tensorrt_llm",version="1",kv_cache_block_type="reused"} 5\n'
            'nv_trt_llm_kv_cache_block_metrics{model="tensorrt_llm_draft",version="1",kv_cache_block_type="reused"} 7\n')
    assert kv_block_counters(parse_metrics(text)) == {"reused": 5.0}


def test_tpot_needs_ttft_and_two_tokens():
    assert RequestSample(ok=True, latency_s=1.0, ttft_s=None, output_tokens=5).tpot_s is None
    assert RequestSample(ok=True, latency_s=1.0, ttft_s=0.5, output_tokens=1).tpot_s is None


METRICS = """\
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} %d
nv_trt_llm_reference_kv_cache_metrics{kv_cache_block_type="missed",model="tensorrt_llm",version="1"} %d
nv_inference_count{model="ensemble",version="1"} 12
"""


def test_metrics_hit_ratio_from_counters_delta():
    before = kv_block_counters(parse_metrics(METRICS % (10, 30)))
    after = kv_block_counters(parse_metrics(METRICS % (40, 40)))
    assert after["tokens_per"] == 64
    assert metrics_hit_ratio(before, after) == pytest.approx(30 / 40)


def test_metrics_without_reuse_counters_is_none():
    m = parse_metrics('nv_inference_count{model="ensemble",version="1"} 12\n')
    assert kv_block_counters(m) == {}
    assert metrics_hit_ratio({}, {}) is None
    only_reused = {"reused": 5.0}
    assert metrics_hit_ratio({}, only_reused) is None


def test_only_loopback_is_allowed():
    for ok in ("127.0.0.1:8001", "localhost:8001", "http://127.0.0.1:8002/metrics", "[::1]:8001"):
        check_local(ok)
    for bad in ("10.0.0.1:8001", "example.com:8001", "http://example.com/metrics"):
        with pytest.raises(BenchError, match="127.0.0.1"):
            check_local(bad)


def test_prompts_share_a_prefix_and_are_deterministic():
    ps = prompts(10)
    assert ps == prompts(10) and len(set(ps)) == 8
    assert all(p.startswith(ps[0][:50]) for p in ps)


def test_report_table_json_and_plot(tmp_path, monkeypatch):
    lv = summarize(1, [RequestSample(ok=True, latency_s=0.5, ttft_s=0.05, output_tokens=8)], 0.5, gpus=1,
                   price_per_gpu_hour=3.5)
    lv.workload_sha256 = "ab" * 32
    r = BenchReport("127.0.0.1:1", "ensemble", True, 8, 1, 1, 3.5, levels=[lv], min_tokens=True, model="tiny-llama",
                    precision="fp8")
    text = format_report(r)
    assert "TTFT p50/p99 ms" in text and "prefix-cache hit ratio: n/a" in text and "acceptance rate: n/a" in text
    assert text.splitlines()[0] == ("workload: 1 request(s) per level, the same at every level (sha256 abababababab); "
                                    "output length --max-tokens 8, min=max (min_tokens sent)")
    data = json.loads(write_json(r, tmp_path / "b.json").read_text())
    assert data["levels"][0]["output_tokens_per_s"] == 16.0
    assert (data["model"], data["precision"], data["triton_model"]) == ("tiny-llama", "fp8", "ensemble")
    assert [f.name for f in tmp_path.iterdir()] == ["b.json"]  # the temporary file is renamed, not left behind
    assert plot_report(r, tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"  # matplotlib: a dev dependency
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(BenchError, match=r"--plot needs matplotlib, which is not installed; pip install -e '\.\[dev\]'"):
        plot_report(r, tmp_path / "c.png")


def test_a_report_on_a_full_disk_leaves_the_old_report_and_no_temporary(tmp_path, monkeypatch):
    import errno
    import pathlib

    from matplotlib.figure import Figure

    r = BenchReport("127.0.0.1:1", "ensemble", True, 8, 1, 1, 3.5, levels=[summarize(1, [RequestSample(
        ok=True, latency_s=0.5, ttft_s=0.05, output_tokens=8)], 0.5, gpus=1, price_per_gpu_hour=3.5)])
    (tmp_path / "b.json").write_text("old report\n")
    (tmp_path / "b.png").write_text("old plot\n")
    real_write_text, real_savefig = pathlib.Path.write_text, Figure.savefig

    def full(path, *args, **kwargs):
        real_write_text(pathlib.Path(path), "{half")  # some bytes reach the disk, then it is full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(pathlib.Path, "write_text", lambda self, *a, **k: full(self))
    with pytest.raises(OSError, match="No space left"):
        write_json(r, tmp_path / "b.json")
    monkeypatch.setattr(pathlib.Path, "write_text", real_write_text)
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **k: full(path))
    with pytest.raises(OSError, match="No space left"):
        plot_report(r, tmp_path / "b.png")
    monkeypatch.setattr(Figure, "savefig", real_savefig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "b.png"]
    assert (tmp_path / "b.json").read_text() == "old report\n" and (tmp_path / "b.png").read_text() == "old plot\n"


@pytest.mark.parametrize("dest, why", [("/dev/full", "is not a regular file"), ("DIR", "is a directory"),
                                       ("DIR/no/b.json", "directory .* does not exist; create it first")])
def test_a_report_destination_is_checked_before_the_run(tmp_path, dest, why):
    from pipeline.serving.bench import check_output_file

    with pytest.raises(BenchError, match=f"--json-file .*{why}"):
        check_output_file("--json-file", dest.replace("DIR", str(tmp_path)))


def test_stream_token_count_from_server_counts():
    from pipeline.serving.token_count import stream_token_count

    assert stream_token_count([1, 1, 1, 1]) == 4  # per-response counts
    assert stream_token_count([1, 2, 3, 4]) == 4  # cumulative counts
    assert stream_token_count([2, 1, 3]) == 6
    assert stream_token_count([5]) == 5
    assert stream_token_count([]) == 0


def _failed_report(errors: int) -> BenchReport:
    samples = [RequestSample(ok=True, latency_s=0.5, output_tokens=8)] + [
        RequestSample(ok=False, error=f"boom {i}") for i in range(errors)]
    lv = summarize(4, samples, 1.0, gpus=1, price_per_gpu_hour=3.5)
    return BenchReport("127.0.0.1:1", "ensemble", True, 8, 8, 1, 3.5, levels=[lv])


def test_failed_requests_raise_exit_code_5_with_one_line():
    from pipeline.serving.bench import RequestsFailed, check_failures

    check_failures(_failed_report(0))
    report = _failed_report(3)
    assert (report.failed, report.sent) == (3, 4) and report.as_dict()["failed"] == 3
    with pytest.raises(RequestsFailed) as info:
        check_failures(report)
    assert info.value.exit_code == 5
    assert str(info.value) == "3 of 4 request(s) failed; first error: boom 0"


def test_invoke_bench_exits_5_when_requests_failed(monkeypatch, capsys):
    import pipeline.serving.bench
    import tasks

    monkeypatch.setattr(pipeline.serving.bench, "bench_spec", lambda spec, **kw: _failed_report(2))
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1")
    assert info.value.code == 5
    out, err = capsys.readouterr()
    assert "conc" in out  # the report is printed first
    assert err.strip().splitlines()[-1] == "error: 2 of 3 request(s) failed; first error: boom 0"
    monkeypatch.setattr(pipeline.serving.bench, "bench_spec", lambda spec, **kw: _failed_report(0))
    tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1")


def test_tokenizer_dir_of_reads_the_config(tmp_path):
    from pipeline.serving.bench import tokenizer_dir_of

    (tmp_path / "preprocessing").mkdir()
    (tmp_path / "preprocessing" / "config.pbtxt").write_text(
        'name: "preprocessing"\nbackend: "python"\nparameters { key: "tokenizer_dir" value { string_value: "tok" } }\n')
    assert tokenizer_dir_of(tmp_path) == str(tmp_path / "preprocessing" / "tok")
    (tmp_path / "preprocessing" / "config.pbtxt").write_text(
        'name: "preprocessing"\nbackend: "python"\nparameters { key: "tokenizer_dir" value { string_value: "/abs" } }\n')
    assert tokenizer_dir_of(tmp_path) == "/abs"
    assert tokenizer_dir_of(tmp_path / "nothing") is None


# ------------------------------------------------------------------------------------------------- real server
@pytest.fixture(scope="module", params=["draft-target", "target-only"])
def served(request, tiny_models, tmp_path_factory):
    """A real tritonserver on the reference repo of tiny-llama: draft-target layout (unary target, draft, BLS)
    or target-only (decoupled target: the ensemble streams)."""
    from pipeline.core.spec import resolve_spec
    from pipeline.serving.serve import TritonServer
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    draft = request.param == "draft-target"
    base = tmp_path_factory.mktemp("bench-server")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(base / "out"))
        mp.setenv("PIPELINE_CACHE", str(base / "cache"))
        spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto" if draft else None, target="reference")
        repo = package_repo(spec, PackageInputs(
            checkpoint=tiny_models["tiny-llama"], build_id=f"bench-{request.param}",
            draft_checkpoint=tiny_models["tiny-llama-draft"] if draft else None)).path
        with TritonServer(repo, ready_timeout_s=300) as server:
            yield draft, repo, server


@pytest.mark.slow
def test_smoke_and_bench_follow_the_layout(served):
    from pipeline.serving.bench import ServerUrls, SweepOptions, WorkloadOptions, check_failures, run_bench
    from pipeline.serving.smoke import smoke_server

    draft, repo, server = served
    said: list[str] = []
    results = smoke_server(server.http_url, server.grpc_url, repo=repo, max_tokens=8, out=said.append)
    routes = [r.route for r in results]
    if draft:
        assert routes == ["http ensemble (greedy)", "grpc ensemble (unary)", "http bls (draft-target)"]
        assert any("no streaming" in line for line in said)
    else:
        assert routes == ["http ensemble (greedy)", "grpc ensemble (stream)"]
        assert results[1].extra["responses"] >= 2
    assert all(r.tokens > 0 and r.text for r in results)
    report = run_bench(ServerUrls(server.grpc_url),
                       WorkloadOptions(concurrency=[1, 2], requests_per_level=2, max_tokens=8),
                       sweep=SweepOptions(warmup=False))
    assert report.triton_model == ("tensorrt_llm_bls" if draft else "ensemble")
    assert report.streaming is (not draft)
    assert report.failed == 0, report.notes
    check_failures(report)
    assert all(lv.output_tokens > 0 for lv in report.levels)


def test_shared_prefix_workload_spreads_the_share_and_keeps_suffixes_distinct():
    from pipeline.serving.bench import is_shared, shared_prefix_prompts

    assert [is_shared(i, 0.5) for i in range(4)] == [False, True, False, True]
    assert not any(is_shared(i, 0.0) for i in range(10)) and all(is_shared(i, 1.0) for i in range(10))
    assert sum(is_shared(i, 0.8) for i in range(20)) == 16
    ps = shared_prefix_prompts(10, 12, 0.5)
    shared = [p for i, p in enumerate(ps) if is_shared(i, 0.5)]
    head = shared[0].split(" Request ")[0]
    assert len(head.split()) == 12 and all(p.startswith(head) for p in shared)
    assert not any(p.startswith(head.split()[0]) for p in ps if p not in shared)  # unique from the first token
    assert len(set(ps)) == 10 and shared_prefix_prompts(10, 12, 0.5) == ps
    salted = shared_prefix_prompts(10, 12, 0.5, run="x-")  # another level: the same shared ones, new cold ones
    assert [p for p in salted if p in shared] == shared and not set(salted) - set(shared) & set(ps)


def test_level_reports_speculated_share_cold_warm_ttft_and_the_low_hit_warning():
    from pipeline.serving.bench import cold_warm_ttft, server_ttft_s

    samples = [RequestSample(ok=True, latency_s=1.0, ttft_s=0.30, output_tokens=4, reused_blocks=0, total_blocks=7,
                             speculated=True),
               RequestSample(ok=True, latency_s=1.0, ttft_s=0.10, output_tokens=4, reused_blocks=6, total_blocks=1,
                             speculated=False),
               RequestSample(ok=True, latency_s=1.0, ttft_s=0.12, output_tokens=4, reused_blocks=6, total_blocks=1)]
    assert cold_warm_ttft(samples) == (pytest.approx(0.30), pytest.approx(0.11))
    lv = summarize(2, samples, 1.0, gpus=1, price_per_gpu_hour=3.5, speculation="off")
    assert (lv.speculation, lv.speculated_share) == ("off", 0.5)
    assert (lv.ttft_ms_cold_p50, lv.ttft_ms_warm_p50) == (300.0, 110.0)
    assert server_ttft_s({"arrival_time_ns": 1_000, "first_token_time_ns": 5_000_001_000}) == pytest.approx(5.0)
    assert server_ttft_s({"first_token_time_ns": 5}) is None
    r = BenchReport("127.0.0.1:1", "ensemble", False, 4, 3, 1, 3.5, levels=[lv], warnings=["hit ratio 10%"],
                    ttft_ms_cold_p50=300.0, ttft_ms_warm_p50=110.0)
    text = format_report(r)
    assert "spec'd %" in text and "50.0%" in text and "warning: hit ratio 10%" in text
    assert "TTFT p50 cold/warm: 300.0/110.0 ms" in text


def test_low_hit_warning_shows_the_ratio_as_the_report_does():
    """59.6 % was printed as "hit ratio 60% is below 60%"."""
    from pipeline.serving.bench import _prefix_cache_ratio

    samples = [RequestSample(ok=True, latency_s=1.0, ttft_s=0.1, output_tokens=4, reused_blocks=596, total_blocks=404)]
    r = BenchReport("127.0.0.1:1", "ensemble", False, 4, 3, 1, 3.5)
    _prefix_cache_ratio(r, samples, None, None)
    assert r.warnings and r.warnings[0].startswith("prefix-cache hit ratio 59.6% is below 60%")


# ------------------------------------------------------------------------------------ clients, caps and limits
class _CountingWorker:
    """Stands in for a gRPC client: counts how many are opened and answers every request at once."""

    opened: list[int] = []

    def __init__(self, *args, **kwargs):
        _CountingWorker.opened.append(1)

    def request(self, prompt, max_tokens, rid):
        return RequestSample(ok=True, latency_s=0.01, ttft_s=0.005, output_tokens=max_tokens)

    def close(self):
        pass


def test_bench_concurrency_3000_requests_2_opens_two_clients(monkeypatch, capsys):
    """The exact input `bench --concurrency 3000 --requests 2`: two clients and threads, not 3000."""
    import threading

    import pipeline.serving.bench as b
    import tasks

    _CountingWorker.opened = []
    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(1) or real_start(self))
    monkeypatch.setattr(b, "_Worker", _CountingWorker)
    monkeypatch.setattr(b, "_served_model", lambda url, model: b._ModelInfo("ensemble", {}, set(), True))
    tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1", concurrency="3000", requests="2")
    out = capsys.readouterr().out
    assert len(_CountingWorker.opened) == 1 + 2  # the warm-up's one client, then min(3000, 2)
    assert len(started) == 1 + 2
    assert "note: concurrency 3000: only 2 request(s) per level" in out


def test_bench_refuses_levels_over_the_cap_with_one_line(capsys):
    import tasks
    from pipeline.serving.bench import MAX_CONCURRENCY, clients_for, parse_levels

    assert parse_levels("1,3000") == [1, 3000] and clients_for(3000, 2) == 2 and clients_for(2, 3000) == 2
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1", concurrency=f"{MAX_CONCURRENCY + 1}")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --concurrency {MAX_CONCURRENCY + 1} exceeds the cap of {MAX_CONCURRENCY} concurrent "
                   f"clients per level (pipeline.serving.bench.MAX_CONCURRENCY); pick levels <= {MAX_CONCURRENCY}"]
    with pytest.raises(BenchError, match="cap of 100000 requests"):
        from pipeline.serving.bench import WorkloadOptions, plan_workload

        plan_workload(WorkloadOptions(concurrency=[1], requests_per_level=100_001))


class _WordTokenizer:
    """One token per word, plus one special token (as the build's tokenizer adds BOS)."""

    def encode(self, text, add_special_tokens=True):
        ids = list(range(len(text.split()) + (1 if add_special_tokens else 0)))
        return type("Encoding", (), {"ids": ids})()

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def test_prompts_over_the_builds_limits_are_refused_before_sending():
    from pipeline.serving.bench import WorkloadOptions, check_prompt_limits, plan_workload

    tok = _WordTokenizer()
    plans = plan_workload(WorkloadOptions(concurrency=[1, 2], requests_per_level=2, max_tokens=8,
                                          shared_prefix_tokens=128), tokenizer=tok, max_input_len=256, max_seq_len=512)
    assert [len(p.texts) for p in plans] == [2, 2]
    assert max(len(tok.encode(t).ids) for p in plans for t in p.texts) < 256
    with pytest.raises(BenchError) as info:
        plan_workload(WorkloadOptions(concurrency=[1], requests_per_level=2, shared_prefix_tokens=250), tokenizer=tok,
                      max_input_len=256)
    msg = str(info.value)
    assert "over its max_input_len 256" in msg and "--shared-prefix-tokens to at most" in msg
    assert "--max-input-len" in msg
    with pytest.raises(BenchError, match=r"\+ --max-tokens 315 exceeds the build's max_seq_len 320; lower "
                                         r"--max-tokens to at most \d+ or build with a larger --max-seq-len"):
        check_prompt_limits(["a b c d e f g h i j"] * 2, tok, max_tokens=315, max_input_len=256, max_seq_len=320)
    with pytest.raises(BenchError, match="--shared-prefix-tokens 300 exceeds the build's max_input_len 256"):
        check_prompt_limits([], None, max_tokens=8, shared_prefix_tokens=300, max_input_len=256)


def test_bench_spec_with_url_and_no_build_refuses_the_prefix_workload_without_a_tokenizer(pipeline_env, capsys):
    import tasks

    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", target="reference", url="127.0.0.1:1",
                         shared_prefix_tokens="128")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shared-prefix-tokens needs the build's tokenizer" in err[0]
    assert "pass --repo" in err[0]


# ------------------------------------------------------------------------------ like with like: --json, bad input
def _fake_server(monkeypatch, inputs=None):
    import pipeline.serving.bench as b

    _CountingWorker.opened = []
    monkeypatch.setattr(b, "_Worker", _CountingWorker)
    monkeypatch.setattr(b, "_served_model", lambda url, model: b._ModelInfo("ensemble", inputs or {}, set(), True))


def test_json_switch_prints_the_report_on_stdout_and_json_file_writes_it(monkeypatch, capsys, tmp_path):
    import tasks
    from pipeline.serving.bench import workload_sha256

    _fake_server(monkeypatch, {"min_tokens": "INT32"})
    out_file = tmp_path / "r.json"
    tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1", concurrency="1,2", requests="3", max_tokens="5",
                     speculation="server", json_=True, json_file=str(out_file))
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout is the JSON document and nothing else
    assert doc == json.loads(out_file.read_text()) and f"json: {out_file}" in err
    assert (doc["model"], doc["precision"], doc["triton_model"], doc["min_tokens"]) == ("tiny-llama", "fp8",
                                                                                        "ensemble", True)
    assert [lv["workload_sha256"] for lv in doc["levels"]] == [workload_sha256(prompts(3), [5] * 3)] * 2


def test_requests_ask_for_min_tokens_where_the_route_takes_it():
    import numpy as np

    from pipeline.serving.bench import _build_inputs, _ModelInfo

    base = {"text_input": "BYTES", "max_tokens": "INT32"}
    info = _ModelInfo("ensemble", base | {"min_tokens": "INT32"}, set(), True)
    sent = {t.name(): t for t in _build_inputs(info, "hi", 7, True)}
    assert info.exact_lengths and np.frombuffer(sent["min_tokens"]._raw_content, np.int32).tolist() == [7]
    info = _ModelInfo("ensemble", base, set(), True)
    assert not info.exact_lengths and "min_tokens" not in {t.name() for t in _build_inputs(info, "hi", 7, True)}


@pytest.mark.parametrize("flags, needle", [
    (dict(request_rate="nan"), "--request-rate='nan': expected a finite number >= 0.001"),
    (dict(request_rate="inf"), "--request-rate='inf': expected a finite number >= 0.001"),
    (dict(request_rate="-1"), "--request-rate=-1.0: must be >= 0.001"),
    (dict(dataset="/nonexistent/p.jsonl"), "--dataset /nonexistent/p.jsonl: no such file"),
    (dict(dataset="/"), "--dataset / is a directory"),
    (dict(json_file="/nonexistent/r.json"), "--json-file /nonexistent/r.json: directory /nonexistent does not exist"),
    (dict(json_file="/"), "--json-file / is a directory"),
    (dict(plot="/nonexistent/b.png"), "--plot /nonexistent/b.png: directory /nonexistent does not exist"),
])
def test_bad_input_is_one_line_exit_2_before_any_server(flags, needle, monkeypatch, capsys):
    import pipeline.serving.bench as b
    import tasks

    monkeypatch.setattr(b, "_served_model", lambda *a: pytest.fail("a server was contacted"))
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1", **flags)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_plot_without_matplotlib_is_exit_2_with_the_install_line(monkeypatch, capsys, tmp_path):
    import sys

    import pipeline.serving.bench as b
    import tasks

    monkeypatch.setattr(b, "_served_model", lambda *a: pytest.fail("a server was contacted"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, model="tiny-llama", url="127.0.0.1:1", plot=str(tmp_path / "b.png"))
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --plot needs matplotlib, which is not installed; pip install -e '.[dev]' (or drop --plot)"]


def test_report_names_the_speculation_mode_and_its_mean_accepted_length(tmp_path):
    lv = summarize(1, [RequestSample(ok=True, latency_s=0.5, ttft_s=0.05, output_tokens=8, draft_tokens=8,
                                     accepted_draft_tokens=2)], 0.5, gpus=1, price_per_gpu_hour=3.5)
    r = BenchReport("127.0.0.1:1", "tensorrt_llm", True, 8, 1, 1, 3.5, levels=[lv], acceptance_rate=0.25,
                    speculation_mode="ngram", draft_len=4)
    assert r.mean_accepted_length == 2.0  # 1 + K x acceptance: the target's token and 4 x 0.25 drafts
    assert "speculation (ngram, K=4) acceptance rate: 25.0%; mean accepted length 2.00 tokens per speculative " \
           "step" in format_report(r)
    data = json.loads(write_json(r, tmp_path / "b.json").read_text())
    assert (data["speculation_mode"], data["draft_len"], data["mean_accepted_length"]) == ("ngram", 4, 2.0)
    plain = BenchReport("127.0.0.1:1", "tensorrt_llm", True, 8, 1, 1, 3.5, levels=[lv])
    assert plain.mean_accepted_length is None and "speculation acceptance rate: n/a" in format_report(plain)


def test_speculation_arms_need_a_route_with_a_per_request_draft_length():
    from pipeline.serving.bench import _ModelInfo, _stream_mode

    llm = _ModelInfo("tensorrt_llm", {"text_input": "BYTES", "sampling_param_max_tokens": "INT32"}, set(), True)
    assert _stream_mode(llm, None, "server", plain_server=False) is True
    with pytest.raises(BenchError, match=r"^--speculation both: the LLM-API model 'tensorrt_llm' takes no "
                                         r"per-request draft length .* drop --url so that bench starts both builds'"):
        _stream_mode(llm, None, "both", plain_server=False)
    assert _stream_mode(llm, None, "both", plain_server=True) is True  # the off arm is the plain build's server
    ensemble = _ModelInfo("ensemble", {"text_input": "BYTES", "max_tokens": "INT32"}, set(), True)
    with pytest.raises(BenchError, match=r"has no num_draft_tokens input; benchmark tensorrt_llm_bls"):
        _stream_mode(ensemble, None, "off", plain_server=False)


def test_the_arm_without_speculation_of_an_llmapi_build_is_the_plain_build(tmp_path, monkeypatch):
    from pipeline.core.spec import resolve_spec
    from pipeline.serving.bench import ServerUrls, WorkloadOptions, _plain_repo

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    spec = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch", target="reference",
                        speculative_decoding="ngram")
    assert _plain_repo(spec, WorkloadOptions(speculation="server"), None) is None
    assert _plain_repo(spec, WorkloadOptions(speculation="both"), ServerUrls("127.0.0.1:1")) is None  # run_bench says
    with pytest.raises(BenchError, match=r"^--speculation off on a ngram LLM-API build compares it with the same "
                                         r"target built without speculation, which is not built here .*; build it: "
                                         r"invoke build --model tiny-llama --precision fp8 --runtime pytorch "
                                         r"--target reference$"):
        _plain_repo(spec, WorkloadOptions(speculation="off"), None)
