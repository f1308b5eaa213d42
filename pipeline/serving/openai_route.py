"""The bench's route to an OpenAI-compatible server (NVIDIA Dynamo's frontend, trtllm-serve) on 127.0.0.1.

Each client keeps one HTTP connection and posts `/v1/completions` (else `/v1/chat/completions`, when the server has
no completions endpoint), streaming server-sent events when the route streams: the time to first token is the
arrival of the first event carrying text, output tokens are the server's `usage.completion_tokens` (asked for with
`stream_options.include_usage`), else one per event with text, and the prefix-cache hit of a request is its
`usage.prompt_tokens_details.cached_tokens` over its `prompt_tokens` (Dynamo fills it from the worker's cache).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import BenchError
from pipeline.serving.sample import RequestSample
from pipeline.serving.token_count import count_output_tokens

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODELS = "/v1/models"


def is_openai_url(url: str) -> bool:
    """An `http://` address names an OpenAI-compatible server; a bare `127.0.0.1:PORT` Triton's gRPC port."""
    return url.startswith("http://")


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise BenchError(f"--url {url}: expected http://127.0.0.1:PORT (the OpenAI server's address, no path)")
    return parts.hostname, parts.port or 80


@dataclass
class _Reply:
    """One request's response: the texts of its events, when the first text came and the server's usage."""

    status: int = 0
    texts: list[str] = field(default_factory=list)
    first_text_s: float | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class OpenAIRoute:
    """How the clients call an OpenAI-compatible server: its address, the served model, the endpoint
    (`COMPLETIONS` or `CHAT`), streaming or not, the per-request timeout and the tokenizer (output token counts
    when the server reports none; None without one)."""

    url: str
    model: str
    endpoint: str
    stream: bool
    timeout_s: float
    tokenizer: Any = None

    @classmethod
    def connect(cls, url: str, model: str | None, *, stream: bool, timeout_s: float, tokenizer: Any = None
                ) -> OpenAIRoute:
        """The route to the server at `url`: `model` (default: the first `/v1/models` lists) on the completions
        endpoint, else the chat endpoint.

        Raises:
            BenchError: no server answers at `url`, it serves no model (or not `model`), or neither endpoint works.
        """
        host, port = _host_port(url)
        try:
            status, body = _get(host, port, MODELS, timeout_s=10.0)
        except OSError as exc:
            raise BenchError(f"no OpenAI-compatible server at {url} ({exc}); start one (Dynamo's frontend, "
                             "trtllm-serve) or pass Triton's gRPC address as 127.0.0.1:PORT") from None
        served = [m.get("id") for m in (body.get("data") or [])] if status == 200 else []
        if not served:
            raise BenchError(f"{url}{MODELS} lists no model (HTTP {status}); wait for the workers to register")
        if model is not None and model not in served:
            raise BenchError(f"model '{model}' is not served at {url} (it serves {', '.join(map(str, served))}); "
                             "pass --model-name")
        chosen = model or str(served[0])
        for endpoint in (COMPLETIONS, CHAT):
            route = cls(url, chosen, endpoint, stream, timeout_s, tokenizer)
            with OpenAIClient(route) as client:
                reply = client.post("probe", 1)
            if reply.status != 404:
                if reply.error:
                    raise BenchError(f"{url}{endpoint} refused a 1-token request: {reply.error}")
                return route
        raise BenchError(f"{url} serves neither {COMPLETIONS} nor {CHAT}; point --url at an OpenAI-compatible server")

    def worker(self, mode: str) -> OpenAIClient:
        """A client for one of the level's concurrent streams (`mode` "server": no per-request draft length)."""
        return OpenAIClient(self)


def _get(host: str, port: int, path: str, *, timeout_s: float) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw or b"{}")
        except ValueError:
            return r.status, {}
    finally:
        conn.close()


class OpenAIClient:
    """One HTTP connection; sends requests one after another (a bench worker)."""

    def __init__(self, route: OpenAIRoute):
        self.route = route
        host, port = _host_port(route.url)
        self.conn = http.client.HTTPConnection(host, port, timeout=route.timeout_s)

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def payload(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        r = self.route
        body: dict[str, Any] = {"model": r.model, "max_tokens": max_tokens, "temperature": 0.0, "stream": r.stream}
        if r.endpoint == CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if r.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def post(self, prompt: str, max_tokens: int) -> _Reply:
        """Send one request and read its whole response (events as they come when streaming)."""
        reply, t0 = _Reply(), time.perf_counter()
        try:
            self.conn.request("POST", self.route.endpoint, json.dumps(self.payload(prompt, max_tokens)),
                              {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            reply.status = resp.status
            if resp.status != 200:
                reply.error = f"HTTP {resp.status}: {resp.read()[:300].decode('utf-8', 'replace').strip()}"
            elif self.route.stream:
                self._events(resp, reply, t0)
                resp.read()  # the rest of the chunked body, so that the connection takes the next request
            else:
                self._take(json.loads(resp.read()), reply, t0)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.conn.close()  # reconnects on the next request
            reply.error = f"{type(exc).__name__}: {exc}"
        return reply

    def _events(self, resp: http.client.HTTPResponse, reply: _Reply, t0: float) -> None:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                reply.error = str(event["error"])[:300]
                break
            self._take(event, reply, t0)

    def _take(self, doc: dict[str, Any], reply: _Reply, t0: float) -> None:
        for choice in doc.get("choices") or []:
            text = choice.get("text") if self.route.endpoint == COMPLETIONS else (
                (choice.get("delta") or choice.get("message") or {}).get("content"))
            if text:
                if reply.first_text_s is None:
                    reply.first_text_s = time.perf_counter() - t0
                reply.texts.append(text)
        if doc.get("usage"):
            reply.usage = doc["usage"]

    def request(self, prompt: str, max_tokens: int, rid: str) -> RequestSample:
        """One bench request, measured."""
        t0 = time.perf_counter()
        reply = self.post(prompt, max_tokens)
        sample = RequestSample(ok=reply.error is None, latency_s=time.perf_counter() - t0, error=reply.error)
        if not sample.ok:
            return sample
        usage = reply.usage or {}
        completion = usage.get("completion_tokens")
        c = count_output_tokens(server_counts=[int(completion)] if completion else [], streamed=self.route.stream,
                                stream_chunks=len(reply.texts), text="".join(reply.texts),
                                tokenizer=self.route.tokenizer)
        sample.output_tokens, sample.token_source = c.tokens, c.source
        if self.route.stream and reply.first_text_s is not None:
            sample.ttft_s, sample.ttft_source = reply.first_text_s, "stream"
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        prompt_tokens = usage.get("prompt_tokens")
        if cached is not None and prompt_tokens:  # tokens, not blocks: the ratio is what the bench reports
            sample.reused_blocks, sample.total_blocks = int(cached), int(prompt_tokens) - int(cached)
        return sample
