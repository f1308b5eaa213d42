"""Bounded servers: oversized bodies, out-of-range sampling values and cancel storms against a real tritonserver
(CPU, the reference repository with a streaming target beside the draft). Every bad request gets one error response
and the server stays ready and keeps answering; a killed stub makes the server report not ready."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pipeline.serving.serve import SERVER_STACK_BYTES, ServerCommand, spawn

PROMPT = "The quick brown fox"
BYTES_PER_TOKEN = 32  # the templates' bound


def test_spawned_servers_get_a_stack_large_enough_for_big_bodies(tmp_path):
    import resource

    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    want = SERVER_STACK_BYTES if hard == resource.RLIM_INFINITY else min(hard, SERVER_STACK_BYTES)
    with open(tmp_path / "log", "wb") as log:
        proc = spawn(ServerCommand(["sh", "-c", "ulimit -s"], dict(os.environ), "cpu-pytriton"), log)
        assert proc.wait(timeout=30) == 0
    shown = (tmp_path / "log").read_text().strip()
    assert shown == "unlimited" or int(shown) * 1024 >= want


# ------------------------------------------------------------------------------------------------ server
@pytest.fixture(scope="module")
def served(tiny_reference_repo):
    from pipeline.serving.serve import TritonServer

    repo = tiny_reference_repo("bounded", decoupled=True)
    srv = TritonServer(repo, ready_timeout_s=300)
    srv.start()
    params = (repo / "preprocessing" / "config.pbtxt").read_text()
    max_input_len = int(params.split('key: "max_input_len"')[1].split('"')[1])
    yield srv, max_input_len
    srv.stop()


def _generate(srv, model: str, timeout: float = 60, **payload):
    req = urllib.request.Request(f"http://{srv.http_url}/v2/models/{model}/generate",
                                 data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _greedy(srv, model: str = "ensemble") -> str:
    status, body = _generate(srv, model, text_input=PROMPT, max_tokens=6, top_k=1, exclude_input_in_output=True)
    assert status == 200 and "error" not in body, body
    return body["text_output"][0] if isinstance(body["text_output"], list) else body["text_output"]


def _all_ready(srv) -> bool:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        models = [m["name"] for m in client.get_model_repository_index()]
        return client.is_server_ready() and all(client.is_model_ready(m) for m in models)
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("size", [10_000_000, 100_000_000])
def test_huge_body_gets_an_error_naming_the_byte_limit(served, model, size):
    srv, max_input_len = served
    expected = _greedy(srv, model)
    status, body = _generate(srv, model, timeout=120, text_input="fox " * (size // 4), max_tokens=4)
    cap = max_input_len * BYTES_PER_TOKEN
    assert status == 400, body
    assert f"is {size} bytes, over the limit of {cap} bytes" in body["error"], body
    assert _all_ready(srv)
    assert _greedy(srv, model) == expected


@pytest.mark.slow
def test_huge_stop_words_are_refused_before_tokenizing(served):
    srv, max_input_len = served
    status, body = _generate(srv, "ensemble", text_input=PROMPT, max_tokens=4,
                             stop_words=["fox " * (max_input_len * BYTES_PER_TOKEN // 4 + 1)])
    assert status == 400 and "stop_words of batch row 0 is" in body["error"], body


# What each out-of-range value is called in the error (the tensorrt_llm model's input names).
BAD_SAMPLING = [
    ("temperature", -0.5, "temperature must be >= 0"),
    ("top_p", 7.0, "runtime_top_p must be in (0, 1]"),
    ("top_k", -1, "runtime_top_k must be >= 0"),
    ("beam_width", 0, "beam_width must be >= 1"),
    ("beam_width", 2, "beam_width 2 is not supported"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
    ("length_penalty", -1.0, "len_penalty must be >= 0"),
    ("num_return_sequences", 0, "num_return_sequences must be >= 1"),
    ("min_tokens", -1, "min_tokens must be >= 0"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize(("name", "value", "message"), BAD_SAMPLING, ids=[f"{n}={v}" for n, v, _ in BAD_SAMPLING])
def test_out_of_range_sampling_value_gets_one_error(served, model, name, value, message):
    srv, _ = served
    extra = {"num_draft_tokens": 0} if model == "tensorrt_llm_bls" else {}
    status, body = _generate(srv, model, text_input=PROMPT, max_tokens=4, **{name: value}, **extra)
    assert status == 400 and message in body.get("error", ""), body


# Requests whose work or memory a field multiplies, or whose float sampling value is not finite: field values ->
# what the error says (request_limits.py). NaN and inf travel as JSON's NaN / Infinity literals.
HOSTILE = [
    ({"num_return_sequences": 100_000}, "num_return_sequences 100000 is over"),
    ({"beam_width": 100_000}, "beam_width 100000 is not supported"),
    ({"max_tokens": 1_000_000}, ("request_output_len", "1000000", "512")),  # the tiny build's max_seq_len
    ({"embedding_bias_words": ["fox"], "embedding_bias_weights": [float("nan")]},
     "embedding_bias_weights must be finite"),
    ({"embedding_bias_words": ["fox"], "embedding_bias_weights": [float("inf")]},
     "embedding_bias_weights must be finite"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be finite"),
    ({"temperature": float("inf")}, "temperature must be finite"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_hostile_requests_are_refused_at_once_and_the_next_request_answers(served, model):
    srv, max_input_len = served
    extra = {"num_draft_tokens": 0} if model == "tensorrt_llm_bls" else {}
    hostile = HOSTILE + [({"stop_words": ["fox"] * (max_input_len + 1)}, "stop_words holds")]
    expected = _greedy(srv, model)
    for fields, message in hostile:
        start = time.monotonic()
        status, body = _generate(srv, model, timeout=30, **{"text_input": PROMPT, "max_tokens": 4, **fields, **extra})
        refused_s = time.monotonic() - start
        parts = (message,) if isinstance(message, str) else message
        assert status == 400 and all(p in body.get("error", "") for p in parts), (fields, status, body)
        start = time.monotonic()
        assert _greedy(srv, model) == expected
        assert time.monotonic() - start < 5, fields
        assert refused_s < 5, (fields, refused_s)
    assert _all_ready(srv)


# ------------------------------------------------------------------------------------------------ cancel storm
def _cancelled_stream(srv, max_tokens: int) -> int:
    """Start one streaming ensemble request, cancel it after its first response; returns responses seen."""
    import tritonclient.grpc as grpcclient

    first = threading.Event()
    seen = []

    def callback(result=None, error=None):
        seen.append(error is None)
        first.set()

    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inputs = []
    for name, arr, dtype in (("text_input", np.array([[PROMPT.encode()]], dtype=object), "BYTES"),
                             ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
                             ("stream", np.array([[True]]), "BOOL")):
        inputs.append(grpcclient.InferInput(name, list(arr.shape), dtype))
        inputs[-1].set_data_from_numpy(arr)
    try:
        client.start_stream(callback=callback)
        client.async_stream_infer("ensemble", inputs)
        first.wait(timeout=60)
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    return len(seen)


@pytest.mark.slow
def test_cancel_storm_leaves_every_model_ready_and_answering(served):
    srv, _ = served
    expected = _greedy(srv)
    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(lambda _: _cancelled_stream(srv, 200), range(48)))
    assert all(n >= 1 for n in seen)
    assert srv._proc.poll() is None, srv.log_tail(20)
    assert _all_ready(srv)
    assert _greedy(srv) == expected


@pytest.mark.slow
def test_a_killed_stub_makes_the_server_not_ready(served):
    """Last in the module: it kills the target's stub. tritonserver itself keeps the model READY and answers every
    request with "Stub process ... is not healthy"; TritonServer.is_ready() (and `invoke serve`) report it."""
    srv, _ = served
    stubs = srv.stub_instances()
    assert {"preprocessing_0_0", "tensorrt_llm_0_0", "tensorrt_llm_draft_0_0"} <= set(stubs.values()), stubs
    assert srv.dead_stubs() == [] and srv.is_ready()
    os.kill(next(pid for pid, name in stubs.items() if name == "tensorrt_llm_0_0"), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while srv.dead_stubs() != ["tensorrt_llm_0_0"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert srv.dead_stubs() == ["tensorrt_llm_0_0"]
    assert not srv.is_ready()
    try:
        status, body = _generate(srv, "ensemble", text_input=PROMPT, max_tokens=4)
    except http.client.RemoteDisconnected:  # on a loaded host tritonserver may drop the request with no reply
        return  # not served either, which is what the readiness above has to warn of
    assert status != 200 and "not healthy" in body.get("error", ""), body  # what tritonserver alone would serve
