"""Smoke test of a served model repository: HTTP generate through the ensemble, gRPC through the ensemble
(streaming when `tensorrt_llm` is decoupled, unary otherwise: the draft-target layout), and (with speculation) the
BLS draft-target route checked against the target's own greedy output. A repository with the LLM-API model
(runtime pytorch) gets its own routes: greedy HTTP generate with perf metrics, gRPC streaming (when decoupled)
checked against it, and a repeated long prompt that reports the prefix-cache hit rate.

`run_smoke(repo=...)` starts a server on the repository (and stops it), or talks to a running one
(`http_url`/`grpc_url`). It prints answers, latency, tokens/s and the acceptance rate, and raises `ServeError`
on any failure (the CLI turns that into a non-zero exit).
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import ServeError
from pipeline.serving.bench import tokenizer_dir_of
from pipeline.serving.llmapi import client as llmapi
from pipeline.serving.serve import TritonServer
from pipeline.serving.token_count import SOURCES, TokenCount, count_output_tokens, load_tokenizer, server_count

if TYPE_CHECKING:
    import tritonclient.http as httpclient

DEFAULT_PROMPT = "The quick brown fox"


@dataclass
class SmokeResult:
    """One route's outcome."""

    route: str
    text: str
    latency_s: float
    counted: TokenCount
    ttft_s: float | None = None
    acceptance_rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.counted.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.latency_s if self.latency_s > 0 else 0.0

    def line(self) -> str:
        parts = [f"{self.route}: {self.latency_s * 1000:.0f} ms",
                 f"{self.tokens} tokens (counted from {SOURCES[self.counted.source]})",
                 f"{self.tokens_per_s:.1f} tok/s"]
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:.0f} ms")
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.2f}")
        return " | ".join(parts) + f"\n    {self.text!r}"


def http_generate(http_url: str, model: str, payload: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    """POST /v2/models/<model>/generate (Triton's generate extension); returns the JSON response.

    A plain POST: tritonclient has no client for the generate extension, and Triton's HTTP infer endpoint
    (what tritonclient.http calls) refuses decoupled models such as the streaming ensemble."""
    req = urllib.request.Request(
        f"http://{http_url}/v2/models/{model}/generate", data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        hint = ""
        if "is not healthy" in body:  # python_backend r24.10: a stub missed its ~1 s health heartbeat
            hint = ("; Triton's Python backend reports a stub unhealthy when it crashed or was starved of CPU for "
                    "about a second (a heavily loaded host): check the server log, then re-run on a less busy host")
        raise ServeError(f"HTTP generate on {model} failed: {exc.code} {body}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServeError(f"HTTP generate on {model} failed: {exc}; is the server up at {http_url}?") from None


def _text(value: Any) -> str:
    """One request's value from a generate response (text_output is 1-D: a list holds output[0])."""
    return value[0] if isinstance(value, list) else str(value)


def count_tokens(repo: Path | None, text: str, server_counts: list[int] | None = None, *, streamed: bool = False,
                 stream_chunks: int = 0, retokenize: bool = False) -> TokenCount:
    """Output tokens of one route's answer as `pipeline.serving.token_count` counts them (the server's count when it
    reports one, else with the repository's tokenizer)."""
    tokenizer = load_tokenizer(tokenizer_dir_of(repo)) if repo is not None else None
    return count_output_tokens(server_counts=server_counts or (), streamed=streamed, stream_chunks=stream_chunks,
                               text=text, tokenizer=tokenizer, retokenize=retokenize)


def _server_counts(resp: dict[str, Any]) -> list[int]:
    """The server's token count in a generate response (`num_output_tokens`, else `sequence_length`), as a list
    (empty: none), as `pipeline.serving.token_count.server_count` reads a gRPC response."""
    name = next((n for n in ("num_output_tokens", "sequence_length") if n in resp), None)
    return [int(_text(resp[name]))] if name else []


def _counted_inputs(http_url: str, model: str) -> dict[str, Any]:
    """`return_num_output_tokens` when `model` takes it (the server then reports its own count)."""
    return {"return_num_output_tokens": True} if "return_num_output_tokens" in _inputs(http_url, model) else {}


def _grpc_inputs(prompt: str, max_tokens: int, stream: bool, extra: dict[str, Any]) -> list:
    import numpy as np
    import tritonclient.grpc as grpcclient

    inputs = []

    def add(name: str, value: np.ndarray, dtype: str) -> None:
        t = grpcclient.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        inputs.append(t)

    add("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES")
    add("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32")
    add("stream", np.array([[stream]], dtype=bool), "BOOL")
    add("exclude_input_in_output", np.array([[True]], dtype=bool), "BOOL")  # the completion only
    for name, value in extra.items():
        arr = np.array([[value]])
        dtype = {"b": "BOOL", "i": "INT32", "u": "UINT64", "f": "FP32"}[arr.dtype.kind]
        arr = arr.astype({"BOOL": bool, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32}[dtype])
        add(name, arr, dtype)
    return inputs


def _grpc_count(result) -> list[int]:
    """The server's token count in one gRPC response, as a list (empty: the response has none)."""
    n = server_count(result)
    return [] if n is None else [n]


def grpc_infer(grpc_url: str, model: str, prompt: str, max_tokens: int,
               **extra: Any) -> tuple[str, float, list[int]]:
    """One unary gRPC request (a non-decoupled route); returns (text, seconds, the server's token count if any)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url=grpc_url)
    try:
        t0 = time.perf_counter()
        result = client.infer(model, _grpc_inputs(prompt, max_tokens, False, extra), client_timeout=300)
        total = time.perf_counter() - t0
    except InferenceServerException as exc:
        raise ServeError(f"gRPC infer on {model} failed: {exc}") from None
    finally:
        client.close()
    out = result.as_numpy("text_output")
    text = out.reshape(-1)[0].decode() if out is not None and out.size else ""
    return text, total, _grpc_count(result)


def grpc_stream(grpc_url: str, model: str, prompt: str, max_tokens: int, stream: bool = True,
                **extra: Any) -> tuple[list[str], float, float, list[int]]:
    """Send one request over a gRPC stream; returns (text chunks, time to first chunk, total seconds, the server's
    token count of each response that has one)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()

    def callback(result=None, error=None):  # tritonclient calls it with keyword args result, error
        responses.put((result, error))

    inputs = _grpc_inputs(prompt, max_tokens, stream, extra)
    chunks: list[str] = []
    counts: list[int] = []
    ttft = None
    client = grpcclient.InferenceServerClient(url=grpc_url)
    try:
        client.start_stream(callback=callback)
        t0 = time.perf_counter()
        client.async_stream_infer(model, inputs, request_id="smoke-stream", enable_empty_final_response=True)
        while True:
            try:
                result, error = responses.get(timeout=300)
            except queue.Empty:
                raise ServeError(f"gRPC stream on {model}: no response within 300 s") from None
            if error is not None:
                raise ServeError(f"gRPC stream on {model} failed: {error}")
            out = result.as_numpy("text_output")
            if out is not None and out.size:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                chunks.append(out.reshape(-1)[0].decode())
            counts += _grpc_count(result)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        total = time.perf_counter() - t0
    finally:
        client.stop_stream()
        client.close()
    return chunks, ttft if ttft is not None else total, total, counts


@contextmanager
def _http_client(http_url: str, failure: Callable[[Exception], str]) -> Iterator[httpclient.InferenceServerClient]:
    """A tritonclient HTTP client for `http_url`; a failed call raises ServeError(failure(exc))."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(http_url, connection_timeout=30, network_timeout=30)
    try:
        yield client
    except (InferenceServerException, OSError) as exc:
        raise ServeError(failure(exc)) from None
    finally:
        client.close()


def _cannot_read(http_url: str, what: str) -> Callable[[Exception], str]:
    return lambda exc: f"cannot read {what} at {http_url}: {exc}"


def _decoupled(http_url: str, model: str) -> bool:
    with _http_client(http_url, _cannot_read(http_url, f"the config of {model}")) as client:
        cfg = client.get_model_config(model)
    return bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))


def _inputs(http_url: str, model: str) -> set[str]:
    with _http_client(http_url, _cannot_read(http_url, f"the metadata of {model}")) as client:
        return {i["name"] for i in client.get_model_metadata(model).get("inputs", [])}


def _models(http_url: str) -> set[str]:
    def failure(exc: Exception) -> str:
        return f"no Triton server answers at {http_url} ({exc}); start one with `invoke serve`"

    with _http_client(http_url, failure) as client:
        return {m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"}


def smoke_server(http_url: str, grpc_url: str, *, repo: Path | None = None, prompt: str = DEFAULT_PROMPT,
                 max_tokens: int = 24, num_draft_tokens: int | None = None,
                 out: Callable[[str], None] = print) -> list[SmokeResult]:
    """Run every route against a live server; raises ServeError on the first failure."""
    models = _models(http_url)
    if "ensemble" not in models and llmapi.MODEL in models and llmapi.is_llmapi(_inputs(http_url, llmapi.MODEL)):
        return smoke_llmapi(http_url, grpc_url, repo=repo, prompt=prompt, max_tokens=max_tokens, out=out)
    if "ensemble" not in models:
        raise ServeError(f"no ready 'ensemble' model on {http_url} (ready: {', '.join(sorted(models)) or 'none'})")
    results = [_http_greedy(http_url, repo, prompt, max_tokens)]
    out(results[-1].line())
    results.append(_grpc_ensemble(http_url, grpc_url, repo, prompt, max_tokens, out))
    out(results[-1].line())
    text, got = results[0].text, results[-1].text
    if got != text:  # per-token decoding can split multi-byte characters: a note, not a failure
        out(f"    note: gRPC text differs from the HTTP greedy text ({got!r} != {text!r})")
    if "tensorrt_llm_bls" in models and "tensorrt_llm_draft" in models:
        results.append(_http_draft_target(http_url, repo, prompt, max_tokens, num_draft_tokens))
        out(results[-1].line())
        spec_text = results[-1].text
        if spec_text != text:
            raise ServeError(f"draft-target output differs from target-only greedy output: {spec_text!r} != {text!r}")
        out("    draft-target output == target-only greedy output")
    return results


def _http_greedy(http_url: str, repo: Path | None, prompt: str, max_tokens: int) -> SmokeResult:
    """Greedy HTTP generate through the ensemble (after a one-token warm-up)."""
    counted = _counted_inputs(http_url, "ensemble")
    http_generate(http_url, "ensemble", {"text_input": prompt, "max_tokens": 1, "stream": False})  # warm-up
    greedy = {"text_input": prompt, "max_tokens": max_tokens, "stream": False, "top_k": 1, "temperature": 1.0,
              "exclude_input_in_output": True, **counted}
    t0 = time.perf_counter()
    resp = http_generate(http_url, "ensemble", greedy)
    latency = time.perf_counter() - t0
    text = _text(resp.get("text_output", ""))
    if not text.strip():
        raise ServeError(f"HTTP generate through the ensemble returned no text: {resp}")
    return SmokeResult("http ensemble (greedy)", text, latency, count_tokens(repo, text, _server_counts(resp)))


def _grpc_ensemble(http_url: str, grpc_url: str, repo: Path | None, prompt: str, max_tokens: int,
                   out: Callable[[str], None]) -> SmokeResult:
    """gRPC through the ensemble: streaming when `tensorrt_llm` is decoupled, unary otherwise."""
    counted = _counted_inputs(http_url, "ensemble")
    if _decoupled(http_url, "tensorrt_llm"):
        chunks, ttft, total, counts = grpc_stream(grpc_url, "ensemble", prompt, max_tokens, stream=True, **counted)
        if not chunks:
            raise ServeError("gRPC streaming through the ensemble produced no tokens")
        text = "".join(chunks)
        return SmokeResult("grpc ensemble (stream)", text, total,
                           count_tokens(repo, text, counts, streamed=True, stream_chunks=len(chunks)), ttft_s=ttft,
                           extra={"responses": len(chunks)})
    got, total, counts = grpc_infer(grpc_url, "ensemble", prompt, max_tokens, **counted)
    if not got:
        raise ServeError("gRPC infer through the ensemble returned no text")
    out("    tensorrt_llm is not decoupled (draft-target layout): the ensemble answers unary calls, no streaming")
    return SmokeResult("grpc ensemble (unary)", got, total, count_tokens(repo, got, counts))


def _http_draft_target(http_url: str, repo: Path | None, prompt: str, max_tokens: int,
                       num_draft_tokens: int | None) -> SmokeResult:
    """Greedy HTTP generate through the BLS draft-target route (after a two-token warm-up)."""
    payload = {"text_input": prompt, "max_tokens": max_tokens, "stream": False, "top_k": 1,
               "exclude_input_in_output": True, **_counted_inputs(http_url, "tensorrt_llm_bls")}
    if num_draft_tokens:
        payload["num_draft_tokens"] = num_draft_tokens
    http_generate(http_url, "tensorrt_llm_bls", {**payload, "max_tokens": 2})  # warm-up (draft + target)
    t0 = time.perf_counter()
    resp = http_generate(http_url, "tensorrt_llm_bls", payload)
    latency = time.perf_counter() - t0
    spec_text = _text(resp.get("text_output", ""))
    rate = float(_text(resp.get("acceptance_rate", 0.0)))
    return SmokeResult("http bls (draft-target)", spec_text, latency,
                       count_tokens(repo, spec_text, _server_counts(resp)),
                       acceptance_rate=rate,
                       extra={"accepted": resp.get("total_accepted_draft_tokens"),
                              "proposed": resp.get("total_draft_tokens")})


def smoke_llmapi(http_url: str, grpc_url: str, *, repo: Path | None, prompt: str, max_tokens: int,
                 out: Callable[[str], None] = print) -> list[SmokeResult]:
    """The LLM-API model's routes; raises ServeError when one fails or streaming disagrees with greedy."""
    results = [_llmapi_greedy(http_url, repo, prompt, max_tokens)]
    out(results[-1].line())
    if _decoupled(http_url, llmapi.MODEL):
        answer = llmapi.send(grpc_url, prompt, max_tokens, top_k=1, request_id="smoke-stream")
        results.append(SmokeResult("grpc tensorrt_llm (llmapi, stream)", answer.text, answer.total_s,
                                   count_tokens(repo, answer.text, retokenize=True), ttft_s=answer.ttft_s,
                                   extra={"responses": len(answer.texts)}))
        out(results[-1].line())
        if answer.text != results[0].text:
            raise ServeError(f"streamed llmapi text differs from the greedy HTTP text: {answer.text!r} != "
                             f"{results[0].text!r}")
    else:
        out("    tensorrt_llm is not decoupled: no streaming route")
    results.append(_llmapi_prefix_reuse(grpc_url, repo, prompt))
    out(results[-1].line() + f"\n    prefix cache: {results[-1].extra}")
    if not results[-1].extra.get("kv_cache_reused_block"):
        out("    note: the repeated prompt reused no KV block (block reuse off, or the prompt is under one block)")
    return results


def _llmapi_greedy(http_url: str, repo: Path | None, prompt: str, max_tokens: int) -> SmokeResult:
    """Greedy HTTP generate on the llmapi model with its perf metrics (after a one-token warm-up)."""
    greedy = {"text_input": prompt, "sampling_param_max_tokens": max_tokens, "sampling_param_top_k": 1,
              "sampling_param_return_perf_metrics": True, "return_finish_reason": True}
    http_generate(http_url, llmapi.MODEL, {**greedy, "sampling_param_max_tokens": 1})  # warm-up
    t0 = time.perf_counter()
    resp = http_generate(http_url, llmapi.MODEL, greedy)
    latency = time.perf_counter() - t0
    text = _text(resp.get("text_output", ""))
    if not text.strip():
        raise ServeError(f"HTTP generate on the llmapi model returned no text: {resp}")
    drafted = int(_text(resp.get("total_draft_tokens", 0)))
    return SmokeResult("http tensorrt_llm (llmapi, greedy)", text, latency, count_tokens(repo, text),
                       acceptance_rate=float(_text(resp["acceptance_rate"])) if drafted else None,
                       extra={"finish_reason": resp.get("finish_reason"), "proposed": drafted,
                              "accepted": resp.get("total_accepted_draft_tokens")})


def _llmapi_prefix_reuse(grpc_url: str, repo: Path | None, prompt: str) -> SmokeResult:
    """The same long prompt twice (one token each): the second's KV-cache metrics."""
    long_prompt = " ".join([prompt] * 24)
    llmapi.send(grpc_url, long_prompt, 1, streaming=False, top_k=1)
    answer = llmapi.send(grpc_url, long_prompt, 1, streaming=False, top_k=1, return_perf_metrics=True)
    keys = ("kv_cache_reused_block", "kv_cache_missed_block", "kv_cache_hit_rate")
    return SmokeResult("grpc tensorrt_llm (llmapi, repeated prompt)", answer.text, answer.total_s,
                       count_tokens(repo, answer.text, retokenize=True),
                       extra={k: answer.metrics.get(k) for k in keys})


def run_smoke(repo: Path | None = None, *, http_url: str | None = None, grpc_url: str | None = None,
              prompt: str = DEFAULT_PROMPT, max_tokens: int = 24, num_draft_tokens: int | None = None,
              ready_timeout_s: float = 300.0, out: Callable[[str], None] = print) -> list[SmokeResult]:
    """Smoke-test `repo` (starting and always stopping a server) or a running server (`http_url` + `grpc_url`)."""
    if http_url and grpc_url:
        return smoke_server(http_url, grpc_url, repo=repo, prompt=prompt, max_tokens=max_tokens,
                            num_draft_tokens=num_draft_tokens, out=out)
    if repo is None:
        raise ServeError("give a repository (--repo) or a running server (--http-url and --grpc-url)")

    with TritonServer(Path(repo), ready_timeout_s=ready_timeout_s) as server:
        out(f"server up on http {server.http_url}, grpc {server.grpc_url} (log {server.log_file})")
        return smoke_server(server.http_url, server.grpc_url, repo=Path(repo), prompt=prompt,
                            max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, out=out)
