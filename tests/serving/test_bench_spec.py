"""`invoke bench --spec-flags --url` against a real tritonserver serving the tiny reference build, without --repo:
bench locates the build (check-only) for its tokenizer and limits, so a 128-token shared prefix stays within
max_input_len 256; a prefix the build rejects is refused before anything is sent; --concurrency 3000 with 2
requests finishes with 2 clients."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
FLAGS = dict(model="tiny-llama", precision="fp8", target="reference", calib_size="4", calib_seq_len="32")


@pytest.fixture(scope="module")
def served_build(tiny_models, tmp_path_factory):
    from pipeline.core.spec import resolve_spec
    from pipeline.serving.serve import TritonServer
    from pipeline.stages.build import build

    base = tmp_path_factory.mktemp("bench-spec")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(base / "out"))
        mp.setenv("PIPELINE_CACHE", str(base / "cache"))
        (base / "cache" / "generated").mkdir(parents=True)
        for path in tiny_models.values():
            (base / "cache" / "generated" / path.name).symlink_to(path, target_is_directory=True)
        spec = resolve_spec(**FLAGS)
        report = build(spec, progress=None)
        with TritonServer(report.outputs.triton_repo.path, ready_timeout_s=300) as server:
            yield spec, server


def test_bench_with_url_uses_the_builds_tokenizer_and_limits(served_build, capsys):
    import tasks

    spec, server = served_build
    assert spec.max_input_len == 256
    tasks.bench.body(None, url=server.grpc_url, shared_prefix_tokens="128", concurrency="1,2", requests="4",
                     max_tokens="4", **FLAGS)
    out = capsys.readouterr().out
    assert "shared prefix 128 tokens on 100% of requests" in out and "failed" not in out

    with pytest.raises(SystemExit) as info:
        tasks.bench.body(None, url=server.grpc_url, shared_prefix_tokens="250", requests="2", **FLAGS)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over its max_input_len 256" in err[0] and "--max-input-len" in err[0], err


def test_bench_concurrency_3000_with_2_requests_finishes(served_build, capsys):
    import time

    import tasks

    _, server = served_build
    t0 = time.monotonic()
    tasks.bench.body(None, url=server.grpc_url, concurrency="3000", requests="2", max_tokens="4", **FLAGS)
    out = capsys.readouterr().out
    assert "note: concurrency 3000: only 2 request(s) per level" in out
    assert time.monotonic() - t0 < 120  # 3000 clients took > 200 s
