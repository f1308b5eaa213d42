"""`invoke build --runtime pytorch --target reference --speculative-decoding eagle3 --draft tiny-llama-eagle3` end to
end: the generated head downloaded (not calibrated) and carried into the llmapi repository, served by a real
tritonserver, `invoke smoke` passing, greedy text the target's own with the head's drafts accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.manifests import RepoManifest
from pipeline.core.spec import resolve_spec
from pipeline.serving.serve import TritonServer
from pipeline.stages.build import build
from pipeline.stages.package import llmapi_yaml
from tests.stages.package.test_llmapi_reference import generate, local_greedy

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def eagle3_build(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3-build")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(root / "out"))
        mp.setenv("PIPELINE_CACHE", str(tiny_models["tiny-llama"].parents[1]))  # the session's generated models
        spec = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch", target="reference",
                            speculative_decoding="eagle3", draft="tiny-llama-eagle3")
        lines: list[str] = []
        report = build(spec, progress=lines.append)
        again = build(spec, progress=None)
        repo = Path(report.outputs.triton_repo.path)
        srv = TritonServer(repo, ready_timeout_s=300)
        srv.start()
        yield report, again, lines, srv  # the output tree stays set for the tests (release)
        srv.stop()


@pytest.mark.slow
def test_the_head_is_served_as_downloaded(eagle3_build):
    report, again, lines, _ = eagle3_build
    out = report.outputs
    assert out.draft_download is not None and out.draft_checkpoint is None  # fetched, never calibrated
    assert any("EAGLE-3 head tiny-llama-eagle3 served as downloaded" in line for line in lines), lines
    repo = Path(out.triton_repo.path)
    data = llmapi_yaml.read(repo / llmapi_yaml.MODEL_YAML)
    assert data["speculative_config"]["decoding_type"] == "Eagle"
    carried = (repo / llmapi_yaml.MODEL_YAML).parent / data["speculative_config"]["speculative_model_dir"]
    assert {p.name for p in carried.iterdir()} == set(out.draft_download.manifest.files) - {"manifest.json"}
    m = RepoManifest.model_validate_json((repo / "manifest.json").read_text())
    assert m.speculation.model_dump() == {"mode": "eagle3", "draft": "tiny-llama-eagle3", "num_draft_tokens": 4}
    assert again.noop  # a re-run reads manifests only


@pytest.mark.slow
def test_smoke_and_greedy_output_with_drafts_accepted(eagle3_build):
    from pipeline.serving.smoke import smoke_server

    report, _, _, srv = eagle3_build
    results = smoke_server(srv.http_url, srv.grpc_url, prompt="Once upon a time", max_tokens=8, out=print)
    assert results and all(r.text for r in results)
    r = generate(srv, PROMPT, sampling_param_max_tokens=16, sampling_param_return_perf_metrics=True)
    assert r["text_output"] == local_greedy(report.outputs.checkpoint.path, PROMPT, 16)
    assert r["total_draft_tokens"] > 0 and r["total_accepted_draft_tokens"] > 0, r
    print(json.dumps({k: r[k] for k in ("total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate")}))


@pytest.mark.slow
def test_the_release_carries_the_head_and_verifies(eagle3_build, tmp_path):
    import tarfile

    from pipeline.ops.release import release
    from pipeline.ops.release_verify import verify

    report, *_ = eagle3_build
    res = release(report.spec, output=tmp_path)
    names = tarfile.open(res.tarball).getnames()
    head_files = set(report.outputs.draft_download.manifest.files) - {"manifest.json"}
    assert {n.rsplit("/", 1)[-1] for n in names if "/tensorrt_llm/1/eagle3_head/" in n} == head_files
    assert res.document["revisions"]["draft"]["repo_id"] == "local/tiny-llama-eagle3"
    assert verify(res.tarball, check_host=False).ok
