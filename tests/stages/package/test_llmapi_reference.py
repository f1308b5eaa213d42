"""The reference `llmapi` repository (PyTorch runtime, draft-target) under a real tritonserver: the 1.2 llmapi
request/response contract over HTTP generate and gRPC streaming, exact greedy output with speculation, prefix-cache
metrics, stop strings and per-request errors."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest

from pipeline.core.spec import resolve_spec
from pipeline.serving.serve import TritonServer
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import llm_api_options
from pipeline.stages.package.llmapi_package import package_llmapi_repo
from tests.support.llmapi_fixtures import fabricated_fp8_export

pytestmark = pytest.mark.slow
LONG = ("The little dog ran to the park with the red ball and the happy cat followed it, and then the two of "
        "them sat under the big tree near the old house to rest in the warm sun until the evening came.")


@pytest.fixture(scope="module")
def llmapi_server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("llmapi")
    target = fabricated_fp8_export(tiny_models["tiny-llama"], root / "t" / "hf_checkpoint")
    draft = fabricated_fp8_export(tiny_models["tiny-llama-draft"], root / "d" / "hf_checkpoint")
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference", runtime="pytorch")
    repo = package_llmapi_repo(spec, PackageInputs(checkpoint=target, draft_checkpoint=draft, output=root / "repos"),
                               options=llm_api_options(spec, draft_dir=draft)).path
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_CACHE", str(root / "cache"))
        srv = TritonServer(repo, ready_timeout_s=300)
        srv.start()
    yield srv, target
    srv.stop()


def generate(srv, prompt, **inputs) -> dict:
    body = json.dumps({"text_input": prompt, **inputs}).encode()
    req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body)
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def generate_error(srv, **body) -> str:
    req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate",
                                 data=json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    return err.value.read().decode()


def stream(srv, prompt, max_tokens) -> list[tuple[str, bool]]:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inputs = []
    for name, arr, dt in (("text_input", np.array([prompt], dtype=object), "BYTES"),
                          ("streaming", np.array([True]), "BOOL"),
                          ("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int32), "INT32")):
        inputs.append(grpcclient.InferInput(name, list(arr.shape), dt))
        inputs[-1].set_data_from_numpy(arr)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    out = []
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            text = result.as_numpy("text_output")
            out.append((text[0].decode() if text is not None else "", final))
            if final:
                return out
    finally:
        client.stop_stream()
        client.close()


def local_greedy(checkpoint, prompt, n) -> str:
    """The same FP8 export, dequantized and decoded greedily in this process (no speculation)."""
    import importlib.util

    import torch
    from transformers import AutoTokenizer

    from pipeline.stages.package.render import templates_root

    path = templates_root("llmapi") / "tensorrt_llm" / "1" / "hf_reference.py"
    spec = importlib.util.spec_from_file_location("hf_reference_local", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    model = ref.load_model(str(checkpoint), torch.float64)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False, eos_token_id=tok.eos_token_id)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_unary_greedy_with_speculation_matches_plain_greedy(llmapi_server):
    srv, target = llmapi_server
    r = generate(srv, "Once upon a time", sampling_param_max_tokens=12, sampling_param_return_perf_metrics=True,
                 return_finish_reason=True)
    assert r["text_output"] == local_greedy(target, "Once upon a time", 12)
    assert r["finish_reason"] == "length"
    assert r["total_draft_tokens"] > 0 and 0 <= r["total_accepted_draft_tokens"] <= r["total_draft_tokens"]
    assert r["acceptance_rate"] == pytest.approx(r["total_accepted_draft_tokens"] / r["total_draft_tokens"])
    assert r["arrival_time_ns"] <= r["first_scheduled_time_ns"] <= r["first_token_time_ns"] <= r["last_token_time_ns"]


def test_streaming_sends_growing_text_then_final(llmapi_server):
    srv, _ = llmapi_server
    parts = stream(srv, "The little dog", 10)
    assert len(parts) >= 2 and parts[-1][1] and not any(final for _, final in parts[:-1])
    texts = [t for t, _ in parts]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
    assert texts[-1] == generate(srv, "The little dog", sampling_param_max_tokens=10)["text_output"]


def test_prefix_cache_hits_on_a_repeated_long_prompt(llmapi_server):
    srv, _ = llmapi_server
    first = generate(srv, LONG, sampling_param_max_tokens=2, sampling_param_return_perf_metrics=True)
    again = generate(srv, LONG, sampling_param_max_tokens=2, sampling_param_return_perf_metrics=True)
    assert first["kv_cache_reused_block"] == 0 and first["kv_cache_hit_rate"] == 0
    assert first["kv_cache_missed_block"] >= 2
    assert again["kv_cache_reused_block"] >= 1 and again["kv_cache_hit_rate"] > 0
    total = again["kv_cache_reused_block"] + again["kv_cache_missed_block"]
    assert again["kv_cache_hit_rate"] == pytest.approx(again["kv_cache_reused_block"] / total)
    assert again["text_output"] == first["text_output"]


def test_stop_string_and_outputs_on_request(llmapi_server):
    srv, _ = llmapi_server
    full = generate(srv, "Once upon a time", sampling_param_max_tokens=12)["text_output"]
    word = full.split()[2]
    r = generate(srv, "Once upon a time", sampling_param_max_tokens=12, sampling_param_stop=[word],
                 return_finish_reason=True, return_stop_reason=True)
    assert r["finish_reason"] == "stop" and r["stop_reason"] == word
    assert word not in r["text_output"] and full.startswith(r["text_output"])
    assert "finish_reason" not in generate(srv, "Once upon a time", sampling_param_max_tokens=2)


def test_bad_requests_get_one_error_each(llmapi_server):
    srv, _ = llmapi_server
    assert "text_input" in generate_error(srv, sampling_param_max_tokens=4)
    assert "best_of" in generate_error(srv, text_input="hi", sampling_param_best_of=2)
    assert "max_seq_len" in generate_error(srv, text_input="hi", sampling_param_max_tokens=100000)
    assert generate(srv, "hi", sampling_param_max_tokens=2)["text_output"]  # the server still serves


BAD_SAMPLING = [("temperature", -1.0, "must be >= 0"), ("top_p", 7.0, "must be in (0, 1]"),
                ("top_k", -1, "must be >= 0"), ("max_tokens", 0, "must be >= 1"), ("max_tokens", -5, "must be >= 1"),
                ("best_of", 0, "must be >= 1")]


@pytest.mark.parametrize(("name", "value", "message"), BAD_SAMPLING, ids=[f"{n}={v}" for n, v, _ in BAD_SAMPLING])
def test_out_of_range_sampling_value_gets_one_error(llmapi_server, name, value, message):
    srv, _ = llmapi_server
    assert f"sampling_param_{name} {message}" in generate_error(srv, text_input="hi", **{f"sampling_param_{name}": value})


@pytest.mark.parametrize("size", [10_000_000, 100_000_000])
def test_huge_prompt_gets_an_error_naming_the_byte_limit(llmapi_server, size):
    srv, _ = llmapi_server
    yaml_text = (srv.repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    max_seq_len = int(yaml_text.split("max_seq_len:")[1].split()[0])
    error = generate_error(srv, text_input="fox " * (size // 4), sampling_param_max_tokens=2)
    assert f"text_input is {size} bytes, over the limit of {max_seq_len * 32} bytes" in error
    assert srv.is_ready() and generate(srv, "hi", sampling_param_max_tokens=2)["text_output"]


def test_stop_request_cancels_a_running_stream(llmapi_server):
    import tritonclient.grpc as grpcclient

    srv, _ = llmapi_server
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)

    def tensor(name, arr, dt):
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t

    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", [
            tensor("text_input", np.array(["Once upon a time"], dtype=object), "BYTES"),
            tensor("streaming", np.array([True]), "BOOL"),
            tensor("sampling_param_max_tokens", np.array([400], dtype=np.int32), "INT32"),
            tensor("sampling_param_temperature", np.array([1.0], dtype=np.float32), "FP32"),
        ], request_id="long-one", enable_empty_final_response=True)
        result, error = got.get(timeout=120)  # the stream is running
        assert error is None
        client.async_stream_infer("tensorrt_llm", [tensor("text_input", np.array([""], dtype=object), "BYTES"),
                                                   tensor("stop", np.array([True]), "BOOL")],
                                  request_id="long-one", enable_empty_final_response=True)
        errors = []
        while len(errors) < 2:  # the stop request's answer and the cancelled stream's final error
            result, error = got.get(timeout=60)
            if error is not None:
                errors.append(str(error))
        assert all("cancelled" in e.lower() for e in errors)
    finally:
        client.stop_stream()
        client.close()


def test_llmapi_client_streams_and_collects_metrics(llmapi_server):
    from pipeline.serving.llmapi import client

    srv, _ = llmapi_server
    want = generate(srv, "The little dog", sampling_param_max_tokens=10)["text_output"]
    streamed = client.send(srv.grpc_url, "The little dog", 10, top_k=1, return_perf_metrics=True)
    assert streamed.text == want and len(streamed.texts) >= 2
    assert streamed.ttft_s is not None and streamed.ttft_s <= streamed.total_s
    assert {"kv_cache_hit_rate", "total_draft_tokens", "kv_cache_reused_block"} <= set(streamed.metrics)
    unary = client.send(srv.grpc_url, "The little dog", 10, streaming=False, top_k=1)
    assert unary.texts == [want] and "kv_cache_hit_rate" not in unary.metrics
    with pytest.raises(Exception, match="best_of"):
        client.send(srv.grpc_url, "The little dog", 4, best_of=3)


def test_smoke_speaks_to_the_llmapi_model(llmapi_server):
    from pipeline.serving.smoke import smoke_server

    srv, _ = llmapi_server
    lines: list[str] = []
    results = smoke_server(srv.http_url, srv.grpc_url, prompt="Once upon a time", max_tokens=8, out=lines.append)
    routes = [r.route for r in results]
    assert routes == ["http tensorrt_llm (llmapi, greedy)", "grpc tensorrt_llm (llmapi, stream)",
                      "grpc tensorrt_llm (llmapi, repeated prompt)"]
    assert results[0].text == results[1].text and results[0].acceptance_rate is not None
    assert results[2].extra["kv_cache_reused_block"] >= 1 and results[2].extra["kv_cache_hit_rate"] > 0


def test_bench_speaks_to_the_llmapi_model(llmapi_server):
    from pipeline.serving.bench import ServerUrls, SweepOptions, WorkloadOptions, run_bench

    srv, target = llmapi_server
    report = run_bench(ServerUrls(srv.grpc_url),
                       WorkloadOptions(concurrency=(1, 2), requests_per_level=4, max_tokens=6, shared_prefix_tokens=80,
                                       shared_prefix_share=1.0),
                       sweep=SweepOptions(warmup=False), tokenizer_dir=target)
    assert report.triton_model == "tensorrt_llm" and report.streaming and report.failed == 0
    for level in report.levels:
        assert level.requests == 4 and level.output_tokens > 0 and level.ttft_ms_p50 is not None
        assert level.acceptance_rate is not None and 0 <= level.acceptance_rate <= 1
    assert report.prefix_cache_hit_ratio is not None and report.prefix_cache_hit_ratio > 0
