"""smoke.http_generate error reporting against a local HTTP server that answers like Triton (no tritonserver)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from pipeline.core.errors import ServeError
from pipeline.serving.smoke import http_generate


@pytest.fixture
def triton_error_server():
    """127.0.0.1 server answering every POST with Triton's 400 for a stub that missed its health heartbeat."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server API)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"error": "Stub process 'tensorrt_llm_bls_0_0' is not healthy."}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_unhealthy_stub_error_keeps_tritons_message_and_explains_it(triton_error_server):
    with pytest.raises(ServeError) as info:
        http_generate(triton_error_server, "tensorrt_llm_bls", {"text_input": "x", "max_tokens": 2}, timeout=10)
    msg = str(info.value)
    assert msg.startswith("HTTP generate on tensorrt_llm_bls failed: 400 ")
    assert "Stub process 'tensorrt_llm_bls_0_0' is not healthy." in msg
    assert "starved of CPU" in msg and "server log" in msg and "\n" not in msg
