"""Load-gated speculation in tensorrt_llm_bls on a real tritonserver: with
`max_batch_for_speculation` 1, a lone draft-target request speculates; with 4 concurrent ones some go target-only
(`total_draft_tokens` 0); every text equals target-only greedy; the decisions show on Triton's metrics endpoint."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow
PROMPTS = ["The quick brown fox", "Once upon a time", "The little cat sat on", "Every morning the bee"]
CAP = 1


@pytest.fixture(scope="module")
def server(tiny_reference_repo):
    from pipeline.serving.serve import TritonServer
    from pipeline.stages.package import pbtxt

    repo = tiny_reference_repo("spec-gate")
    path = repo / "tensorrt_llm_bls" / "config.pbtxt"
    cfg = pbtxt.read(path)
    assert pbtxt.parameter(cfg, "max_batch_for_speculation") == "8"  # the spec's default cap, packaged
    pbtxt.set_parameters(cfg, {"max_batch_for_speculation": CAP})
    pbtxt.write(path, cfg)
    srv = TritonServer(repo, ready_timeout_s=300)
    srv.start()
    yield srv
    srv.stop()


def generate(server, prompt, max_tokens, k):
    payload = {"text_input": prompt, "max_tokens": max_tokens, "top_k": 1, "num_draft_tokens": k,
               "exclude_input_in_output": True}
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/tensorrt_llm_bls/generate",
                                 data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        body = json.loads(r.read())
    text = body["text_output"]
    return (text[0] if isinstance(text, list) else text), int(body["total_draft_tokens"])


def settled_in_flight(server, timeout: float = 5.0) -> float:
    """The in-flight gauge once it stops moving: the BLS lowers it just after sending a request's last response, so
    a scrape right after the client got that response may still count the request."""
    deadline = time.monotonic() + timeout
    while (value := counters(server)["state:in_flight"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def counters(server) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        found = re.match(r'nv_trt_llm_speculation_(\w+)\{.*?(speculation_decision|draft_token_type|'
                         r'speculation_state_type)="(\w+)".*\} (\S+)$', line)
        if found and 'model="tensorrt_llm_bls"' in line:
            out[f"{found.group(1)}:{found.group(3)}"] = float(found.group(4))
    return out


def test_alone_a_request_speculates(server):
    before = counters(server)
    assert before["state:max_batch_for_speculation"] == CAP
    for prompt in PROMPTS[:2]:
        target, drafted = generate(server, prompt, 16, 0)
        assert drafted == 0
        text, drafted = generate(server, prompt, 16, 4)
        assert drafted > 0 and text == target
    after = counters(server)
    assert after["requests:speculative"] - before.get("requests:speculative", 0) == 2
    assert after["draft_tokens:proposed"] > before.get("draft_tokens:proposed", 0)
    assert settled_in_flight(server) == 0


def test_above_the_cap_requests_go_target_only_with_the_same_text(server):
    targets = {p: generate(server, p, 96, 0)[0] for p in PROMPTS}
    before = counters(server)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: generate(server, p, 96, 4), PROMPTS))
    after = counters(server)
    drafted = [d for _, d in results]
    assert any(d == 0 for d in drafted), drafted  # over the cap: target-only
    assert [t for t, _ in results] == [targets[p] for p in PROMPTS]
    spec = after["requests:speculative"] - before.get("requests:speculative", 0)
    only = after["requests:target_only"] - before.get("requests:target_only", 0)
    assert spec + only == len(PROMPTS) and only == sum(1 for d in drafted if d == 0) >= 1
    assert settled_in_flight(server) == 0
    print(f"\n4 concurrent, cap {CAP}: {int(spec)} speculated, {int(only)} target-only")
