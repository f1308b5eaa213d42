"""Every route of the reference repository against a real tritonserver: the ensemble (HTTP; gRPC streaming when the
target is decoupled) and tensorrt_llm_bls get every optional input of the 1.2.1 contract at least once, and the
semantics are checked (embedding bias, return sequences, stop words, min_tokens, log probs, token counts, limits,
missing inputs, draft-target == target-only greedy, concurrency 16, 1-D text_output).

Two layouts, one server each (class-scoped, never both at once): upstream's draft-target recipe (target, draft and
BLS unary — the default with a draft) and `serving.decoupled=True` (streaming target beside the draft; its BLS is
switched to decoupled in the test's copy so the BLS streaming route is exercised too)."""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
PROMPT = "The quick brown fox"
PROMPTS = [PROMPT, "Once upon a time", "The little cat sat on", "Every morning the bee"]
ERROR_WITHIN_S = 5.0


# ------------------------------------------------------------------------------------------------ fixtures
def _package(tiny_models, base: Path, **spec_overrides) -> Path:
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.package import package_repo
    from pipeline.stages.package.inputs import PackageInputs

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(base / "out"))
        mp.setenv("PIPELINE_CACHE", str(base / "cache"))
        spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference", **spec_overrides)
        inputs = PackageInputs(checkpoint=tiny_models["tiny-llama"], draft_checkpoint=tiny_models["tiny-llama-draft"],
                               build_id="routes")
        return package_repo(spec, inputs).path


def _serve(repo: Path, validate: bool = True):
    from pipeline.serving.serve import TritonServer

    srv = TritonServer(repo, ready_timeout_s=300, validate=validate)
    srv.start()
    return srv


@pytest.fixture(scope="class")
def unary(tiny_models, tmp_path_factory):
    """The default draft-target layout: tensorrt_llm, tensorrt_llm_draft and tensorrt_llm_bls unary."""
    repo = _package(tiny_models, tmp_path_factory.mktemp("routes-unary"))
    assert "decoupled: false" in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    srv = _serve(repo)
    yield Route(srv, repo)
    srv.stop()


@pytest.fixture(scope="class")
def streaming(tiny_models, tmp_path_factory):
    """serving.decoupled=True: a streaming target beside the draft; the BLS is switched to decoupled as well, so its
    streaming route (no draft tokens, decoupled target) is served too."""
    repo = _package(tiny_models, tmp_path_factory.mktemp("routes-decoupled"), decoupled=True)
    bls = repo / "tensorrt_llm_bls" / "config.pbtxt"
    text = bls.read_text()
    assert "decoupled: false" in text and "decoupled: true" in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    bls.write_text(text.replace("decoupled: false", "decoupled: true"))
    srv = _serve(repo, validate=False)  # the packager refuses a decoupled BLS beside a draft; this tests its code
    yield Route(srv, repo)
    srv.stop()


# ------------------------------------------------------------------------------------------------ clients
class Route:
    """HTTP generate / gRPC unary / gRPC streaming calls against one server, plus the repo's tokenizer."""

    def __init__(self, server, repo: Path):
        from transformers import AutoTokenizer

        self.server, self.repo = server, repo
        self.tokenizer = AutoTokenizer.from_pretrained(str(repo / "preprocessing" / "tokenizer"))
        params = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
        self.limits = {k: int(re.search(rf'key: "{k}"\s*value \{{\s*string_value: "(\d+)"', params).group(1))
                       for k in ("max_input_len", "max_seq_len")}

    def generate(self, model: str, timeout: float = 120, **payload):
        """POST /generate; returns (status, body, seconds)."""
        req = urllib.request.Request(f"http://{self.server.http_url}/v2/models/{model}/generate",
                                     data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"{}"), time.monotonic() - t0
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}"), time.monotonic() - t0

    def ok(self, model: str, **payload) -> dict:
        payload.setdefault("exclude_input_in_output", True)
        status, body, _ = self.generate(model, **payload)
        assert status == 200 and "error" not in body, body
        return body

    def greedy(self, model: str = "ensemble", prompt: str = PROMPT, max_tokens: int = 16, **extra) -> str:
        return _first(self.ok(model, text_input=prompt, max_tokens=max_tokens, top_k=1, **extra)["text_output"])

    def infer(self, model: str, inputs: dict, outputs=None):
        """gRPC unary infer; returns {name: numpy} or raises InferenceServerException."""
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            result = client.infer(model, _grpc_inputs(inputs), client_timeout=120)
            return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
        finally:
            client.close()

    def stream(self, model: str, inputs: dict, timeout: float = 120) -> tuple[list[dict], str | None, float]:
        """One request over a gRPC stream: (responses as {name: numpy}, error or None, seconds to the end)."""
        import tritonclient.grpc as grpcclient

        q: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        client.start_stream(callback=lambda result=None, error=None: q.put((result, error)))
        responses, error = [], None
        t0 = time.monotonic()
        try:
            client.async_stream_infer(model, _grpc_inputs(inputs), enable_empty_final_response=True)
            while True:
                result, err = q.get(timeout=timeout)
                if err is not None:
                    error = str(err)
                    break
                response = result.get_response()
                if response.outputs:
                    responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
        finally:
            client.stop_stream()
            client.close()
        return responses, error, time.monotonic() - t0


UINT64_INPUTS = {"seed", "lora_task_id", "prompt_table_extra_id"}


def _grpc_inputs(values: dict):
    """{name: value} -> InferInputs with a batch dim; ints are INT32 except the UINT64 inputs."""
    import tritonclient.grpc as grpcclient

    kinds = {"b": ("BOOL", np.bool_), "i": ("INT32", np.int32), "u": ("UINT64", np.uint64), "f": ("FP32", np.float32)}
    inputs = []
    for name, value in values.items():
        arr = np.asarray(value)
        if arr.dtype.kind in "USO":
            arr, dtype = np.array([[str(v).encode() for v in np.atleast_1d(value)]], dtype=np.object_), "BYTES"
        elif arr.dtype == np.float16:
            dtype = "FP16"
        else:
            dtype, np_type = kinds["u" if name in UINT64_INPUTS else arr.dtype.kind]
            arr = arr.astype(np_type)
        if arr.ndim < 2:
            arr = arr.reshape(1, -1)
        tensor = grpcclient.InferInput(name, list(arr.shape), dtype)
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs


def _first(text):
    return text[0] if isinstance(text, list) else text


def _single_token_word(route: Route, avoid: str) -> tuple[str, int]:
    """A word the tokenizer encodes as one token, not the first token of `avoid`."""
    first = route.tokenizer.encode(avoid, add_special_tokens=False)[0]
    for word in (" cat", " dog", " sun", " tree", " house", " the", " a"):
        ids = route.tokenizer.encode(word, add_special_tokens=False)
        if len(ids) == 1 and ids[0] != first:
            return word, ids[0]
    pytest.fail("no single-token word found in the tiny tokenizer")


# Every optional input of the 1.2.1 ensemble / BLS contract that a CPU model honours, with a value that keeps the
# output greedy-checkable (the semantics of the active ones are checked separately below).
HONOURED = {
    "bad_words": [" zebra"], "stop_words": [""], "exclude_input_in_output": True, "end_id": 1, "pad_id": 2,
    "top_k": 1, "top_p": 0.0, "temperature": 1.0, "length_penalty": 1.0, "repetition_penalty": 1.0,
    "min_tokens": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": 7, "return_log_probs": True,
    "return_context_logits": True, "return_generation_logits": True, "return_perf_metrics": True,
    "return_num_input_tokens": True, "return_num_output_tokens": True, "beam_width": 1, "stream": False,
    "num_return_sequences": 1, "embedding_bias_words": [" cat"], "embedding_bias_weights": [0.0],
    "prompt_table_extra_id": 3,
}
# Inputs that need another build: each must be refused per request, fast.
REFUSED = {
    "decoder_text_input": "hello",
    "prompt_embedding_table": np.zeros((1, 2, 64), dtype=np.float16),
    "lora_task_id": np.array([[1]], dtype=np.uint64),
    "lora_weights": np.zeros((1, 2, 8), dtype=np.float16),
    "lora_config": np.zeros((1, 2, 3), dtype=np.int32),
    "guided_decoding_guide_type": "json",
    "guided_decoding_guide": "{}",
}
BLS_REFUSED = {
    **REFUSED,
    "prompt_vocab_size": 2,
    "image_url_input": "http://127.0.0.1:9/x.png",
    "image_bytes_input": np.zeros((1, 1, 2, 2, 3), dtype=np.uint8),
    "video_bytes_input": np.zeros((1, 1, 2, 2, 3), dtype=np.uint8),
    "image_input": np.zeros((1, 1, 3, 2, 2), dtype=np.float16),
    "use_draft_logits": True,
}


def _base(max_tokens=6, prompt=PROMPT):
    return {"text_input": prompt, "max_tokens": np.array([[max_tokens]], dtype=np.int32)}


# ================================================================================================ unary layout
class TestDraftTargetLayout:
    """Upstream's draft-target recipe: every LLM model and the BLS unary."""

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_text_output_is_one_dimensional(self, unary, model):
        out = unary.infer(model, _base())
        assert out["text_output"].ndim == 1 and out["text_output"].shape == (1,)
        assert out["text_output"][0].decode().strip()

    @pytest.mark.parametrize("model, extra", [("ensemble", {}), ("tensorrt_llm_bls", {"num_draft_tokens": 0}),
                                              ("tensorrt_llm_bls", {"return_context_logits": False})])
    def test_every_honoured_optional_input_at_once(self, unary, model, extra):
        greedy = unary.greedy(model, max_tokens=6)
        body = unary.ok(model, text_input=PROMPT, max_tokens=6, **{**HONOURED, **extra})
        assert _first(body["text_output"]) == greedy
        n_out, n_in = body["num_output_tokens"], body["num_input_tokens"]
        assert n_in == len(unary.tokenizer.encode(PROMPT)) and 1 <= n_out <= 6
        assert len(body["output_log_probs"]) == n_out and body["cum_log_probs"] == pytest.approx(
            sum(body["output_log_probs"]), abs=1e-4)
        assert body["first_token_time_ns"] >= body["arrival_time_ns"] > 0
        assert np.asarray(body["generation_logits"]).size >= n_out
        if "return_context_logits" not in extra:  # refused with draft-target speculation (the BLS default)
            assert np.asarray(body["context_logits"]).size > 0
        else:
            assert body["total_draft_tokens"] > 0

    @pytest.mark.parametrize("model, name", [("ensemble", n) for n in sorted(REFUSED)]
                             + [("tensorrt_llm_bls", n) for n in sorted(BLS_REFUSED)])
    def test_inputs_needing_another_build_are_refused_fast(self, unary, model, name):
        from tritonclient.utils import InferenceServerException

        value = (REFUSED if model == "ensemble" else BLS_REFUSED)[name]
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as err:
            unary.infer(model, {**_base(), name: value})
        assert time.monotonic() - t0 < ERROR_WITHIN_S
        assert name.split("_")[0] in str(err.value).lower() or "not supported" in str(err.value), err.value

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_embedding_bias_changes_the_greedy_token(self, unary, model):
        greedy = unary.greedy(model, max_tokens=4)
        word, token = _single_token_word(unary, greedy)
        biased = unary.ok(model, text_input=PROMPT, max_tokens=4, top_k=1, embedding_bias_words=[word],
                          embedding_bias_weights=[50.0], return_num_output_tokens=True)
        assert _first(biased["text_output"]).startswith(word), (greedy, biased)
        assert unary.tokenizer.encode(_first(biased["text_output"]), add_special_tokens=False)[0] == token

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_two_return_sequences_come_back(self, unary, model):
        extra = {"num_draft_tokens": 0} if model == "tensorrt_llm_bls" else {}
        body = unary.ok(model, text_input=PROMPT, max_tokens=6, num_return_sequences=2, top_k=50,
                        temperature=1.5, seed=11, **extra)
        assert isinstance(body["text_output"], list) and len(body["text_output"]) == 2
        assert all(t.strip() for t in body["text_output"])
        out = unary.infer(model, {**_base(), "num_return_sequences": 2, "top_k": 50, "seed": 11, **extra})
        assert out["text_output"].shape == (2,)

    def test_num_return_sequences_with_draft_target_is_refused(self, unary):
        status, body, seconds = unary.generate("tensorrt_llm_bls", text_input=PROMPT, max_tokens=4,
                                               num_return_sequences=2)
        assert status >= 400 and "num_draft_tokens 0" in body["error"] and seconds < ERROR_WITHIN_S

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_stop_words_end_the_text_and_empty_ones_are_ignored(self, unary, model):
        greedy = unary.greedy(model, max_tokens=16)
        assert unary.greedy(model, max_tokens=16, stop_words=[""]) == greedy
        words = greedy.split()
        stop = " " + words[2]
        stopped = unary.greedy(model, max_tokens=16, stop_words=["unrelatedword", stop])
        assert stopped.endswith(stop) and greedy.startswith(stopped) and len(stopped) < len(greedy)

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_min_tokens_holds_back_the_end_id(self, unary, model):
        greedy = unary.greedy(model, max_tokens=8)
        first = unary.tokenizer.encode(greedy, add_special_tokens=False)[0]
        ended = unary.ok(model, text_input=PROMPT, max_tokens=8, top_k=1, end_id=first, return_num_output_tokens=True)
        assert ended["num_output_tokens"] == 0 and _first(ended["text_output"]) == ""
        held = unary.ok(model, text_input=PROMPT, max_tokens=8, top_k=1, end_id=first, min_tokens=5,
                        return_num_output_tokens=True)
        assert held["num_output_tokens"] >= 5 and _first(held["text_output"]).strip()

    def test_log_probs_of_draft_target_equal_the_target_alone(self, unary):
        args = dict(text_input=PROMPT, max_tokens=8, top_k=1, return_log_probs=True)
        target = unary.ok("ensemble", **args)
        spec = unary.ok("tensorrt_llm_bls", **args, num_draft_tokens=3)
        assert spec["total_draft_tokens"] > 0
        assert spec["output_log_probs"] == pytest.approx(target["output_log_probs"], abs=1e-3)
        assert all(lp <= 0 for lp in target["output_log_probs"])

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_requests_beyond_the_limits_fail_fast(self, unary, model):
        too_long = " ".join(["fox"] * (unary.limits["max_input_len"] + 20))
        for payload in ({"text_input": too_long, "max_tokens": 4},
                        {"text_input": PROMPT, "max_tokens": unary.limits["max_seq_len"] + 1},
                        {"text_input": PROMPT, "max_tokens": 0}):
            status, body, seconds = unary.generate(model, **payload)
            assert status >= 400 and body.get("error") and seconds < ERROR_WITHIN_S, (payload["max_tokens"], body)

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    @pytest.mark.parametrize("missing", ["text_input", "max_tokens"])
    def test_missing_required_input_is_an_error_not_a_hang(self, unary, model, missing):
        from tritonclient.utils import InferenceServerException

        payload = {"text_input": PROMPT, "max_tokens": 4, "stream": False, "top_k": 1}
        del payload[missing]
        status, body, seconds = unary.generate(model, timeout=30, **payload)
        assert status >= 400 and body.get("error") and seconds < ERROR_WITHIN_S, body
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException):
            unary.infer(model, {k: v for k, v in payload.items()})
        assert time.monotonic() - t0 < ERROR_WITHIN_S

    def test_bls_draft_target_equals_target_only_greedy(self, unary):
        for prompt in PROMPTS:
            target = unary.greedy("ensemble", prompt=prompt, max_tokens=20)
            for k in (1, 4):
                spec = unary.ok("tensorrt_llm_bls", text_input=prompt, max_tokens=20, num_draft_tokens=k)
                assert spec["text_output"] == target, (prompt, k)
                assert 0 <= spec["total_accepted_draft_tokens"] <= spec["total_draft_tokens"]
            assert unary.greedy("tensorrt_llm_bls", prompt=prompt, max_tokens=20, num_draft_tokens=0) == target

    def test_exclude_input_in_output_false_returns_the_prompt(self, unary):
        for model in ("ensemble", "tensorrt_llm_bls"):
            text = unary.greedy(model, max_tokens=4, exclude_input_in_output=False)
            assert text.startswith(PROMPT) and text[len(PROMPT):] == unary.greedy(model, max_tokens=4)
            status, body, _ = unary.generate(model, text_input=PROMPT, max_tokens=4, top_k=1)
            assert status == 200 and _first(body["text_output"]) == text  # the backend's default (upstream's): the prompt is part of the output

    @pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
    def test_concurrency_16_without_errors(self, unary, model):
        expected = {p: unary.greedy(model, prompt=p, max_tokens=12) for p in PROMPTS}

        def one(i):
            prompt = PROMPTS[i % len(PROMPTS)]
            return prompt, unary.generate(model, text_input=prompt, max_tokens=12, top_k=1, exclude_input_in_output=True)

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(32)))
        errors = [body for _, (status, body, _) in results if status != 200 or "error" in body]
        assert not errors, errors[:3]
        assert all(_first(body["text_output"]) == expected[p] for p, (_, body, _) in results)
        assert unary.greedy(model, max_tokens=12) == expected[PROMPT]  # the route still answers afterwards


# ================================================================================================ decoupled layout
class TestStreamingLayout:
    """serving.decoupled=True: streaming through the ensemble and through a decoupled BLS."""

    def _stream_inputs(self, max_tokens=10, **extra):
        return {**_base(max_tokens), "stream": True, "top_k": 1, **extra}

    def test_ensemble_streams_token_by_token(self, streaming):
        greedy = streaming.greedy("ensemble", max_tokens=10)
        responses, error, _ = streaming.stream("ensemble", self._stream_inputs())
        assert error is None and len(responses) >= 6
        assert all(r["text_output"].ndim == 1 for r in responses)
        assert "".join(r["text_output"][0].decode() for r in responses) == greedy

    def test_streamed_options_and_metrics(self, streaming):
        responses, error, _ = streaming.stream("ensemble", self._stream_inputs(
            8, return_log_probs=True, return_perf_metrics=True, return_num_input_tokens=True,
            return_num_output_tokens=True, embedding_bias_words=[" cat"], embedding_bias_weights=[0.0],
            stop_words=[""], bad_words=[" zebra"], min_tokens=2, seed=3))
        assert error is None and responses
        assert sum(int(r["num_output_tokens"].reshape(-1)[0]) for r in responses) == 8
        assert all(r["output_log_probs"].size >= 1 for r in responses)
        assert int(responses[-1]["num_input_tokens"].reshape(-1)[0]) == len(streaming.tokenizer.encode(PROMPT))
        assert any(int(r.get("first_token_time_ns", np.zeros(1)).reshape(-1)[0]) > 0 for r in responses)

    def test_two_streamed_return_sequences(self, streaming):
        responses, error, _ = streaming.stream("ensemble", self._stream_inputs(
            5, num_return_sequences=2, top_k=50, temperature=1.5, seed=5))
        assert error is None
        assert {int(r["sequence_index"].reshape(-1)[0]) for r in responses} == {0, 1}

    @pytest.mark.parametrize("missing", ["text_input", "max_tokens"])
    def test_missing_required_input_is_an_error_within_5s(self, streaming, missing):
        inputs = self._stream_inputs()
        del inputs[missing]
        responses, error, seconds = streaming.stream("ensemble", inputs, timeout=ERROR_WITHIN_S + 5)
        assert error is not None and seconds < ERROR_WITHIN_S, (responses, error)
        payload = {"text_input": PROMPT, "max_tokens": 4, "stream": False}
        del payload[missing]
        status, body, seconds = streaming.generate("ensemble", timeout=30, **payload)
        assert status >= 400 and body.get("error") and seconds < ERROR_WITHIN_S, body

    def test_prompt_over_the_limit_fails_fast_when_streaming(self, streaming):
        too_long = " ".join(["fox"] * (streaming.limits["max_input_len"] + 20))
        responses, error, seconds = streaming.stream("ensemble", {**self._stream_inputs(), "text_input": too_long},
                                                     timeout=ERROR_WITHIN_S + 5)
        assert error is not None and "input length" in error and seconds < ERROR_WITHIN_S

    def test_decoupled_bls_streams_without_draft(self, streaming):
        greedy = streaming.greedy("ensemble", max_tokens=10)
        responses, error, _ = streaming.stream("tensorrt_llm_bls", self._stream_inputs(num_draft_tokens=0))
        assert error is None and len(responses) >= 6
        assert "".join(r["text_output"][0].decode() for r in responses) == greedy
        spec = streaming.stream("tensorrt_llm_bls", self._stream_inputs(num_draft_tokens=2))
        assert spec[1] is not None and "draft-target" in spec[1]

    def test_bls_draft_target_over_a_streaming_target(self, streaming):
        greedy = streaming.greedy("ensemble", max_tokens=16)
        responses, error, _ = streaming.stream("tensorrt_llm_bls",
                                               {**_base(16), "num_draft_tokens": 3, "stream": False,
                                                "exclude_input_in_output": True})
        assert error is None and len(responses) == 1
        assert responses[0]["text_output"][0].decode() == greedy
        assert int(responses[0]["total_draft_tokens"].reshape(-1)[0]) > 0

    def test_concurrency_16_streams_without_errors(self, streaming):
        expected = streaming.greedy("ensemble", max_tokens=8)
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda _: streaming.stream("ensemble", self._stream_inputs(8)), range(16)))
        assert [e for _, e, _ in results if e] == []
        assert all("".join(r["text_output"][0].decode() for r in rs) == expected for rs, _, _ in results)
