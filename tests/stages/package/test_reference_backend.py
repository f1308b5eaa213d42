"""The reference `tensorrt_llm` model (Triton Python backend on CPU) against the tensorrtllm backend's contract, on a
real tritonserver: every optional input it honours, with its semantics; clear errors for what it cannot honour and
for requests beyond the build's limits; `stop` and client cancellation; no head-of-line blocking; concurrency.

One server for the module, serving tiny-llama (target, decoupled) and tiny-llama-draft (`tensorrt_llm_draft`,
non-decoupled), so both transaction policies are exercised through the same model code. Decoupled calls use gRPC
streams, non-decoupled calls HTTP."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.slow

DECOUPLED = "tensorrt_llm"
UNARY = "tensorrt_llm_draft"
PROMPT = "The quick brown fox"
_TYPES = {
    "seed": np.uint64, "lora_task_id": np.uint64,
    "temperature": np.float32, "runtime_top_p": np.float32, "repetition_penalty": np.float32,
    "presence_penalty": np.float32, "frequency_penalty": np.float32, "len_penalty": np.float32,
}
_BOOLS = ("return_log_probs", "return_context_logits", "return_generation_logits", "return_perf_metrics",
          "return_num_input_tokens", "return_num_output_tokens", "exclude_input_in_output", "stop", "streaming")


@pytest.fixture(scope="module")
def repo(tiny_models, tmp_path_factory):
    """`package --target reference` of tiny-llama fp8 + draft with a decoupled target (HF-format model dirs)."""
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    base = tmp_path_factory.mktemp("refbackend")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(base / "out"))
        mp.setenv("PIPELINE_CACHE", str(base / "cache"))
        spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference", decoupled=True)
        res = package_repo(spec, PackageInputs(checkpoint=tiny_models["tiny-llama"],
                                               draft_checkpoint=tiny_models["tiny-llama-draft"],
                                               build_id="tiny-llama-refbackend"))
        yield res.path


@pytest.fixture(scope="module")
def server(repo):
    from pipeline.serving.serve import TritonServer

    srv = TritonServer(repo, ready_timeout_s=300)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def prompt(tiny_models) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models["tiny-llama"]).encode(PROMPT, add_special_tokens=False)


def _limits(repo, model):
    """(max_input_len, max_seq_len) the model enforces: its reference parameters, else its position limit."""
    import json

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = text_format.Parse((repo / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    seq = int(params.get("max_seq_len") or 0)
    if not seq:
        path = (repo / model / params["gpt_model_path"]).resolve()
        seq = int(json.loads((path / "config.json").read_text())["max_position_embeddings"])
    return int(params.get("max_input_len") or 0) or seq - 1, seq


# ------------------------------------------------------------------------------------------------ client helpers
def tensors(prompt, out_len, **extra) -> dict[str, np.ndarray]:
    """Request tensors (batch 1) for the tensorrt_llm contract; scalars become [1, 1] of the contract's type."""
    out = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
           "request_output_len": np.array([[out_len]], np.int32)}
    for name, value in extra.items():
        if isinstance(value, np.ndarray):
            out[name] = value
        else:
            dtype = bool if name in _BOOLS else _TYPES.get(name, np.int32)
            out[name] = np.array([[value]], dtype=dtype)
    return {k: v for k, v in out.items() if v is not None}


def _infer_inputs(module, data):
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, arr in data.items():
        inp = module.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def stream(server, data, *, model=DECOUPLED, request_id="", timeout=60.0, on_response=None):
    """All responses of one request over a gRPC stream (until the final flag); raises the server's error."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, _infer_inputs(grpcclient, data), request_id=request_id,
                                  enable_empty_final_response=True)
        responses = []
        deadline = time.monotonic() + timeout
        while True:
            result, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                raise error
            params = result.get_response().parameters
            if result.get_response().outputs:
                responses.append(result)
                if on_response is not None:
                    on_response(result, client)
            if params["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def unary(server, data, *, model=UNARY, request_id="", timeout=60.0):
    """One non-decoupled request over HTTP."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url, network_timeout=timeout, connection_timeout=timeout)
    try:
        return client.infer(model, _infer_inputs(httpclient, data), request_id=request_id)
    finally:
        client.close()


def ids(result) -> list[int]:
    """Tokens of sequence 0 of a response (output_ids [1, beams, len] cut at sequence_length)."""
    n = int(result.as_numpy("sequence_length")[0][0])
    return [int(t) for t in result.as_numpy("output_ids")[0][0][:n]]


def generate(server, prompt, out_len, *, model=DECOUPLED, **extra) -> list[int]:
    data = tensors(prompt, out_len, exclude_input_in_output=True, **extra)
    if model == UNARY:
        return ids(unary(server, data))
    (res,) = stream(server, data)
    return ids(res)


@pytest.fixture(scope="module")
def greedy(server, prompt) -> list[int]:
    return generate(server, prompt, 16)


# ------------------------------------------------------------------------------------------------ semantics
def test_greedy_is_deterministic_and_modes_agree(server, prompt, greedy):
    assert len(greedy) == 16
    assert generate(server, prompt, 16) == greedy
    chunks = stream(server, tensors(prompt, 16, streaming=True))
    assert len(chunks) >= 15 and [t for c in chunks for t in ids(c)] == greedy  # one token per response
    full = stream(server, tensors(prompt, 16, exclude_input_in_output=False))[0]
    assert ids(full) == prompt + greedy and full.as_numpy("output_ids").shape == (1, 1, len(prompt) + 16)
    assert full.as_numpy("batch_index") is None and full.as_numpy("sequence_index") is None


def test_embedding_bias_changes_the_greedy_token(server, prompt, greedy):
    vocab = stream(server, tensors(prompt, 1, return_generation_logits=True))[0].as_numpy("generation_logits").shape[-1]
    bias = np.zeros((1, vocab), np.float32)
    bias[0, greedy[0]] = -1e4
    biased = generate(server, prompt, 4, embedding_bias=bias)
    assert biased[0] != greedy[0]
    bias[0, 7] = 1e4
    assert generate(server, prompt, 1, embedding_bias=bias) == [7]
    assert generate(server, prompt, 4, model=UNARY, embedding_bias=bias)[0] == 7


def test_two_return_sequences(server, prompt, greedy):
    sampled = stream(server, tensors(prompt, 8, exclude_input_in_output=True, num_return_sequences=2,
                                     runtime_top_k=50, temperature=1.5, seed=3))
    assert sorted(int(r.as_numpy("sequence_index")[0][0]) for r in sampled) == [0, 1]  # one response each
    both = stream(server, tensors(prompt, 16, exclude_input_in_output=True, num_return_sequences=2))
    assert [ids(r) for r in both] == [greedy, greedy]  # greedy samples are identical
    unary_res = unary(server, tensors(prompt, 6, exclude_input_in_output=True, num_return_sequences=2))
    assert unary_res.as_numpy("output_ids").shape == (1, 2, 6)  # non-decoupled: one response, beam axis


def test_stop_words_and_empty_word_lists(server, prompt, greedy):
    stop = np.array([[[greedy[2]], [1]]], np.int32)  # one word of one token, [1, 2, 1]
    out = generate(server, prompt, 16, stop_words_list=stop)
    assert out == greedy[: greedy.index(greedy[2]) + 1]
    empty = np.zeros((1, 2, 0), np.int32)
    assert generate(server, prompt, 16, stop_words_list=empty, bad_words_list=empty) == greedy
    assert generate(server, prompt, 16, model=UNARY, stop_words_list=empty)  # accepted by the unary model too
    two = np.array([[[greedy[0], greedy[1]], [2, -1]]], np.int32)  # one two-token word
    assert generate(server, prompt, 16, stop_words_list=two) == greedy[:2]


def test_bad_words_ban_the_greedy_token(server, prompt, greedy):
    out = generate(server, prompt, 4, bad_words_list=np.array([[[greedy[0]], [1]]], np.int32))
    assert out[0] != greedy[0]


def test_end_id_and_min_tokens(server, prompt, greedy):
    assert generate(server, prompt, 8, end_id=greedy[0]) == []
    out = generate(server, prompt, 8, end_id=greedy[0], min_tokens=4)
    assert len(out) >= 4 and greedy[0] not in out[:4]


def test_penalties_temperature_and_seed(server, prompt):
    out = generate(server, prompt, 24, frequency_penalty=100.0)
    assert len(set(out)) == len(out) and not set(out) & set(prompt)  # every seen token is pushed down
    assert len(set(generate(server, prompt, 24, presence_penalty=100.0))) == 24
    assert len(set(generate(server, prompt, 24, repetition_penalty=1e6))) == 24
    a = generate(server, prompt, 12, runtime_top_k=50, runtime_top_p=0.95, temperature=1.5, seed=11)
    assert a == generate(server, prompt, 12, runtime_top_k=50, runtime_top_p=0.95, temperature=1.5, seed=11)
    draws = {tuple(generate(server, prompt, 12, runtime_top_k=0, runtime_top_p=0.99, temperature=2.0, seed=s))
             for s in range(3)}
    assert len(draws) > 1


def test_log_probs_and_logits(server, prompt, greedy):
    res = stream(server, tensors(prompt, 6, exclude_input_in_output=True, return_log_probs=True,
                                 return_context_logits=True, return_generation_logits=True))[0]
    lp = res.as_numpy("output_log_probs")
    assert lp.shape == (1, 1, 6) and (lp <= 0).all()
    assert res.as_numpy("cum_log_probs")[0][0] == pytest.approx(lp.sum(), rel=1e-5)
    ctx, gen = res.as_numpy("context_logits"), res.as_numpy("generation_logits")
    assert ctx.dtype == np.float32 and ctx.shape[:2] == (1, len(prompt))
    assert gen.dtype == np.float32 and gen.shape == (1, 1, 6, ctx.shape[-1])
    assert gen[0, 0].argmax(-1).tolist() == greedy[:6]
    assert int(ctx[0, -1].argmax()) == greedy[0]
    unary_res = unary(server, tensors(prompt, 3, return_log_probs=True, return_generation_logits=True))
    assert unary_res.as_numpy("output_log_probs").shape == (1, 1, 3)


def test_token_counts_and_perf_metrics(server, prompt):
    res = stream(server, tensors(prompt, 5, exclude_input_in_output=True, return_num_input_tokens=True,
                                 return_num_output_tokens=True, return_perf_metrics=True))[0]
    assert res.as_numpy("num_input_tokens")[0][0] == len(prompt)
    assert res.as_numpy("num_output_tokens")[0][0] == 5
    assert res.as_numpy("kv_cache_alloc_total_blocks")[0][0] >= 1
    assert res.as_numpy("first_token_time_ns")[0][0] >= res.as_numpy("arrival_time_ns")[0][0]
    assert res.as_numpy("total_draft_tokens")[0][0] == 0


def test_draft_tokens_are_verified(server, prompt, greedy):
    data = tensors(prompt, 5, exclude_input_in_output=True, draft_input_ids=np.array([greedy[:2] + [3, 3]], np.int32),
                   return_perf_metrics=True)
    res = unary(server, data, model=UNARY)  # the draft model serves the contract too
    assert ids(res)
    res = stream(server, data)[0]
    assert ids(res) == greedy[:3] and res.as_numpy("total_accepted_draft_tokens")[0][0] == 2


def test_batched_request(server, prompt, greedy):
    data = {"input_ids": np.array([prompt, prompt], np.int32),
            "input_lengths": np.array([[len(prompt)], [len(prompt)]], np.int32),
            "request_output_len": np.array([[4], [4]], np.int32),
            "exclude_input_in_output": np.array([[True], [True]])}
    res = stream(server, data)
    assert sorted(int(r.as_numpy("batch_index")[0][0]) for r in res) == [0, 1]
    assert all(ids(r) == greedy[:4] for r in res)
    with pytest.raises(Exception, match="decoupled"):
        unary(server, data)


# ------------------------------------------------------------------------------------------------ refusals
def _error_within(call, match, seconds=5.0):
    t0 = time.monotonic()
    with pytest.raises(Exception, match=match):
        call()
    assert time.monotonic() - t0 < seconds


def test_limits_are_enforced(server, repo, prompt):
    max_in, max_seq = _limits(repo, DECOUPLED)
    long_prompt = (prompt * (max_in // len(prompt) + 2))[: max_in + 1]
    _error_within(lambda: stream(server, tensors(long_prompt, 4)), "exceeds maximum input length")
    _error_within(lambda: stream(server, tensors(prompt, max_seq)), "exceeds maximum sequence length")
    _error_within(lambda: stream(server, tensors(prompt, 0)), "request_output_len must be > 0")
    _error_within(lambda: unary(server, tensors(prompt, -3)), "request_output_len must be > 0")
    max_in, _ = _limits(repo, UNARY)
    _error_within(lambda: unary(server, tensors((prompt * max_in)[: max_in + 1], 2)), "maximum input length")


def test_missing_inputs_get_errors(server, prompt):
    data = tensors(prompt, 4)
    del data["input_ids"]
    _error_within(lambda: stream(server, data), "input_ids")
    _error_within(lambda: unary(server, data), "input_ids")
    data = tensors(prompt, 4)
    del data["request_output_len"]
    _error_within(lambda: stream(server, data), "request_output_len")


def test_unsupported_inputs_get_clear_errors(server, prompt):
    _error_within(lambda: stream(server, tensors(prompt, 4, lora_task_id=1)), "lora_task_id.*LoRA")
    _error_within(lambda: unary(server, tensors(prompt, 4, lookahead_window_size=2)), "lookahead_window_size")
    table = np.zeros((1, 2, 8), np.float16)
    _error_within(lambda: stream(server, tensors(prompt, 4, prompt_embedding_table=table)), "prompt_embedding_table")
    _error_within(lambda: stream(server, tensors(prompt, 4, beam_width=2)), "beam_width 2")
    _error_within(lambda: unary(server, tensors(prompt, 4, streaming=True)), "decoupled")
    # inputs the C++ backend ignores on a decoder-only engine are accepted (upstream's ensemble always sends them)
    assert generate(server, prompt, 2, decoder_input_ids=np.array([[0]], np.int32), decoder_input_lengths=1)


# ------------------------------------------------------------------------------------------------ serving
def _in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as exc:  # noqa: BLE001 (reported by the test)
            box["error"] = exc
        box["t"] = time.monotonic()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, box


def test_stop_request_ends_a_running_unary_request(server, repo, prompt):
    _, max_seq = _limits(repo, UNARY)
    long_len = max_seq - len(prompt)
    started = time.monotonic()
    worker, box = _in_thread(lambda: unary(server, tensors(prompt, long_len), request_id="long-unary"))
    time.sleep(0.2)  # the request is in flight (the whole generation takes ~0.5 s on a quiet 2-core box)
    assert worker.is_alive(), (box, time.monotonic() - started)
    stopped = time.monotonic()
    unary(server, tensors(prompt, 1, stop=True), request_id="long-unary")
    worker.join(timeout=30)
    assert "error" not in box and box["t"] - stopped < 1.0
    assert len(ids(box["result"])) < len(prompt) + long_len  # the tokens generated before the stop


def test_stop_request_ends_a_running_stream(server, prompt):
    stopped: dict = {}

    def stop_on_second(_result, _client):
        stopped["n"] = stopped.get("n", 0) + 1
        if stopped["n"] == 2:
            stopped["t"] = time.monotonic()
            stopped["reply"] = stream(server, tensors(prompt, 1, stop=True), request_id="long-stream")

    chunks = stream(server, tensors(prompt, 400, streaming=True), request_id="long-stream", on_response=stop_on_second)
    assert time.monotonic() - stopped["t"] < 1.0 and len(chunks) < 100
    _error_within(lambda: stream(server, tensors(prompt, 1, stop=True)), "request id")


def test_client_cancel_stops_generation(server, prompt):
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put(error))
    client.async_stream_infer(DECOUPLED, _infer_inputs(grpcclient, tensors(prompt, 400, streaming=True)),
                              request_id="long-cancel")
    assert got.get(timeout=30) is None and got.get(timeout=30) is None
    client.stop_stream(cancel_requests=True)
    cancelled = time.monotonic()
    client.close()
    pattern = "request 'long-cancel' cancelled after"
    while pattern not in server.log_file.read_text(errors="replace"):
        assert time.monotonic() - cancelled < 1.0, "generation still running 1 s after the client cancelled"
        time.sleep(0.05)


@pytest.mark.parametrize("model", [DECOUPLED, UNARY])
def test_short_request_is_not_blocked_behind_a_long_one(server, repo, prompt, model):
    _, max_seq = _limits(repo, model)
    long_worker, long_box = _in_thread(lambda: generate(server, prompt, max_seq - len(prompt), model=model))
    time.sleep(0.3)
    t0 = time.monotonic()
    short = generate(server, prompt, 4, model=model)
    assert len(short) == 4 and long_worker.is_alive(), "the short request waited for the long one"
    assert time.monotonic() - t0 < 5.0
    long_worker.join(timeout=120)
    assert "error" not in long_box


def test_sixteen_concurrent_requests_without_errors(server, prompt, greedy):
    work = [(DECOUPLED if i % 2 else UNARY, 8 + i % 5) for i in range(16)]
    workers = [_in_thread(lambda m=m, n=n: generate(server, prompt, n, model=m)) for m, n in work]
    for worker, _ in workers:
        worker.join(timeout=120)
    errors = [box.get("error") for _, box in workers if "error" in box]
    assert errors == []
    for (model, n), (_, box) in zip(work, workers):
        assert len(box["result"]) == n
        if model == DECOUPLED:
            assert box["result"] == greedy[:n]
