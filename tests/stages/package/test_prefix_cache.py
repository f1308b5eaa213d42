"""Prefix caching in the reference `tensorrt_llm` backend on a real tritonserver: a shared-prefix
workload reuses blocks (per-request `kv_cache_reused_blocks` / `kv_cache_alloc_total_blocks` with the C++ backend's
meaning; hit ratio on Triton's metrics endpoint in the C++ backend's `nv_trt_llm_kv_cache_block_metrics`), skips the
prefill of the reused blocks (prompt tokens actually run, `nv_trt_llm_context_token_metrics`), keeps greedy outputs
identical to a full prefill, and is faster to the first token; distinct prompts reuse nothing."""

from __future__ import annotations

import random
import re
import statistics
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
TPB = 32  # tokens_per_block of the tiny build
PREFIX = 192  # 6 full blocks
SUFFIX = 16


@pytest.fixture(scope="module")
def server(tiny_reference_repo):
    from pipeline.serving.serve import TritonServer

    repo = tiny_reference_repo("prefix-cache")
    cfg = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert re.search(r'key: "tokens_per_block"\s*value \{\s*string_value: "32"', cfg)
    srv = TritonServer(repo, ready_timeout_s=300)
    srv.start()
    yield srv
    srv.stop()


def infer(server, prompt, out_len=4, **flags):
    """One unary tensorrt_llm request (HTTP) with perf metrics: (output ids, {perf name: int})."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    data = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
            "request_output_len": np.array([[out_len]], np.int32),
            "return_perf_metrics": np.array([[True]]), "exclude_input_in_output": np.array([[True]])}
    for name, value in flags.items():
        data[name] = np.array([[value]])
    inputs = []
    for name, arr in data.items():
        inp = httpclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        result = client.infer("tensorrt_llm", inputs)
    finally:
        client.close()
    length = int(result.as_numpy("sequence_length").reshape(-1)[0])
    perf = {name: int(result.as_numpy(name).reshape(-1)[0]) for name in (
        "kv_cache_reused_blocks", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
        "first_scheduled_time_ns", "first_token_time_ns")}
    return result.as_numpy("output_ids").reshape(-1)[:length].tolist(), perf


def metrics(server, model="tensorrt_llm") -> dict[str, float]:
    """The prefix-cache gauges of `model`: 'block:<kv_cache_block_type>' and 'tokens:<context_token_type>'."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for family, label, short in (("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "block"),
                                 ("nv_trt_llm_reference_kv_cache_metrics", "kv_cache_block_type", "block"),
                                 ("nv_trt_llm_context_token_metrics", "context_token_type", "tokens")):
        for line in text.splitlines():
            if line.startswith(family + "{") and f'model="{model}"' in line:
                kind = re.search(rf'{label}="(\w+)"', line).group(1)
                out[f"{short}:{kind}"] = float(line.rsplit(" ", 1)[1])
    return out


def delta(after, before, key):
    return after[key] - before.get(key, 0.0)


def tokens(rng, n):
    return [rng.randrange(3, 1000) for _ in range(n)]


def test_block_metrics_use_the_cpp_backend_names(server):
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        cpp = {re.search(r'kv_cache_block_type="(\w+)"', line).group(1) for line in r.read().decode().splitlines()
               if line.startswith("nv_trt_llm_kv_cache_block_metrics{") and 'model="tensorrt_llm"' in line}
    assert cpp == {"max", "free", "used", "tokens_per", "reused", "fraction"}  # the C++ family holds its labels only
    m = metrics(server)
    for kind in ("max", "free", "used", "tokens_per", "reused", "fraction",  # the C++ backend's
                 "alloc_total", "alloc_new", "missed", "cache_hit_rate"):  # KvCacheStats' other fields
        assert f"block:{kind}" in m, sorted(m)
    assert m["block:tokens_per"] == TPB and m["block:max"] == 8 * 16  # max_batch_size x blocks of max_seq_len
    assert m["block:used"] == 0 and m["block:free"] == m["block:max"]  # nothing in flight
    assert "tokens:computed" in m and "tokens:reused" in m


def test_shared_prefix_reuses_blocks_skips_prefill_and_keeps_outputs(server):
    rng = random.Random(16)
    prefix = tokens(rng, PREFIX)
    prompts = [prefix + tokens(rng, SUFFIX) for _ in range(6)]
    before = metrics(server)
    results = [infer(server, p) for p in prompts]
    after = metrics(server)
    first, rest = results[0][1], [perf for _, perf in results[1:]]
    assert first["kv_cache_reused_blocks"] == 0 and first["kv_cache_alloc_total_blocks"] == 7
    assert first["kv_cache_alloc_new_blocks"] <= 7
    for perf in rest:  # 6 of the 7 context blocks come from the cache (the last token is always computed)
        assert perf["kv_cache_reused_blocks"] == PREFIX // TPB, perf
        assert perf["kv_cache_alloc_total_blocks"] == 1, perf
    reused, missed = delta(after, before, "block:reused"), delta(after, before, "block:missed")
    assert reused == 5 * 6 and missed == 7 + 5
    assert delta(after, before, "block:alloc_total") == missed
    ratio = reused / (reused + missed)
    assert ratio > 0.5 and after["block:cache_hit_rate"] > 0
    computed = delta(after, before, "tokens:computed")
    assert computed == sum(len(p) for p in prompts) - reused * TPB  # prefill skipped for the reused blocks
    assert delta(after, before, "tokens:reused") == reused * TPB
    # identical to a full prefill (context logits force one) and to the cold run
    for prompt, (ids, _) in zip(prompts, results):
        full, perf = infer(server, prompt, return_context_logits=True)
        assert perf["kv_cache_reused_blocks"] == 0 and full == ids
    print(f"\nshared prefix: hit ratio {ratio:.2f}, prefill tokens computed {int(computed)} of "
          f"{sum(len(p) for p in prompts)}")


def test_warm_prefix_is_faster_to_first_token(server):
    rng = random.Random(7)
    cold, warm = [], []
    for _ in range(4):
        prefix = tokens(rng, PREFIX)
        for target in (cold, warm):  # the first sees a new prefix, the second the same one, cached
            _, perf = infer(server, prefix + tokens(rng, SUFFIX), out_len=1)
            target.append((perf["first_token_time_ns"] - perf["first_scheduled_time_ns"]) / 1e6)
            assert perf["kv_cache_reused_blocks"] == (0 if target is cold else PREFIX // TPB)
    print(f"\nTTFT (server, ms): cold {[round(x, 1) for x in cold]}, warm {[round(x, 1) for x in warm]}")
    assert statistics.median(warm) < statistics.median(cold)


def test_distinct_prompts_reuse_nothing(server):
    rng = random.Random(99)
    before = metrics(server)
    for _ in range(5):
        _, perf = infer(server, tokens(rng, PREFIX + SUFFIX))
        assert perf["kv_cache_reused_blocks"] == 0 and perf["kv_cache_alloc_total_blocks"] == 7
    after = metrics(server)
    assert delta(after, before, "block:reused") == 0
    assert delta(after, before, "block:missed") == 35
    print("\nno shared prefix: hit ratio 0.00")


def test_the_pool_is_bounded_and_evicts_least_recently_used(server):
    rng = random.Random(5)
    prefix = tokens(rng, PREFIX)
    infer(server, prefix + tokens(rng, SUFFIX))
    _, perf = infer(server, prefix + tokens(rng, SUFFIX))
    assert perf["kv_cache_reused_blocks"] == PREFIX // TPB
    before = metrics(server)
    for _ in range(30):  # 30 x 6 stored blocks > the 128-block pool: the oldest prefix goes
        infer(server, tokens(rng, PREFIX + SUFFIX), out_len=1)
    after = metrics(server)
    _, perf = infer(server, prefix + tokens(rng, SUFFIX))
    assert perf["kv_cache_reused_blocks"] == 0 and perf["kv_cache_alloc_new_blocks"] == 0  # evicted; slots recycled
    assert after["block:alloc_new"] <= after["block:max"]  # never more slots than the pool has
    assert delta(after, before, "block:alloc_total") == 30 * 7
    assert after["block:used"] == 0


def test_block_pool_evicts_leaves_first(monkeypatch):
    """The pool itself (model.py imported with a stand-in for triton_python_backend_utils): an evicted chain loses
    its newest blocks first, so its root prefix stays reusable."""
    import importlib.util
    import sys
    import types

    import torch

    stub = types.ModuleType("triton_python_backend_utils")
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    stub.Logger = types.SimpleNamespace(log_warn=print, log_info=print, log_error=print)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    templates = Path(__file__).resolve().parents[3] / "pipeline" / "templates" / "triton"
    monkeypatch.syspath_prepend(str(templates))  # request_limits.py, packaged beside model.py
    path = templates / "tensorrt_llm" / "1" / "model.py"
    spec = importlib.util.spec_from_file_location("ref_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Holder:
        keys, private, kv_stats = None, 0, None

    def run(pool, prompt):
        holder = Holder()
        pool.acquire(holder, prompt, reuse=True)
        kv = torch.zeros(1, 1, len(prompt), 2)
        pool.store(holder, prompt, [(kv, kv)])
        pool.release(holder)
        return holder.kv_stats

    pool = mod.BlockPool(4, 2, True)
    a, b = [1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12]
    assert run(pool, a) == {"reused": 0, "alloc_total": 4, "alloc_new": 4}  # 3 full blocks stored
    assert run(pool, b) == {"reused": 0, "alloc_total": 3, "alloc_new": 0}  # a's partial slot + 2 evicted
    assert run(pool, a)["reused"] == 1  # a's root survived: its leaves went first
    assert len(pool.blocks) + pool.private <= pool.capacity and pool.used() == 0
