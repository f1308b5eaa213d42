"""bench's OpenAI route against a small OpenAI-style server on 127.0.0.1 (standard library, streams SSE): TTFT from
the first event with text, output tokens from `usage`, prefix hits from `cached_tokens`, the chat fallback, and
Dynamo's metrics as the hit ratio's other source."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.core.errors import BenchError
from pipeline.serving import bench
from pipeline.serving.openai_route import CHAT, COMPLETIONS, is_openai_url


def _server(endpoints: set[str], cached: int):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path not in endpoints:
                return self._send(404, b'{"error": "no such endpoint"}')
            n, prompt = req["max_tokens"], 100
            usage = {"prompt_tokens": prompt, "completion_tokens": n,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            events = [{"choices": [{"delta": {"role": "assistant"}}]}] if self.path == CHAT else []
            for i in range(n):
                text = f" t{i}"
                events.append({"choices": [{"text": text} if self.path == COMPLETIONS else {"delta": {"content": text}}]})
            events.append({"choices": [], "usage": usage})
            body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            time.sleep(0.01)
            self._send(200, body, "text/event-stream")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("endpoints", [{COMPLETIONS, CHAT}, {CHAT}])
def test_openai_route_reports_ttft_tokens_and_cached_prefix(endpoints):
    server = _server(endpoints, cached=64)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        report = bench.run_bench(bench.ServerUrls(url), bench.WorkloadOptions(concurrency=(1, 3), requests_per_level=6,
                                                                              max_tokens=5))
    finally:
        server.shutdown()
    assert report.triton_model == "m" and report.streaming and report.failed == 0
    for lv in report.levels:
        assert lv.requests == 6 and lv.output_tokens == 30
        assert lv.ttft_ms_p50 is not None and lv.ttft_ms_p50 <= lv.latency_ms_p50
        assert lv.prefix_cache_hit_ratio == pytest.approx(0.64)
    assert report.prefix_cache_source == "per-request outputs"


def test_openai_route_refuses_what_it_cannot_do():
    assert is_openai_url("http://127.0.0.1:8000") and not is_openai_url("127.0.0.1:8001")
    with pytest.raises(BenchError, match="draft"):
        bench.run_bench(bench.ServerUrls("http://127.0.0.1:9"), bench.WorkloadOptions(speculation="off"))
    with pytest.raises(BenchError, match="no OpenAI-compatible server"):
        bench.run_bench(bench.ServerUrls("http://127.0.0.1:9"))
    with pytest.raises(BenchError, match="127.0.0.1"):
        bench.run_bench(bench.ServerUrls("http://10.0.0.1:8000"))


def test_dynamo_metrics_give_the_fleet_hit_ratio():
    def metrics(cached: float, prefill: float, decode: float):
        return bench.parse_metrics(
            f'dynamo_frontend_cached_tokens_sum{{model="m"}} {cached}\n'
            f'dynamo_component_router_input_sequence_tokens_sum{{phase="prefill",worker_id="a"}} {prefill / 2}\n'
            f'dynamo_component_router_input_sequence_tokens_sum{{phase="prefill",worker_id="b"}} {prefill / 2}\n'
            f'dynamo_component_router_input_sequence_tokens_sum{{phase="decode",worker_id="c"}} {decode}\n')

    before, after = metrics(100, 400, 400), metrics(900, 1400, 1400)
    counters = [bench.dynamo_token_counters(m) for m in (before, after)]
    assert bench.metrics_hit_ratio(*counters) == pytest.approx(0.8)  # (900-100) / (1400-400)
    assert bench.dynamo_token_counters(bench.parse_metrics("other_metric 1\n")) == {}
