"""N-gram (prompt lookup) speculation on the reference `llmapi` repository: the NGram `speculative_config` served by
a real tritonserver, greedy output identical to the target's own, acceptance measured; and the pool's lookups."""

from __future__ import annotations

import pytest

from pipeline.core.spec import resolve_spec
from pipeline.serving.serve import TritonServer
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import llm_api_options
from pipeline.stages.package.llmapi_package import package_llmapi_repo
from tests.stages.package.test_llmapi_reference import generate, local_greedy
from tests.support.llmapi_fixtures import fabricated_fp8_export, hf_reference_module

REPEATING = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"


def _reference_module():
    return hf_reference_module("hf_reference_ngram")


class _Seq:
    def __init__(self, tokens):
        self.tokens = list(tokens)


def test_the_pool_proposes_what_followed_the_longest_matching_run():
    pool = _reference_module().NGramPool(k=4, n=2)
    seq = _Seq([1, 2, 3, 4, 5, 1, 2])
    assert pool.propose(seq, limit=10) == [3, 4, 5, 1]  # after (1, 2): the oldest continuation
    assert pool.propose(seq, limit=2) == [3, 4]
    seq.tokens += [9]
    assert pool.propose(seq, limit=10) == []  # (2, 9) and (9,) never seen
    other = _Seq([7, 1, 2])  # one pool for all requests (upstream's is_public_pool default)
    assert pool.propose(other, limit=10) == [3, 4, 5, 1]
    pool.forget(seq)
    assert id(seq) not in pool.indexed


def test_the_pool_is_bounded():
    module = _reference_module()
    pool = module.NGramPool(k=2, n=3)
    pool.MAX_RUNS = 50
    pool.propose(_Seq(range(1000)), limit=2)
    assert len(pool.follow) == 50 and (998,) in pool.follow  # the newest runs stay


@pytest.fixture(scope="module")
def ngram_server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("ngram")
    target = fabricated_fp8_export(tiny_models["tiny-llama"], root / "t" / "hf_checkpoint")
    spec = resolve_spec(model="tiny-llama", precision="fp8", speculative_decoding="ngram", draft_len=4,
                        max_matching_ngram_size=3, target="reference", runtime="pytorch")
    repo = package_llmapi_repo(spec, PackageInputs(checkpoint=target, output=root / "repos"),
                               options=llm_api_options(spec, draft_dir=None)).path
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", str(root / "cache"))
        srv = TritonServer(repo, ready_timeout_s=300)
        srv.start()
    yield srv, target, repo
    srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [REPEATING, "Once upon a time"])
def test_ngram_greedy_output_is_the_targets_own(ngram_server, prompt):
    srv, target, _ = ngram_server
    r = generate(srv, prompt, sampling_param_max_tokens=16, sampling_param_return_perf_metrics=True)
    assert r["text_output"] == local_greedy(target, prompt, 16)
    assert 0 <= r["total_accepted_draft_tokens"] <= r["total_draft_tokens"]


@pytest.mark.slow
def test_ngram_drafts_are_accepted_on_repeating_text(ngram_server):
    srv, _, repo = ngram_server
    r = generate(srv, REPEATING, sampling_param_max_tokens=16, sampling_param_return_perf_metrics=True)
    assert r["total_draft_tokens"] > 0 and r["total_accepted_draft_tokens"] > 0, r
    assert r["acceptance_rate"] == pytest.approx(r["total_accepted_draft_tokens"] / r["total_draft_tokens"])
    from pipeline.core.manifests import RepoManifest

    manifest = RepoManifest.model_validate_json((repo / "manifest.json").read_text())
    assert manifest.speculation.model_dump() == {"mode": "ngram", "draft": None, "num_draft_tokens": 4}


@pytest.mark.slow
def test_bench_both_arms_on_an_llmapi_build_replay_the_same_requests_on_the_plain_build(ngram_server, tmp_path):
    """`--speculation both` on an LLM-API build: the off arm goes to the same target built without speculation, on
    the same requests; acceptance and the share that speculated come from the speculative arm alone."""
    from pipeline.serving.bench import ServerUrls, WorkloadOptions, format_report, run_bench

    srv, target, repo = ngram_server
    plain_spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference", runtime="pytorch")
    plain_repo = package_llmapi_repo(plain_spec, PackageInputs(checkpoint=target, output=tmp_path / "repos"),
                                     options=llm_api_options(plain_spec, draft_dir=None)).path
    with TritonServer(plain_repo, ready_timeout_s=300) as plain:
        report = run_bench(ServerUrls(srv.grpc_url), WorkloadOptions(concurrency=[1], requests_per_level=2,
                                                                     max_tokens=24, speculation="both"),
                           plain_server=ServerUrls(plain.grpc_url))
    arms = {lv.speculation: lv for lv in report.levels}
    assert set(arms) == {"server", "off"} and report.failed == 0
    assert arms["server"].workload_sha256 == arms["off"].workload_sha256
    assert arms["off"].speculated_share in (None, 0.0) and report.speculated_share > 0
    assert set(report.speedup) == {1} and report.speedup[1] > 0
    assert "speculation over none on the same requests, output tok/s: x" in format_report(report)
