"""bench's shared-prefix workload on a real tritonserver with the tiny draft-target reference
repo: a shared prefix gives a hit ratio above 0.5 and a warm TTFT below the cold one; distinct prefixes give ~0 and
the low-hit warning; the BLS reports which requests speculated, with and without speculation."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
PREFIX = 192  # 6 blocks of the tiny build's 32 tokens; + suffix stays within max_input_len 256


@pytest.fixture(scope="module")
def served(tiny_reference_repo):
    from pipeline.serving.serve import TritonServer

    repo = tiny_reference_repo("bench-prefix")
    with TritonServer(repo, ready_timeout_s=300) as server:
        yield repo, server


def bench(repo, server, model, **workload):
    from pipeline.serving.bench import (ServerUrls, SweepOptions, WorkloadOptions, format_report, run_bench,
                                        tokenizer_dir_of)

    report = run_bench(ServerUrls(server.grpc_url, server.metrics_url), WorkloadOptions(max_tokens=4, **workload),
                       sweep=SweepOptions(model=model), tokenizer_dir=tokenizer_dir_of(repo))
    print("\n" + format_report(report))
    assert report.failed == 0, report.notes
    return report


def test_shared_prefix_hits_and_warm_ttft_is_lower(served):
    repo, server = served
    shared = bench(repo, server, model="ensemble", concurrency=[1, 2], requests_per_level=8,
                   shared_prefix_tokens=PREFIX, shared_prefix_share=0.9)
    assert shared.prefix_cache_source == "per-request outputs"
    assert shared.prefix_cache_hit_ratio > 0.5  # 6 of a prompt's 7-8 blocks on 90 % of the requests, less the first
    assert all(lv.ttft_ms_p50 is not None and lv.prefix_cache_hit_ratio is not None for lv in shared.levels)
    assert shared.ttft_ms_warm_p50 < shared.ttft_ms_cold_p50  # cold: a new prefix of the same length
    distinct = bench(repo, server, model="ensemble", concurrency=[1, 2], requests_per_level=4,
                     shared_prefix_tokens=PREFIX, shared_prefix_share=0.0)
    assert distinct.prefix_cache_hit_ratio < 0.05
    assert distinct.warnings and "below 60%" in distinct.warnings[0]


def test_bls_reports_speculation_with_and_without(served, tmp_path):
    from pipeline.serving.bench import plot_report, write_json

    repo, server = served
    r = bench(repo, server, model="tensorrt_llm_bls", concurrency=[1], requests_per_level=2, speculation="both",
              shared_prefix_tokens=64)
    by_mode = {lv.speculation: lv for lv in r.levels}
    assert by_mode["server"].speculated_share == 1.0  # one request in flight <= the cap of 8
    assert by_mode["off"].speculated_share == 0.0
    # run-wide: the share of the speculative arm (the off arm never speculates by construction)
    assert by_mode["server"].acceptance_rate is not None and r.speculated_share == 1.0
    assert all(lv.ttft_ms_p50 is not None for lv in r.levels)  # the server's timestamps (non-streaming)
    assert write_json(r, tmp_path / "b.json").is_file()
    assert plot_report(r, tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_sharegpt_array_with_both_arms_replays_one_workload_at_the_datasets_lengths(served, tmp_path, capsys,
                                                                                      monkeypatch):
    """`invoke bench --dataset sharegpt.json --concurrency 1,2 --speculation both --json` on the BLS: one JSON
    document on stdout; every level and arm has the same workload_sha256; every request gets its reply's length."""
    import json

    import tasks
    from pipeline.serving.bench import tokenizer_dir_of
    from pipeline.serving.token_count import load_tokenizer

    repo, server = served
    replies = ["The sea is large and deep.", "Blue.", "A cat sat on the warm mat by the door."]
    convs = [{"conversations": [{"from": "human", "value": f"Question {i}: tell me more."},
                                {"from": "gpt", "value": reply}]} for i, reply in enumerate(replies)]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs, indent=1))  # one JSON array, as ShareGPT is published
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    capsys.readouterr()
    tasks.bench.body(None, model="tiny-llama", precision="fp8", target="reference", draft="auto",
                     url=server.grpc_url, repo=str(repo), model_name="tensorrt_llm_bls", dataset=str(data),
                     concurrency="1,2", requests="3", speculation="both", json_=True)
    report = json.loads(capsys.readouterr().out)  # stdout holds exactly one JSON document
    assert report["failed"] == 0 and len(report["levels"]) == 4
    assert {(lv["concurrency"], lv["speculation"]) for lv in report["levels"]} == {
        (c, s) for c in (1, 2) for s in ("server", "off")}
    assert len({lv["workload_sha256"] for lv in report["levels"]}) == 1
    tok = load_tokenizer(tokenizer_dir_of(repo))
    asked = [len(tok.encode(r, add_special_tokens=False).ids) for r in replies]
    assert all(lv["output_tokens"] == sum(asked) for lv in report["levels"])
