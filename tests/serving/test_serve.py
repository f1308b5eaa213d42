"""A real tritonserver (the nvidia-pytriton bundle) on CPU serving the reference repository of tiny-llama fp8 with
the tiny-llama-draft: ensemble over HTTP and gRPC streaming, BLS draft-target == target-only greedy, smoke, and
clean shutdown. One server for the module; two tiny extra servers check start/stop/failure handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.errors import ServeError

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def ref_repo(tiny_models, tmp_path_factory):
    """`package --target reference` for tiny-llama fp8 + tiny-llama-draft, serving the generated HF-format models,
    with a streaming (decoupled) target beside the draft (`serving.decoupled=True`; the default draft-target layout is
    all-unary, tested in tests/stages/package/test_routes.py).

    The reference backend serves an exported TensorRT-LLM checkpoint (via pipeline.stages.calibrate.checkpoint) or an HF-format
    model dir; the HF dirs keep this module independent of the calibrate stage (the build's end-to-end test serves
    the calibrated FP8 checkpoints through the same backend).
    """
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    base = tmp_path_factory.mktemp("serve")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(base / "out"))
        mp.setenv("PIPELINE_CACHE", str(base / "cache"))
        spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference", decoupled=True)
        res = package_repo(spec, PackageInputs(checkpoint=tiny_models["tiny-llama"],
                                               draft_checkpoint=tiny_models["tiny-llama-draft"],
                                               build_id="tiny-llama-fp8-test"))
        assert res.path.name == "tiny-llama-fp8-test-reference"
        yield res.path


@pytest.fixture(scope="module")
def server(ref_repo):
    from pipeline.serving.serve import TritonServer

    srv = TritonServer(ref_repo, ready_timeout_s=300)
    srv.start()
    proc = srv._proc
    yield srv
    srv.stop()
    assert proc.poll() is not None, "tritonserver still running after stop()"
    assert srv.shm_regions() == [], "shared-memory regions left in /dev/shm"


def generate(server, model, **payload):
    from pipeline.serving.smoke import http_generate

    return http_generate(server.http_url, model,
                         {"text_input": PROMPT, "stream": False, "exclude_input_in_output": True, **payload})


def test_ensemble_answers_over_http(server):
    first = generate(server, "ensemble", max_tokens=16, top_k=1)
    again = generate(server, "ensemble", max_tokens=16, top_k=1)
    assert first["text_output"].strip()
    assert first["text_output"] == again["text_output"]  # greedy is deterministic


def test_grpc_streaming_yields_tokens_incrementally(server):
    from pipeline.serving.smoke import grpc_stream

    greedy = generate(server, "ensemble", max_tokens=12, top_k=1)["text_output"]
    chunks, ttft, total, _ = grpc_stream(server.grpc_url, "ensemble", PROMPT, 12)
    assert len(chunks) >= 6, chunks  # one response per token (a byte-level BPE may merge a few when decoding)
    assert "".join(chunks) == greedy
    assert ttft < total


def test_max_tokens_bounds_the_stream(server):
    from pipeline.serving.smoke import grpc_stream

    chunks, _, _, _ = grpc_stream(server.grpc_url, "ensemble", PROMPT, 3)
    assert len(chunks) == 3


def test_bls_draft_target_is_identical_to_target_greedy(server):
    greedy = generate(server, "ensemble", max_tokens=24, top_k=1)["text_output"]
    spec = generate(server, "tensorrt_llm_bls", max_tokens=24, num_draft_tokens=4)
    assert spec["text_output"] == greedy
    assert spec["total_draft_tokens"] > 0
    assert 0 <= spec["total_accepted_draft_tokens"] <= spec["total_draft_tokens"]
    assert spec["acceptance_rate"] == pytest.approx(spec["total_accepted_draft_tokens"] / spec["total_draft_tokens"])
    plain = generate(server, "tensorrt_llm_bls", max_tokens=24, num_draft_tokens=0)
    assert plain["text_output"] == greedy and plain["total_draft_tokens"] == 0


def test_bls_refuses_streaming(server):
    with pytest.raises(ServeError, match="streaming is not supported on the draft-target route"):
        generate(server, "tensorrt_llm_bls", max_tokens=4, stream=True)


def test_seeded_sampling_is_reproducible(server):
    a = generate(server, "ensemble", max_tokens=16, top_k=50, top_p=0.95, temperature=1.5, seed=7)
    b = generate(server, "ensemble", max_tokens=16, top_k=50, top_p=0.95, temperature=1.5, seed=7)
    assert a["text_output"] and a["text_output"] == b["text_output"]


def test_perf_metrics_outputs(server):
    res = generate(server, "ensemble", max_tokens=4, return_perf_metrics=True)
    assert res["kv_cache_alloc_total_blocks"] >= 1 and res["kv_cache_reused_blocks"] == 0
    assert res["first_token_time_ns"] >= res["arrival_time_ns"]


def test_smoke_against_running_server(server, ref_repo, capsys):
    from pipeline.serving.smoke import run_smoke

    results = run_smoke(ref_repo, http_url=server.http_url, grpc_url=server.grpc_url, max_tokens=16)
    assert [r.route for r in results] == ["http ensemble (greedy)", "grpc ensemble (stream)",
                                          "http bls (draft-target)"]
    assert 0.0 <= results[-1].acceptance_rate <= 1.0
    assert "draft-target output == target-only greedy output" in capsys.readouterr().out


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


def test_invoke_smoke_on_running_server(server):
    done = _invoke("smoke", "--http-url", server.http_url, "--grpc-url", server.grpc_url, "--max-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert "ok: smoke passed (3 routes)" in done.stdout


def test_invoke_smoke_fails_without_server():
    done = _invoke("smoke", "--http-url", "127.0.0.1:9", "--grpc-url", "127.0.0.1:9")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")


# ------------------------------------------------------------------------------------------------ lifecycle
def _python_model_repo(root: Path, body: str) -> Path:
    model = root / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
    )
    (model / "1" / "model.py").write_text(body)
    return root


ECHO = """
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def test_server_starts_answers_and_stops_without_leftovers(tmp_path, monkeypatch):
    import urllib.request

    from pipeline.serving.serve import TritonServer

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    repo = _python_model_repo(tmp_path / "repo", ECHO)
    with TritonServer(repo, validate=False, ready_timeout_s=120) as srv:
        assert srv.http_url.startswith("127.0.0.1:") and srv.grpc_url.startswith("127.0.0.1:")
        assert srv.shm_regions(), "the python backend should hold a region while running"
        assert srv.command.plan.mode == "cpu-reference" and srv.command.argv == list(srv.command.plan.ranks[0])
        body = json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"http://{srv.http_url}/v2/models/echo/infer",
                                                           data=body), timeout=30) as r:
            assert json.loads(r.read())["outputs"][0]["data"] == [1.0, 2.0]
        pid = srv.pid
    assert srv.shm_regions() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert srv.log_file.is_file() and srv.log_file.stat().st_size > 0


def test_model_that_fails_to_load_raises_and_cleans_up(tmp_path, monkeypatch):
    from pipeline.serving.serve import TritonServer

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    repo = _python_model_repo(tmp_path / "repo", "class TritonPythonModel:\n    def initialize(self, args):\n"
                                                 "        raise RuntimeError('broken on purpose')\n")
    srv = TritonServer(repo, validate=False, ready_timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(ServeError, match="tritonserver exited"):
        srv.start()
    assert time.monotonic() - t0 < 120
    assert srv._proc is None and srv.shm_regions() == []
