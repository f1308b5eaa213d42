"""Benchmark a running Triton repo (or any OpenAI-compatible server: `openai_route`): concurrency sweep, TTFT, time
per output token, tok/s, p50/p99, $ per 1M tokens.

Requests go over gRPC streams (one per concurrent client) to the ensemble — or to the BLS model for draft-target
speculation, or to the LLM-API `tensorrt_llm` model of a runtime-pytorch repository — streaming when the route is
decoupled, so the time to first token is the arrival of the first
streamed response. Output tokens are what the server says it generated (`num_output_tokens`, else
`sequence_length`) when the model returns them, else one token per streamed response, else the repo's tokenizer
on the text. A run in which any request failed ends with `RequestsFailed` (exit code 5) after the report. The speculation acceptance rate and prefix-cache hit ratio come from the per-request outputs
(`total_accepted_draft_tokens`/`total_draft_tokens`, `kv_cache_reused_blocks` (llmapi: `kv_cache_reused_block`) /
`kv_cache_alloc_total_blocks`) or
Triton's metrics endpoint when exported; otherwise they are reported as n/a. Only 127.0.0.1 is ever contacted, and
every level is bounded by a request count and a time budget, and opens min(concurrency, requests) clients. Every
level replays the same requests (`plan_workload`, named by `workload_sha256`), each asking for exactly its output
length where the route takes `min_tokens`; every prompt is planned and checked against the build's limits (with
the build's tokenizer) before the first request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.artifacts import replace_file
from pipeline.core.errors import BenchError, PipelineError, RequestsFailed, RunError
from pipeline.core.gpus import gpu_price
from pipeline.core.local_url import check_local
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.core.table import format_table
from pipeline.planning.perf_model import HIT_RATIO_WARNING
from pipeline.serving import openai_route
from pipeline.serving.dataset import DatasetRequest, load_dataset
from pipeline.serving.foreground import built_repo
from pipeline.serving.llmapi import client as llmapi
from pipeline.serving.sample import RequestSample
from pipeline.serving.serve import TritonServer
from pipeline.serving.token_count import SOURCES as TOKEN_SOURCES
from pipeline.serving.token_count import (PROMPT_CHUNK_CHARS, count_output_tokens, load_tokenizer, prompt_tokens,
                                           server_count)
from pipeline.stages.package import llmapi_yaml, pbtxt

MAX_CONCURRENCY = 4096  # clients per level; each is one gRPC stream and one thread, opened only for requests that exist
MAX_REQUESTS = 100_000  # requests per level
MAX_REQUEST_RATE = 1e6  # requests per second (Poisson arrivals)
SHARED_PREFIX = (
    "You are a concise assistant for an infrastructure team. Answer in one short paragraph and avoid lists. "
)
QUESTIONS = (
    "Explain what a key-value cache does during text generation.",
    "Why does quantization to eight-bit floating point reduce memory traffic?",
    "Describe how a draft model speeds up decoding.",
    "What limits the throughput of a memory-bound decoder?",
    "How does batching many requests change latency and throughput?",
    "What is tensor parallelism and when is it needed?",
    "Why should an engine be rebuilt for a different GPU architecture?",
    "What does a model repository contain for a serving system?",
)


# ---------------------------------------------------------------------------------------------------------------
# Statistics (pure).


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """`numpy.percentile` (linear interpolation) of the values that are not None; None for no values."""
    xs = [v for v in values if v is not None]
    return _percentile(xs, q) if xs else None


def _percentile(xs: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(xs, q))


def cost_per_1m_tokens(tokens_per_s: float, *, gpus: int, price_per_gpu_hour: float) -> float | None:
    """USD per 1M output tokens at a sustained rate."""
    if tokens_per_s <= 0:
        return None
    return gpus * price_per_gpu_hour / 3600.0 / tokens_per_s * 1e6


def ratio(num: Iterable[int | None], den: Iterable[int | None]) -> float | None:
    n = [x for x in num if x is not None]
    d = [x for x in den if x is not None]
    if not d or sum(d) <= 0:
        return None
    return sum(n) / sum(d)


def speculated_share(samples) -> float | None:
    """Share of the requests that took the draft path (`total_draft_tokens` > 0) among those reporting it."""
    flags = [s.speculated for s in samples if s.speculated is not None]
    return sum(flags) / len(flags) if flags else None


def cold_warm_ttft(samples) -> tuple[float | None, float | None]:
    """Median TTFT (s) of requests that reused no prefix-cache block (cold) and of those that reused some (warm)."""
    known = [s for s in samples if s.reused_blocks is not None and s.ttft_s is not None]
    return (percentile((s.ttft_s for s in known if s.reused_blocks == 0), 50),
            percentile((s.ttft_s for s in known if s.reused_blocks > 0), 50))


def block_hit_ratio(samples) -> float | None:
    """Reused / (reused + newly allocated) context blocks: `kv_cache_alloc_total_blocks` counts the misses only
    (the C++ backend's KVCacheManager), so the blocks a prompt needed are reused + alloc_total."""
    pairs = [(s.reused_blocks, s.total_blocks) for s in samples
             if s.reused_blocks is not None and s.total_blocks is not None]
    needed = sum(r + t for r, t in pairs)
    return sum(r for r, _ in pairs) / needed if needed > 0 else None


@dataclass
class LevelStats:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    tpot_ms_p50: float | None
    tpot_ms_p99: float | None
    latency_ms_p50: float | None
    latency_ms_p99: float | None
    cost_per_1m_output_tokens_usd: float | None
    acceptance_rate: float | None
    prefix_cache_hit_ratio: float | None
    first_error: str | None = None
    speculation: str = "server"  # "server" (the route's default draft length) | "off" (num_draft_tokens 0)
    speculated_share: float | None = None
    ttft_ms_cold_p50: float | None = None
    ttft_ms_warm_p50: float | None = None
    tpot_ms_p95: float | None = None
    request_rate: float | None = None  # Poisson arrivals per second (None: closed loop, each client sends at once)
    workload_sha256: str | None = None  # the level's requests (`workload_sha256`): equal across levels and arms
    aiperf: dict[str, Any] | None = None  # `--second-opinion aiperf`: its figures (`pipeline.serving.aiperf.AiperfLevel`)


def summarize(
    concurrency: int, samples: list[RequestSample], wall_s: float, *, gpus: int, price_per_gpu_hour: float,
    speculation: str = "server",
) -> LevelStats:
    ok = [s for s in samples if s.ok]
    tokens = sum(s.output_tokens for s in ok)
    tok_s = tokens / wall_s if wall_s > 0 else 0.0

    def ms(v: float | None) -> float | None:
        return round(v * 1000.0, 3) if v is not None else None

    cost = cost_per_1m_tokens(tok_s, gpus=gpus, price_per_gpu_hour=price_per_gpu_hour)
    errors = [s for s in samples if not s.ok]
    cold, warm = cold_warm_ttft(ok)
    return LevelStats(
        concurrency=concurrency,
        requests=len(samples),
        errors=len(errors),
        wall_s=round(wall_s, 4),
        output_tokens=tokens,
        output_tokens_per_s=round(tok_s, 3),
        requests_per_s=round(len(ok) / wall_s, 4) if wall_s > 0 else 0.0,
        ttft_ms_p50=ms(percentile((s.ttft_s for s in ok), 50)),
        ttft_ms_p99=ms(percentile((s.ttft_s for s in ok), 99)),
        tpot_ms_p50=ms(percentile((s.tpot_s for s in ok), 50)),
        tpot_ms_p99=ms(percentile((s.tpot_s for s in ok), 99)),
        latency_ms_p50=ms(percentile((s.latency_s for s in ok), 50)),
        latency_ms_p99=ms(percentile((s.latency_s for s in ok), 99)),
        cost_per_1m_output_tokens_usd=round(cost, 4) if cost is not None else None,
        acceptance_rate=_round(ratio((s.accepted_draft_tokens for s in ok), (s.draft_tokens for s in ok))),
        prefix_cache_hit_ratio=_round(block_hit_ratio(ok)),
        first_error=errors[0].error if errors else None,
        speculation=speculation,
        speculated_share=_round(speculated_share(ok)),
        ttft_ms_cold_p50=ms(cold),
        ttft_ms_warm_p50=ms(warm),
        tpot_ms_p95=ms(percentile((s.tpot_s for s in ok), 95)),
    )


def length_stats(lengths: Iterable[int]) -> dict[str, float] | None:
    """Count, mean, min, p50, p90, p99 and max of token lengths; None for none."""
    xs = list(lengths)
    if not xs:
        return None
    stats = {"count": len(xs), "mean": round(sum(xs) / len(xs), 2), "min": min(xs)}
    stats |= {f"p{q}": round(_percentile(xs, q), 2) for q in (50, 90, 99)}
    return stats | {"max": max(xs)}


def _round(v: float | None, n: int = 4) -> float | None:
    return round(v, n) if v is not None else None


# ---------------------------------------------------------------------------------------------------------------
# Metrics endpoint.

_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+([-+0-9.eE]+|NaN|[+-]?Inf)\s*$")


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text -> {(name, labels): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line.strip())
        if not m:
            continue
        name, labels, value = m.groups()
        pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        try:
            out[(name, pairs)] = float(value)
        except ValueError:
            continue
    return out


KV_BLOCK_FAMILIES = ("nv_trt_llm_kv_cache_block_metrics",  # the C++ backend's
                     "nv_trt_llm_reference_kv_cache_metrics")  # the reference backend's other KvCacheStats fields


def kv_block_counters(metrics: dict[tuple[str, frozenset], float], model: str = "tensorrt_llm") -> dict[str, float]:
    """The KV block gauges of `model` (the target; the draft exports its own) by kv_cache_block_type."""
    out: dict[str, float] = {}
    for (name, labels), value in metrics.items():
        if name not in KV_BLOCK_FAMILIES or dict(labels).get("model", model) != model:
            continue
        kind = dict(labels).get("kv_cache_block_type")
        if kind:
            out[kind] = out.get(kind, 0.0) + value
    return out


DYNAMO_CACHED = "dynamo_frontend_cached_tokens_sum"  # prompt tokens found cached on the worker each request went to
DYNAMO_PROMPT = "dynamo_component_router_input_sequence_tokens_sum"  # prompt tokens routed, per worker and phase


def dynamo_token_counters(metrics: dict[tuple[str, frozenset], float]) -> dict[str, float]:
    """Dynamo's frontend counters as reused/missed prompt tokens, over the whole fleet (a prefill/decode pair counts
    its prompt once, at the prefill); {} when the endpoint exports neither."""
    cached = [v for (name, _), v in metrics.items() if name == DYNAMO_CACHED]
    routed = [v for (name, labels), v in metrics.items()
              if name == DYNAMO_PROMPT and dict(labels).get("phase") != "decode"]
    if not cached or not routed:
        return {}
    return {"reused": sum(cached), "missed": sum(routed) - sum(cached)}


def metrics_hit_ratio(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Prefix-cache hit ratio over a run from the backend's KV block counters, when it exports reuse and misses."""
    if "cache_hit_rate" in after and "reused" not in after:
        return after["cache_hit_rate"]
    miss_key = next((k for k in ("missed", "alloc_new", "new") if k in after), None)
    if "reused" not in after or miss_key is None:
        return None
    reused = after["reused"] - before.get("reused", 0.0)
    missed = after[miss_key] - before.get(miss_key, 0.0)
    total = reused + missed
    return reused / total if total > 0 else None


def scrape_metrics(url: str, timeout: float = 5.0) -> dict[tuple[str, frozenset], float] | None:
    check_local(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return parse_metrics(r.read().decode("utf-8", "replace"))
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Report.


@dataclass
class BenchReport:
    url: str
    triton_model: str  # the Triton model called (ensemble, tensorrt_llm_bls, the LLM-API tensorrt_llm)
    streaming: bool
    max_tokens: int
    requests_per_level: int
    gpus: int
    gpu_price_per_hour: float
    levels: list[LevelStats] = field(default_factory=list)
    gpu_price_source: str = "given"  # pipeline.core.gpus.gpu_price: flag/spec, $PIPELINE_GPU_PRICE or the GPU's default
    prefix_cache_hit_ratio: float | None = None
    prefix_cache_source: str = "n/a"
    acceptance_rate: float | None = None
    speculation_mode: str | None = None  # the spec's (bench_spec): draft-target | ngram
    draft_len: int = 0  # K, the tokens drafted per speculative step (bench_spec)
    notes: list[str] = field(default_factory=list)
    shared_prefix_tokens: int = 0
    shared_prefix_share: float = 0.0
    speculated_share: float | None = None
    ttft_ms_cold_p50: float | None = None
    ttft_ms_warm_p50: float | None = None
    warnings: list[str] = field(default_factory=list)
    # the figures an SLO is written in, over every successful request of the run
    ttft_ms_p99: float | None = None
    tpot_ms_p95: float | None = None
    request_rate: float | None = None  # Poisson arrivals per second, per level (None: closed loop)
    dataset: str | None = None  # the JSONL file the prompts came from (None: the built-in prompt sets)
    input_len: dict[str, float] | None = None  # prompt tokens (with the build's tokenizer)
    output_len: dict[str, float] | None = None  # output tokens the server produced
    min_tokens: bool = False  # each request also asked for min_tokens = its output length (exact lengths)
    seed: int = 0  # of the dataset sample and the arrival schedule
    model: str | None = None  # the build's model and precision (None: a server without a spec)
    precision: str | None = None
    second_opinion_error: str | None = None  # why `--second-opinion` produced no figures (the run exits 5)

    @property
    def failed(self) -> int:
        return sum(lv.errors for lv in self.levels)

    @property
    def sent(self) -> int:
        return sum(lv.requests for lv in self.levels)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed": self.failed, "mean_accepted_length": self.mean_accepted_length,
                "speedup": self.speedup}

    @property
    def speedup(self) -> dict[int, float] | None:
        """Per concurrency level run in both arms (`--speculation both`), on the same requests: the speculative
        arm's output tok/s over the arm without speculation."""
        arms = {(lv.speculation, lv.concurrency): lv.output_tokens_per_s for lv in self.levels}
        out = {c: round(tok / off, 3) for (mode, c), tok in arms.items()
               if mode == "server" and (off := arms.get(("off", c))) and tok is not None}
        return out or None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per speculative target step: the target's own plus the accepted drafts, 1 + K x acceptance rate
        (upstream's per-request metrics count drafted and accepted tokens, not steps; a step that drafted fewer
        than K tokens, as n-gram may, makes this an upper bound)."""
        if self.acceptance_rate is None or not self.draft_len:
            return None
        return 1 + self.draft_len * self.acceptance_rate


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.1f}%"


def format_report(r: BenchReport) -> str:
    """Text table: one row per concurrency level, then the run-wide figures."""
    head = ("conc", "spec", "reqs", "err", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "e2e p50/p99 ms",
            "hit %", "accept %", "spec'd %", "$/1M tok")
    rows = [head]
    for lv in r.levels:
        rows.append(
            (
                str(lv.concurrency),
                lv.speculation,
                str(lv.requests),
                str(lv.errors),
                _fmt(lv.output_tokens_per_s),
                f"{_fmt(lv.ttft_ms_p50)}/{_fmt(lv.ttft_ms_p99)}",
                f"{_fmt(lv.tpot_ms_p50, '.2f')}/{_fmt(lv.tpot_ms_p99, '.2f')}",
                f"{_fmt(lv.latency_ms_p50)}/{_fmt(lv.latency_ms_p99)}",
                _pct(lv.prefix_cache_hit_ratio),
                _pct(lv.acceptance_rate),
                _pct(lv.speculated_share),
                _fmt(lv.cost_per_1m_output_tokens_usd, ".4f"),
            )
        )
    lines = [workload_line(r), format_table(rows, header=True, right=True)]
    acc = _fmt(r.acceptance_rate * 100 if r.acceptance_rate is not None else None) + (
        "%" if r.acceptance_rate is not None else ""
    )
    hit = _fmt(r.prefix_cache_hit_ratio * 100 if r.prefix_cache_hit_ratio is not None else None) + (
        "%" if r.prefix_cache_hit_ratio is not None else ""
    )
    lines += [
        "",
        f"SLO figures: TTFT p99 {_fmt(r.ttft_ms_p99)} ms, TPOT p95 {_fmt(r.tpot_ms_p95, '.2f')} ms"
        + (f"; Poisson arrivals at {r.request_rate:g} req/s per level" if r.request_rate else "; closed loop"),
        *(f"{name} tokens: " + (", ".join(f"{k} {v:g}" for k, v in d.items()) if d else "n/a")
          for name, d in (("input", r.input_len), ("output", r.output_len)) if d or r.dataset),
        f"model {r.triton_model} at {r.url} ({'streaming' if r.streaming else 'non-streaming'}), "
        f"max_tokens={r.max_tokens}, {r.gpus} GPU(s) at ${r.gpu_price_per_hour:.2f}/GPU-h ({r.gpu_price_source})",
        f"speculation{f' ({r.speculation_mode}, K={r.draft_len})' if r.speculation_mode else ''} acceptance rate: "
        f"{acc}" + (f"; mean accepted length {r.mean_accepted_length:.2f} tokens per speculative step"
                    if r.mean_accepted_length is not None else ""),
        f"prefix-cache hit ratio: {hit} (source: {r.prefix_cache_source}); TTFT p50 cold/warm: "
        f"{_fmt(r.ttft_ms_cold_p50)}/{_fmt(r.ttft_ms_warm_p50)} ms",
        f"requests that speculated: {_pct(r.speculated_share)}"
        + (f"; shared prefix {r.shared_prefix_tokens} tokens on {r.shared_prefix_share:.0%} of requests"
           if r.shared_prefix_tokens else "") + (f"; prompts from {r.dataset}" if r.dataset else ""),
    ]
    if r.speedup:
        lines.append("speculation over none on the same requests, output tok/s: "
                     + ", ".join(f"x{x:.2f} at concurrency {c}" for c, x in r.speedup.items()))
    lines += [f"note: {n}" for n in r.notes]
    lines += [f"warning: {w}" for w in r.warnings]
    return "\n".join(lines)


def workload_line(r: BenchReport) -> str:
    """What every level asked for: how many requests, that they are the same ones (their hash), the output lengths
    and whether they were exact (min_tokens = max_tokens) or a cap."""
    hashes = ", ".join(dict.fromkeys(lv.workload_sha256[:12] for lv in r.levels if lv.workload_sha256)) or "n/a"
    same = "the same at every level" + (" and arm" if len({lv.speculation for lv in r.levels}) > 1 else "")
    lengths = (f"output lengths from the dataset (else --max-tokens {r.max_tokens})" if r.dataset
               else f"output length --max-tokens {r.max_tokens}")
    exact = ("min=max (min_tokens sent)" if r.min_tokens else
             f"max only (model '{r.triton_model}' has no min_tokens input: a request may end early at end of sequence)")
    return f"workload: {r.requests_per_level} request(s) per level, {same} (sha256 {hashes}); {lengths}, {exact}"


PLOT_INSTALL = "pip install -e '.[dev]'"  # scripts/setup.sh installs it; '.[plot]' alone on a serving host


def check_plotting() -> None:
    """BenchError when matplotlib (for `--plot`) is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(f"--plot needs matplotlib, which is not installed; {PLOT_INSTALL} (or drop --plot)") from None


def check_output_file(flag: str, path: str | Path) -> Path:
    """BenchError unless `path` can be written: a regular file or nothing yet (never a directory or a device, which
    the atomic rename would replace), in an existing writable directory."""
    p = Path(path)
    if p.is_dir():
        raise BenchError(f"{flag} {p} is a directory; pass a file path")
    if os.path.lexists(p) and not p.is_file():
        raise BenchError(f"{flag} {p} is not a regular file (a device, FIFO or dangling link); pass a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise BenchError(f"{flag} {p}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise BenchError(f"{flag} {p} is not writable; pass a path you can write")
    return p


def plot_report(r: BenchReport, path: Path) -> Path:
    """Throughput and TTFT p50 against concurrency, one line per speculation mode (so the crossover shows), as a
    PNG.

    Raises:
        BenchError: matplotlib is not installed.
    """
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"server": "speculation (route default)", "off": "no speculation"}
    fig, (ax_tok, ax_ttft) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(lv.speculation for lv in r.levels):
        lvs = [lv for lv in r.levels if lv.speculation == mode]
        xs = [lv.concurrency for lv in lvs]
        ax_tok.plot(xs, [lv.output_tokens_per_s for lv in lvs], marker="o", label=labels.get(mode, mode))
        ax_ttft.plot(xs, [lv.ttft_ms_p50 if lv.ttft_ms_p50 is not None else float("nan") for lv in lvs],
                     marker="o", label=labels.get(mode, mode))
    for ax, ylabel in ((ax_tok, "output tokens/s"), (ax_ttft, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle(f"{r.model or r.triton_model}: throughput and TTFT vs concurrency")
    fig.tight_layout()
    try:
        return replace_file(path, lambda tmp: fig.savefig(tmp, format="png"))  # the temporary's name ends in .tmp
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# Runner.


def prompts(n: int) -> list[str]:
    """Deterministic prompts sharing a system prefix (so prefix caching has something to reuse)."""
    return [SHARED_PREFIX + QUESTIONS[i % len(QUESTIONS)] for i in range(n)]


WARMUP_PROMPT = "Warm up."  # shares nothing with the workloads, so warming up never warms the prefix cache


def filler_text(n_tokens: int, tokenizer=None, *, salt: str = "") -> str:
    """Deterministic text of `n_tokens` tokens (exact with the repo's tokenizer; else n words, about as many)."""
    words = (salt + " " + " ".join(QUESTIONS) * (1 + n_tokens // 8)).split()
    if tokenizer is None:
        return " ".join(words[:n_tokens])
    ids = tokenizer.encode(" ".join(words[:n_tokens]), add_special_tokens=False).ids[:n_tokens]
    return tokenizer.decode(ids)


def is_shared(i: int, share: float) -> bool:
    """Request i reuses the shared prefix: spread evenly, `share` of any run of requests (0 none, 1 all)."""
    return int((i + 1) * share) > int(i * share)


def shared_prefix_prompts(n: int, prefix_tokens: int, share: float, tokenizer=None, *, run: str = "") -> list[str]:
    """The shared-prefix workload of `n` requests: a `share` of them begin with one common prefix of
    `prefix_tokens` tokens, the others with a prefix of that length unique to the request and to `run` (it differs
    from its first block on, so nothing is reusable, not even from an earlier run on the same server); each ends
    with a distinct suffix."""
    prefix = filler_text(prefix_tokens, tokenizer)
    out = []
    for i in range(n):
        head = prefix if is_shared(i, share) else filler_text(prefix_tokens, tokenizer, salt=f"Session {run}{i}:")
        out.append(f"{head} Request {i}: {QUESTIONS[i % len(QUESTIONS)]}")
    return out


@dataclass
class _ModelInfo:
    name: str
    inputs: dict[str, str]  # name -> datatype
    outputs: set[str]
    decoupled: bool

    @property
    def exact_lengths(self) -> bool:
        """Requests also ask for min_tokens = max_tokens (the route has that input), so each gets its length."""
        return "min_tokens" in self.inputs and not self.llmapi

    @property
    def llmapi(self) -> bool:
        """The LLM-API model: one prompt per request, SamplingParams inputs, the text so far in each response."""
        return llmapi.is_llmapi(self.inputs)


def _model_info(client, model: str) -> _ModelInfo:
    from tritonclient.utils import InferenceServerException

    try:
        meta = client.get_model_metadata(model, as_json=True)
        cfg = client.get_model_config(model, as_json=True)["config"]
    except InferenceServerException as exc:
        raise BenchError(f"model '{model}' is not served here ({exc.message()}); pass --model-name") from None
    inputs = {i["name"]: i["datatype"] for i in meta.get("inputs", [])}
    return _ModelInfo(model, inputs, {o["name"] for o in meta.get("outputs", [])}, _is_decoupled(client, cfg))


def _is_decoupled(client, cfg: dict) -> bool:
    """A model streams when it is decoupled; an ensemble when one of its steps is."""
    if cfg.get("model_transaction_policy", {}).get("decoupled", False):
        return True
    steps = cfg.get("ensemble_scheduling", {}).get("step", [])
    return any(_is_decoupled(client, client.get_model_config(step["model_name"], as_json=True)["config"])
               for step in steps)


def _build_inputs(info: _ModelInfo, prompt: str, max_tokens: int, stream: bool, draft_tokens: int | None = None):
    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value, dtype: str):
        arr = np.array([[value]], dtype=object if dtype == "BYTES" else None)
        if dtype != "BYTES":
            arr = arr.astype({"INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32, "UINT64": np.uint64}[dtype])
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    if info.llmapi:
        return llmapi.request_inputs(prompt, max_tokens, streaming=stream, top_k=1, return_perf_metrics=True)
    if "text_input" not in info.inputs or "max_tokens" not in info.inputs:
        raise BenchError(f"model '{info.name}' has no text_input/max_tokens inputs; benchmark the ensemble or BLS")
    out = [tensor("text_input", prompt.encode(), "BYTES"), tensor("max_tokens", max_tokens, "INT32")]
    optional = {"stream": stream, "min_tokens": max_tokens, "temperature": 0.0, "top_k": 1,
                "return_num_output_tokens": True, "return_perf_metrics": True, "exclude_input_in_output": True}
    if draft_tokens is not None:
        optional["num_draft_tokens"] = draft_tokens
    for name, value in optional.items():
        if name in info.inputs:
            out.append(tensor(name, value, info.inputs[name]))
    return out


def _scalar(result, name: str) -> Any:
    try:
        arr = result.as_numpy(name)
    except Exception:
        return None
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0]


def _text(result) -> str:
    v = _scalar(result, "text_output")  # text_output is 1-D [-1]: output[0] is this request's text
    if v is None:
        return ""
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class _Route:
    """How a level's clients call the server: its gRPC address, the model, streaming or not, the per-request
    timeout, and the build's tokenizer (output token counts; None without one)."""

    url: str
    info: _ModelInfo
    stream: bool
    timeout_s: float
    tokenizer: Any = None

    def worker(self, mode: str) -> _Worker:
        """A client for one of a level's concurrent streams; `mode` "off" asks for no draft tokens (the LLM-API model
        takes no per-request draft length: its "off" arm is the plain build's server)."""
        return _Worker(self, 0 if mode == "off" and not self.info.llmapi else None)


class _Client(Protocol):
    """One of a level's concurrent clients (`_Worker`, `pipeline.serving.openai_route.OpenAIClient`)."""

    def request(self, prompt: str, max_tokens: int, rid: str) -> RequestSample: ...

    def close(self) -> None: ...


class _AnyRoute(Protocol):
    """How a level's clients reach the server (`_Route`: Triton gRPC; `openai_route.OpenAIRoute`: OpenAI HTTP)."""

    @property
    def timeout_s(self) -> float: ...

    def worker(self, mode: str) -> _Client: ...


class _Worker:
    """One gRPC client with its own stream; sends requests one after another."""

    def __init__(self, route: _Route, draft_tokens: int | None = None):
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(route.url)
        self.info = route.info
        self.stream = route.stream
        self.timeout_s = route.timeout_s
        self.tokenizer = route.tokenizer
        self.draft_tokens = draft_tokens
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.responses.put((time.perf_counter(), result, error))
        )

    def close(self) -> None:
        try:
            self.client.stop_stream(cancel_requests=True)
        finally:
            self.client.close()

    def request(self, prompt: str, max_tokens: int, rid: str) -> RequestSample:
        inputs = _build_inputs(self.info, prompt, max_tokens, self.stream, self.draft_tokens)
        t0 = time.perf_counter()
        self.client.async_stream_infer(self.info.name, inputs, request_id=rid, enable_empty_final_response=True)
        sample, seen = RequestSample(ok=False), _Seen()
        deadline = t0 + self.timeout_s
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                sample.error = f"timed out after {self.timeout_s:.0f}s"
                return sample
            try:
                t, result, error = self.responses.get(timeout=left)
            except queue.Empty:
                continue
            if error is not None:
                sample.error = str(error)
                sample.latency_s = t - t0
                return sample
            if _take_response(result, t - t0, sample, seen):
                sample.latency_s = t - t0
                break
        self._count_tokens(sample, seen)
        _finish_sample(sample, seen.stamps, self.stream)
        return sample

    def _count_tokens(self, sample: RequestSample, seen: _Seen) -> None:
        """Output tokens as `pipeline.serving.token_count` counts them on every route (the llmapi model streams the text
        so far, several tokens per response with speculation: its last text is re-tokenized)."""
        text = (seen.texts[-1] if seen.texts else "") if self.info.llmapi else "".join(seen.texts)
        c = count_output_tokens(server_counts=seen.counts, streamed=self.stream, stream_chunks=seen.chunks,
                                text=text, tokenizer=self.tokenizer, retokenize=self.info.llmapi)
        sample.output_tokens, sample.token_source = c.tokens, c.source


@dataclass
class _Seen:
    """What the responses of one request carried so far."""

    texts: list[str] = field(default_factory=list)
    chunks: int = 0
    counts: list[int] = field(default_factory=list)  # the server's token counts, one per response that has one
    stamps: dict[str, int] = field(default_factory=dict)  # first value of each perf timestamp output


_SAMPLE_OUTPUTS = (("reused_blocks", "kv_cache_reused_blocks"), ("reused_blocks", "kv_cache_reused_block"),
                   ("total_blocks", "kv_cache_alloc_total_blocks"),
                   ("accepted_draft_tokens", "total_accepted_draft_tokens"), ("draft_tokens", "total_draft_tokens"))
_PERF_STAMPS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")


def _take_response(result, elapsed_s: float, sample: RequestSample, seen: _Seen) -> bool:
    """Record one streamed response into `sample`/`seen`; True when it is the request's final response."""
    response = result.get_response()
    params = response.parameters
    final = params["triton_final_response"].bool_param if "triton_final_response" in params else True
    if not response.outputs:
        return final
    text = _text(result)
    # Every streamed response carries the next token, even when its text is empty (a partial UTF-8 sequence
    # of a byte-level tokenizer); only an empty *final* response is bookkeeping, not a token.
    if text or not final:
        if sample.ttft_s is None:
            sample.ttft_s = elapsed_s
        seen.texts.append(text)
        seen.chunks += 1
    n = server_count(result)
    if n is not None:
        seen.counts.append(n)
    for attr, name in _SAMPLE_OUTPUTS:
        v = _scalar(result, name)
        if v is not None:
            setattr(sample, attr, int(v))
    for name in _PERF_STAMPS:
        v = _scalar(result, name)
        if v is not None and int(v) > 0:
            seen.stamps.setdefault(name, int(v))
    return final


def _finish_sample(sample: RequestSample, stamps: dict[str, int], stream: bool) -> None:
    """TTFT source, speculation flag, zero counters as n/a; marks the sample ok."""
    if stream and sample.ttft_s is not None:
        sample.ttft_source = "stream"
    else:  # one response: the first token is observable only through the server's own timestamps
        sample.ttft_s = server_ttft_s(stamps)
        sample.ttft_source = "server" if sample.ttft_s is not None else None
    if sample.draft_tokens is not None:
        sample.speculated = sample.draft_tokens > 0
    if sample.draft_tokens == 0:
        sample.draft_tokens = sample.accepted_draft_tokens = None
    if sample.total_blocks == 0:
        sample.total_blocks = sample.reused_blocks = None
    sample.ok = True


def server_ttft_s(stamps: dict[str, int]) -> float | None:
    """First token time minus arrival (else first scheduled) time from a response's perf outputs, in seconds."""
    first = stamps.get("first_token_time_ns")
    start = stamps.get("arrival_time_ns") or stamps.get("first_scheduled_time_ns")
    return (first - start) / 1e9 if first and start and first >= start else None


def _level(route: _AnyRoute, plan: LevelPlan, budget_s: float) -> tuple[list[RequestSample], float]:
    """Send the plan's requests with at most `plan.concurrency` in flight: min(concurrency, requests) clients, one
    thread each; request i asks for `plan.max_tokens[i]` tokens and, with `plan.arrivals`, is sent no earlier than
    `arrivals[i]` seconds after the level starts (later when every client is busy); (samples, wall seconds)."""
    texts, max_tokens, arrivals, concurrency = plan.texts, plan.max_tokens, plan.arrivals, plan.concurrency
    n_requests = len(texts)
    workers = [route.worker(plan.mode) for _ in range(clients_for(concurrency, n_requests))]
    samples: list[RequestSample] = []
    lock = threading.Lock()
    next_idx = [0]
    start = time.perf_counter()

    def run(w: _Client, wid: int) -> None:
        while True:
            with lock:
                i = next_idx[0]
                if i >= n_requests or time.perf_counter() - start > budget_s:
                    return
                next_idx[0] += 1
            if arrivals is not None:
                if arrivals[i] > budget_s:
                    return
                time.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            s = w.request(texts[i], max_tokens[i], f"bench-{concurrency}-{i}")
            with lock:
                samples.append(s)
            if not s.ok:
                return

    threads = [threading.Thread(target=run, args=(w, i), daemon=True) for i, w in enumerate(workers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=budget_s + route.timeout_s + 5)
    finally:
        for w in workers:
            w.close()
    return samples, time.perf_counter() - start


def clients_for(concurrency: int, n_requests: int) -> int:
    """Clients (gRPC streams and threads) a level opens: never more than requests that can be in flight at once."""
    return max(1, min(concurrency, n_requests, MAX_CONCURRENCY))


def tokenizer_dir_of(repo: str | Path) -> str | None:
    """The `tokenizer_dir` of a repo's preprocessing (else postprocessing) model, or the `tokenizer` (else
    `model`) of an LLM-API repo's model.yaml, absolute; None when absent."""
    if llmapi_yaml.is_llmapi_repo(Path(repo)):
        data = llmapi_yaml.read(Path(repo) / llmapi_yaml.MODEL_YAML)
        value = data.get("tokenizer") or data["model"]
        return str((Path(repo) / llmapi_yaml.MODEL_YAML).parent / value)
    for model in ("preprocessing", "postprocessing"):
        cfg = Path(repo) / model / "config.pbtxt"
        value = pbtxt.parameter(pbtxt.read(cfg), "tokenizer_dir") if cfg.is_file() else ""
        if value:
            p = Path(value)
            return str(p if p.is_absolute() else (cfg.parent / p))
    return None


@dataclass(frozen=True)
class ServerUrls:
    """The running server a bench calls, on 127.0.0.1: its gRPC address (the requests; an `http://` address is an
    OpenAI-compatible server's, `openai_route`), its metrics endpoint
    (prefix-cache counters, optional) and its HTTP address (for a second opinion, optional)."""

    grpc: str
    metrics: str | None = None
    http: str | None = None

    @classmethod
    def given(cls, url: str | None, metrics_url: str | None = None, http_url: str | None = None) -> ServerUrls | None:
        """The server at `url` (`--url`, `--metrics-url`, `--http-url`); None without `url` (bench starts one).

        Raises:
            BenchError: an address that is not local, or `http_url` without `url`.
        """
        if url:
            check_local(url)
        if http_url:
            if not url:
                raise BenchError("--http-url names the HTTP address of the server at --url; pass --url too, or drop "
                                 "both so that bench starts the server")
            check_local(http_url)
        return cls(url, metrics_url, http_url) if url else None


@dataclass(frozen=True)
class WorkloadOptions:
    """What every level sends (`plan_workload`).

    Attributes:
        concurrency: the levels: at most this many requests in flight.
        shared_prefix_tokens: > 0: the shared-prefix workload (`shared_prefix_prompts`): `shared_prefix_share` of
            the requests start with one prefix of this many tokens, each request has a distinct suffix.
        speculation: "server" (the route's default draft length), "off" (num_draft_tokens 0) or "both" (every
            level twice, with the route's default and off; needs a model with a num_draft_tokens input).
        dataset: a JSONL or JSON-array file of prompts (`pipeline.serving.dataset`): a sample of
            `requests_per_level` of them seeded by `seed`, each asking for its output length (else `max_tokens`).
        request_rate: Poisson arrivals per second within each level (seeded by `seed`), the concurrency level
            capping how many are in flight; None: each client sends its next request at once.
    """

    concurrency: Sequence[int] = (1, 2, 4)
    requests_per_level: int = 8
    max_tokens: int = 32
    shared_prefix_tokens: int = 0
    shared_prefix_share: float = 1.0
    speculation: str = "server"
    dataset: str | Path | None = None
    request_rate: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class SweepOptions:
    """How the sweep drives the server.

    Attributes:
        model: model to call; default: `tensorrt_llm_bls` when served (speculation), else `ensemble`, else the
            LLM-API `tensorrt_llm`.
        stream: stream responses (TTFT measurable); default: on for a decoupled model, off for the BLS (upstream
            draft-target BLS does not stream).
        level_budget_s, request_timeout_s: time budget of one level and of one request.
        warmup: send one short request before the first level.
    """

    model: str | None = None
    stream: bool | None = None
    level_budget_s: float = 60.0
    request_timeout_s: float = 120.0
    warmup: bool = True


@dataclass(frozen=True)
class Pricing:
    """What the cost figures assume: the GPUs serving, $ per GPU-hour, and where that price comes from."""

    gpus: int = 1
    usd_per_gpu_hour: float = 3.0
    source: str = "given"

    @classmethod
    def of(cls, spec: BuildSpec) -> Pricing:
        """The spec's world size (TP×PP) at its $/GPU-hour (`cost_basis`)."""
        price, source = cost_basis(spec)
        return cls(spec.parallelism.world_size, price, source)


def run_bench(
    server: ServerUrls,
    workload: WorkloadOptions = WorkloadOptions(),
    *,
    sweep: SweepOptions = SweepOptions(),
    pricing: Pricing = Pricing(),
    tokenizer_dir: str | Path | None = None,
    planned: list[LevelPlan] | None = None,
    second_opinion: SecondOpinion | None = None,
    plain_server: ServerUrls | None = None,
) -> BenchReport:
    """Run the concurrency sweep against a running server on 127.0.0.1 and return the report.

    Args:
        plain_server: where the "off" levels go when the route takes no per-request draft length (the LLM-API
            model): the same target built without speculation, serving the same model name.
        tokenizer_dir: the served build's tokenizer (exact prompt lengths and output token counts).
        planned: the levels `plan_workload` planned from `workload` already, checked against the build's limits
            (default: plan them here, with no limits).
        second_opinion: another load generator (`pipeline.serving.aiperf.Aiperf`), checked before the first
            request and run on every level after ours (at `server.http`); its failure is kept in
            `second_opinion_error`.

    Raises:
        BenchError: non-local URL, unreachable server, missing model, bad options, prompts over the limits.
    """
    check_local(server.grpc)
    tokenizer = load_tokenizer(tokenizer_dir)
    levels = planned or plan_workload(workload, tokenizer=tokenizer)
    if openai_route.is_openai_url(server.grpc):
        _check_openai(workload, plain_server, second_opinion)
        oa = openai_route.OpenAIRoute.connect(server.grpc, sweep.model, stream=sweep.stream is not False,
                                              timeout_s=sweep.request_timeout_s, tokenizer=tokenizer)
        routes: dict[str, _AnyRoute] = {"server": oa, "off": oa}
        name, stream, exact = oa.model, oa.stream, False
    else:
        routes, name, stream, exact = _triton_routes(server, plain_server, sweep, workload.speculation, tokenizer)
    route = routes["server"]
    w = workload
    report = BenchReport(server.grpc, name, stream, w.max_tokens, w.requests_per_level, pricing.gpus,
                         pricing.usd_per_gpu_hour, gpu_price_source=pricing.source,
                         shared_prefix_tokens=w.shared_prefix_tokens,
                         shared_prefix_share=w.shared_prefix_share if w.shared_prefix_tokens else 0.0,
                         request_rate=w.request_rate, dataset=str(w.dataset) if w.dataset is not None else None,
                         min_tokens=exact, seed=w.seed)
    tokenizer_path = str(tokenizer_dir) if tokenizer_dir is not None else None
    if second_opinion is not None:
        second_opinion.check(report, http_url=server.http, tokenizer_dir=tokenizer_path)
    if sweep.warmup:
        for mode in dict.fromkeys(lv.mode for lv in levels if routes[lv.mode] is not route or lv.mode == "server"):
            _level(routes[mode], LevelPlan(1, "server", [WARMUP_PROMPT], [min(4, w.max_tokens)]), sweep.level_budget_s)
    before = scrape_metrics(server.metrics) if server.metrics else None
    samples = _sweep(report, routes, levels, sweep.level_budget_s)
    after = scrape_metrics(server.metrics) if server.metrics else None
    ok = [s for s in samples if s.ok]
    _run_figures(report, ok, levels, tokenizer)
    _prefix_cache_ratio(report, ok, before, after)
    _add_notes(report, ok, levels)
    if second_opinion is not None:
        _second_opinion(second_opinion, report, levels, server.http, tokenizer_path, sweep.level_budget_s)
    return report


def _triton_routes(server: ServerUrls, plain_server: ServerUrls | None, sweep: SweepOptions, speculation: str,
                   tokenizer: Any) -> tuple[dict[str, _AnyRoute], str, bool, bool]:
    """The routes of each arm to a Triton server (the "off" arm to `plain_server` where given), the model's name,
    whether it streams and whether its requests get exact lengths (min_tokens)."""
    info = _served_model(server.grpc, sweep.model)
    stream = _stream_mode(info, sweep.stream, speculation, plain_server=plain_server is not None)
    route = _Route(server.grpc, info, stream, sweep.request_timeout_s, tokenizer)
    routes: dict[str, _AnyRoute] = {"server": route, "off": route}
    if plain_server is not None:  # the LLM-API arms: the speculative build's server and the plain build's
        check_local(plain_server.grpc)
        plain = _served_model(plain_server.grpc, info.name)
        routes["off"] = _Route(plain_server.grpc, plain, stream, sweep.request_timeout_s, tokenizer)
    return routes, info.name, stream, info.exact_lengths


def _check_openai(workload: WorkloadOptions, plain_server: ServerUrls | None,
                  second_opinion: SecondOpinion | None) -> None:
    """BenchError for what the OpenAI route cannot do: a per-request draft length, a second opinion."""
    if workload.speculation != "server" or plain_server is not None:
        raise BenchError(f"--speculation {workload.speculation}: an OpenAI endpoint takes no per-request draft "
                         "length; drop --speculation (or bench Triton's gRPC port)")
    if second_opinion is not None:
        raise BenchError("--second-opinion aiperf drives Triton's generate endpoint, not an OpenAI --url; drop "
                         "--second-opinion")


def _second_opinion(other: SecondOpinion, report: BenchReport, levels: list[LevelPlan], http_url: str | None,
                    tokenizer_dir: str | None, level_budget_s: float) -> None:
    """Run `other` on every level; its failure is kept in `report.second_opinion_error`."""
    if http_url is None or tokenizer_dir is None:  # `check` refused the run before the first request
        raise BenchError("a second opinion needs the server's HTTP address and the build's tokenizer")
    try:
        other.run(report, levels, http_url=http_url, tokenizer_dir=tokenizer_dir, level_budget_s=level_budget_s)
    except PipelineError as exc:
        report.second_opinion_error = str(exc)


class SecondOpinion(Protocol):
    """Another load generator run on the same levels (`pipeline.serving.aiperf.Aiperf`)."""

    def check(self, report: BenchReport, *, http_url: str | None, tokenizer_dir: str | None) -> None: ...

    def run(self, report: BenchReport, workload: list[LevelPlan], *, http_url: str, tokenizer_dir: str,
            level_budget_s: float) -> None: ...


@dataclass
class LevelPlan:
    """One level of the sweep: its concurrency, speculation mode, the exact prompts it sends, the output tokens each
    asks for, with a request rate when each is due (seconds after the level starts), and the hash of its workload
    (`workload_sha256`: the same at every level and arm of a run)."""

    concurrency: int
    mode: str
    texts: list[str]
    max_tokens: list[int]
    arrivals: list[float] | None = None
    workload_sha256: str = ""


def workload_sha256(texts: list[str], output_lens: list[int]) -> str:
    """sha256 of a request list: the JSON `[[prompt, output_len], ...]` in order (UTF-8, no spaces)."""
    doc = json.dumps([[t, n] for t, n in zip(texts, output_lens, strict=True)], ensure_ascii=False,
                     separators=(",", ":"))
    return hashlib.sha256(doc.encode("utf-8")).hexdigest()


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s) of `n` requests arriving as a Poisson process of `rate` per second: the first at 0, then
    exponential gaps of mean 1/rate (numpy's seeded generator: the same seed, the same schedule)."""
    import numpy as np

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return [0.0, *np.cumsum(gaps[:-1]).round(6).tolist()][:n]


def _sample(n: int, options: WorkloadOptions, dataset: list[DatasetRequest] | None,
            tokenizer: Any) -> tuple[list[str], list[int]]:
    """The run's requests (prompts and output lengths): the dataset's sample in order (cycling when it has fewer
    than `n`), the shared-prefix workload, or the fixed prompt set."""
    if dataset:
        reqs = [dataset[i % len(dataset)] for i in range(n)]
        return [r.prompt for r in reqs], [r.output_len or options.max_tokens for r in reqs]
    texts = (shared_prefix_prompts(n, options.shared_prefix_tokens, options.shared_prefix_share, tokenizer)
             if options.shared_prefix_tokens else prompts(n))
    return texts, [options.max_tokens] * n


def plan_workload(options: WorkloadOptions = WorkloadOptions(), *, tokenizer: Any = None,
                  max_input_len: int | None = None, max_seq_len: int | None = None) -> list[LevelPlan]:
    """Every level's requests, checked against the options' caps and the build's limits (`max_input_len`,
    `max_seq_len`, with the build's `tokenizer`) before anything is sent.

    Every level and speculation arm replays one sample of `requests_per_level` requests in the same order (and,
    with a request rate, on the same arrival schedule), so levels differ only in concurrency. The shared-prefix
    workload's unshared prefixes are salted per level and run so that they stay cold; its `workload_sha256`
    hashes them unsalted.

    Raises:
        BenchError: bad options, a level over `MAX_CONCURRENCY`, requests over `MAX_REQUESTS`, prompts over the
            build's limits, an unreadable or malformed dataset.
    """
    o = options
    levels = sorted({int(c) for c in o.concurrency})
    _check_options(levels, o)
    if o.request_rate is not None and not 0 < o.request_rate <= MAX_REQUEST_RATE:
        raise BenchError(f"--request-rate {o.request_rate:g}: expected requests per second within "
                         f"0..{MAX_REQUEST_RATE:g}")
    if o.dataset is not None and o.shared_prefix_tokens:
        raise BenchError("--dataset and --shared-prefix-tokens both choose the prompts; pass one of them")
    n = o.requests_per_level
    data = load_dataset(o.dataset, tokenizer=tokenizer, sample=n, seed=o.seed) if o.dataset is not None else None
    texts, outs = _sample(n, o, data, tokenizer)
    digest = workload_sha256(texts, outs)
    arrivals = poisson_arrivals(n, o.request_rate, o.seed) if o.request_rate else None
    run = uuid.uuid4().hex[:8]  # unshared prefixes stay unshared across levels and runs on one server
    plans: list[LevelPlan] = []
    for mode in ("server", "off") if o.speculation == "both" else (o.speculation,):
        for c in levels:
            sent = (shared_prefix_prompts(n, o.shared_prefix_tokens, o.shared_prefix_share, tokenizer,
                                          run=f"{run}-{len(plans)}-") if o.shared_prefix_tokens else texts)
            plans.append(LevelPlan(c, mode, sent, list(outs), arrivals, digest))
    check_prompt_limits([t for p in plans for t in p.texts], tokenizer, max_tokens=o.max_tokens,
                        shared_prefix_tokens=o.shared_prefix_tokens, max_input_len=max_input_len,
                        max_seq_len=max_seq_len, output_lens=[m for p in plans for m in p.max_tokens])
    return plans


def check_prompt_limits(texts: list[str], tokenizer, *, max_tokens: int, shared_prefix_tokens: int = 0,
                        max_input_len: int | None = None, max_seq_len: int | None = None,
                        output_lens: list[int] | None = None) -> None:
    """BenchError when a prompt (counted with the build's tokenizer, special tokens included, as preprocessing
    does) exceeds `max_input_len`, or prompt + its output length (`output_lens[i]`, else `max_tokens`) exceeds
    `max_seq_len`. Without a tokenizer only the shared prefix itself is checked. A prompt far over the limits is
    counted only until it is surely over them (`token_count.prompt_tokens`; the message says "at least")."""
    if max_input_len is not None and shared_prefix_tokens > max_input_len:
        raise BenchError(f"--shared-prefix-tokens {shared_prefix_tokens} exceeds the build's max_input_len "
                         f"{max_input_len}; lower --shared-prefix-tokens or build with a larger --max-input-len")
    if tokenizer is None or not texts or (max_input_len is None and max_seq_len is None):
        return
    limit = max(max_input_len or 0, max_seq_len or 0)
    lengths = {t: prompt_tokens(tokenizer, t, limit=limit) for t in set(texts)}
    longest = max(lengths.values())
    if output_lens is not None and set(output_lens) != {max_tokens}:  # a dataset's own lengths, even all alike
        _check_dataset_lengths(texts, lengths, output_lens, max_input_len=max_input_len, max_seq_len=max_seq_len)
        return
    if max_input_len is not None and longest > max_input_len:
        over = longest - max_input_len
        fix = ("" if not shared_prefix_tokens else
               f"lower --shared-prefix-tokens to at most {shared_prefix_tokens - over} or " if shared_prefix_tokens > over
               else "lower --shared-prefix-tokens or ")
        raise BenchError(f"the longest bench prompt is {_at_least(lengths, longest, limit)}{longest} tokens with the "
                         f"build's tokenizer, over its "
                         f"max_input_len {max_input_len}; {fix}build with a larger --max-input-len")
    if max_seq_len is not None and longest + max_tokens > max_seq_len:
        fix = (f"lower --max-tokens to at most {max_seq_len - longest}" if max_seq_len > longest
               else "shorten the prompts")
        raise BenchError(f"the longest bench prompt ({longest} tokens) + --max-tokens {max_tokens} exceeds the "
                         f"build's max_seq_len {max_seq_len}; {fix} or build with a larger --max-seq-len")


def _at_least(lengths: dict[str, int], n: int, limit: int) -> str:
    """"at least " when a prompt of `n` tokens may have been counted only up to `limit` (`prompt_tokens`)."""
    cut = any(count == n and len(text) > PROMPT_CHUNK_CHARS for text, count in lengths.items())
    return "at least " if cut and n > limit else ""


def _check_dataset_lengths(texts: list[str], lengths: dict[str, int], output_lens: list[int], *,
                           max_input_len: int | None, max_seq_len: int | None) -> None:
    """Per-request limits of a dataset workload: each prompt within max_input_len, prompt + its output length
    within max_seq_len (BenchError naming the first request over)."""
    for i, (text, out) in enumerate(zip(texts, output_lens)):
        n = lengths[text]
        if max_input_len is not None and n > max_input_len:
            raise BenchError(f"dataset request {i}: its prompt is {_at_least({text: n}, n, max_input_len)}{n} tokens "
                             "with the build's tokenizer, over its "
                             f"max_input_len {max_input_len}; drop such prompts or build with a larger --max-input-len")
        if max_seq_len is not None and n + out > max_seq_len:
            raise BenchError(f"dataset request {i}: prompt {n} + output_len {out} tokens exceed the build's "
                             f"max_seq_len {max_seq_len}; lower its output_len or build with a larger --max-seq-len")


def _check_options(levels: list[int], o: WorkloadOptions) -> None:
    if not levels or levels[0] < 1 or o.requests_per_level < 1 or o.max_tokens < 1:
        raise BenchError("concurrency levels, requests per level and max tokens must be >= 1")
    _check_cap(levels)
    if o.requests_per_level > MAX_REQUESTS:
        raise BenchError(f"--requests {o.requests_per_level} exceeds the cap of {MAX_REQUESTS} requests per level "
                         "(pipeline.serving.bench.MAX_REQUESTS); pass a smaller --requests")
    if o.shared_prefix_tokens < 0 or not 0.0 <= o.shared_prefix_share <= 1.0:
        raise BenchError("--shared-prefix-tokens must be >= 0 and --shared-prefix-share within 0..1")
    if o.speculation not in ("server", "off", "both"):
        raise BenchError(f"--speculation {o.speculation!r}: expected server, off or both")


def _check_cap(levels: list[int]) -> None:
    if levels and max(levels) > MAX_CONCURRENCY:
        raise BenchError(f"--concurrency {max(levels)} exceeds the cap of {MAX_CONCURRENCY} concurrent clients per "
                         f"level (pipeline.serving.bench.MAX_CONCURRENCY); pick levels <= {MAX_CONCURRENCY}")


def _served_model(grpc_url: str, model: str | None) -> _ModelInfo:
    """The model to benchmark on a ready server (default: `tensorrt_llm_bls` when served, else `ensemble`, else
    the LLM-API `tensorrt_llm`)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        try:
            live = client.is_server_ready()
        except Exception:
            live = False
        if not live:
            raise BenchError(f"no ready Triton server at {grpc_url}; start one with `invoke serve`")
        if model is None:
            names = {m["name"] for m in client.get_model_repository_index(as_json=True).get("models", [])}
            model = next((m for m in ("tensorrt_llm_bls", "ensemble") if m in names), llmapi.MODEL)
        return _model_info(client, model)
    finally:
        client.close()


def _stream_mode(info: _ModelInfo, stream: bool | None, speculation: str, *, plain_server: bool) -> bool:
    """Whether to stream (default: when the model is decoupled, except the BLS); BenchError for what the route
    cannot do."""
    if stream is None:
        stream = info.decoupled and info.name != "tensorrt_llm_bls"
    if stream and not info.decoupled:
        raise BenchError(f"model '{info.name}' is not decoupled, so it cannot stream; pass --no-stream")
    if speculation != "server" and info.llmapi:
        if plain_server:
            return stream
        raise BenchError(f"--speculation {speculation}: the LLM-API model '{info.name}' takes no per-request draft "
                         "length (TensorRT-LLM 1.2's llmapi contract), so the arm without speculation is the same "
                         "target built without it; drop --url so that bench starts both builds' servers")
    if speculation != "server" and "num_draft_tokens" not in info.inputs:
        raise BenchError(f"--speculation {speculation}: model '{info.name}' has no num_draft_tokens input; "
                         "benchmark tensorrt_llm_bls")
    return stream


def _sweep(report: BenchReport, routes: dict[str, _AnyRoute], workload: list[LevelPlan], level_budget_s: float
           ) -> list[RequestSample]:
    """Every planned level in order, each on its arm's route; appends each level's stats to `report`."""
    samples: list[RequestSample] = []
    for plan in workload:
        level, wall = _level(routes[plan.mode], plan, level_budget_s)
        for sample in level:
            sample.arm = plan.mode
        samples += level
        stats = summarize(plan.concurrency, level, wall, gpus=report.gpus,
                          price_per_gpu_hour=report.gpu_price_per_hour, speculation=plan.mode)
        stats.request_rate, stats.workload_sha256 = report.request_rate, plan.workload_sha256
        report.levels.append(stats)
    return samples


def _run_figures(report: BenchReport, ok: list[RequestSample], workload: list[LevelPlan], tokenizer) -> None:
    """Run-wide figures: acceptance, share that speculated, cold/warm TTFT, P99 TTFT and P95 TPOT (what an SLO is
    written in), and the input/output token length distributions."""
    report.acceptance_rate = _round(ratio((s.accepted_draft_tokens for s in ok), (s.draft_tokens for s in ok)))
    report.speculated_share = _round(speculated_share(s for s in ok if s.arm != "off"))
    cold, warm = cold_warm_ttft(ok)
    report.ttft_ms_cold_p50 = round(cold * 1000, 3) if cold is not None else None
    report.ttft_ms_warm_p50 = round(warm * 1000, 3) if warm is not None else None
    ttft, tpot = percentile((s.ttft_s for s in ok), 99), percentile((s.tpot_s for s in ok), 95)
    report.ttft_ms_p99 = round(ttft * 1000, 3) if ttft is not None else None
    report.tpot_ms_p95 = round(tpot * 1000, 3) if tpot is not None else None
    if tokenizer is not None:
        report.input_len = length_stats(len(tokenizer.encode(t).ids) for p in workload for t in p.texts)
    report.output_len = length_stats(s.output_tokens for s in ok)


def _prefix_cache_ratio(report: BenchReport, ok: list[RequestSample], before: dict | None,
                        after: dict | None) -> None:
    """Prefix-cache hit ratio from per-request outputs, else the metrics endpoint; warns when it is low."""
    per_request = block_hit_ratio(ok)
    if per_request is not None:
        report.prefix_cache_hit_ratio, report.prefix_cache_source = _round(per_request), "per-request outputs"
    elif after is not None:
        counters = [kv_block_counters(m) or dynamo_token_counters(m) for m in (before or {}, after)]
        hit = metrics_hit_ratio(*counters)
        if hit is not None:
            report.prefix_cache_hit_ratio, report.prefix_cache_source = _round(hit), "metrics endpoint"
        else:
            report.notes.append("the metrics endpoint exports no KV-cache reuse counters: prefix-cache hit ratio n/a")
    if report.prefix_cache_hit_ratio is not None and report.prefix_cache_hit_ratio < HIT_RATIO_WARNING:
        report.warnings.append(
            f"prefix-cache hit ratio {report.prefix_cache_hit_ratio:.1%} is below {HIT_RATIO_WARNING:.0%}: requests "
            "share little of their prompts' start (a prompt template that varies before the shared part?)")


def _add_notes(report: BenchReport, ok: list[RequestSample], workload: list[LevelPlan]) -> None:
    """Notes on how the report's figures were measured (and the failure line when requests failed)."""
    bls = report.triton_model == "tensorrt_llm_bls"
    capped = sorted({p.concurrency for p in workload if clients_for(p.concurrency, len(p.texts)) < p.concurrency})
    if capped:
        report.notes.append(f"concurrency {', '.join(map(str, capped))}: only {report.requests_per_level} request(s) "
                            "per level, so that many clients at most were in flight")
    if len(workload) > 1 and not report.shared_prefix_tokens:
        report.notes.append("every level replays the same requests: with KV-cache reuse, a level can reuse blocks an "
                            "earlier level cached (its hit % shows how much)")
    if bls and report.speculated_share:
        report.notes.append("draft-target requests sum the block counts of every target call, so a request's own "
                            "prompt counts as reused on each verification step: the hit ratio overstates reuse "
                            "across requests")
    if not report.streaming:
        if any(s.ttft_source == "server" for s in ok):
            report.notes.append("non-streaming requests: TTFT from the server's timestamps (first token - arrival); "
                                "TPOT = (client latency - that TTFT) / (tokens - 1)")
        else:
            report.notes.append("non-streaming requests: TTFT/TPOT are not observable (n/a)")
    sources = sorted({s.token_source for s in ok if s.token_source})
    if sources:
        report.notes.append(f"output tokens counted from: {', '.join(TOKEN_SOURCES[s] for s in sources)}")
    if report.acceptance_rate is None and bls:
        report.notes.append("the BLS exports no draft acceptance outputs: acceptance rate n/a")
    if report.failed:
        report.notes.append(failure_line(report))


def failure_line(report: BenchReport) -> str:
    first = next((lv.first_error for lv in report.levels if lv.first_error), None)
    return f"{report.failed} of {report.sent} request(s) failed; first error: {first}"


def check_failures(report: BenchReport) -> None:
    """RequestsFailed (exit code 5) when any request of the run failed, RunError (5) when its second opinion did."""
    if report.failed:
        raise RequestsFailed(failure_line(report))
    if report.second_opinion_error:
        raise RunError(f"second opinion: {report.second_opinion_error}")


def report_json(report: BenchReport) -> str:
    """The report as the JSON document `--json` prints, `--json-file` writes and `plan --slo --bench-report` reads."""
    return json.dumps(report.as_dict(), indent=2)


def write_json(report: BenchReport, path: Path) -> Path:
    """Write the report's JSON to `path` atomically (`replace_file`: nothing half-written on a full disk)."""
    text = report_json(report) + "\n"
    return replace_file(path, lambda tmp: tmp.write_text(text))


def parse_levels(text: str | Iterable[int]) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (BenchError on anything else)."""
    if not isinstance(text, str):
        return [int(x) for x in text]
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        shown = repr(text) if len(text) <= 40 else repr(text[:30]) + "...(long)"
        raise BenchError(f"--concurrency {shown}: expected comma-separated integers like 1,2,4,8") from None
    if not levels or min(levels) < 1:
        raise BenchError(f"--concurrency {text!r}: levels must be >= 1")
    _check_cap(levels)
    return levels


def _plain_repo(spec: BuildSpec, workload: WorkloadOptions, server: ServerUrls | None) -> Path | None:
    """The repository of `spec`'s target built without speculation, where `--speculation off|both` needs one: an
    LLM-API build with speculation (its model takes no per-request draft length); None otherwise.

    Raises:
        BenchError: bench was given a running server (`--url`), or the plain build is not there.
    """
    if workload.speculation == "server" or spec.speculation_mode is None or not runtime_of(spec).llmapi:
        return None
    if server is not None:
        return None  # `run_bench` refuses it, naming the route
    plain = spec.revised(draft_model=None, speculation=type(spec.speculation)(), checked=True)
    try:
        return built_repo(plain)
    except PipelineError as exc:
        raise BenchError(f"--speculation {workload.speculation} on a {spec.speculation_mode} LLM-API build compares "
                         f"it with the same target built without speculation, which is not built here ({exc}); "
                         f"build it: invoke build --model {spec.model.name} --precision {spec.quantization.precision}"
                         f" --runtime {spec.runtime} --target {spec.target}") from None


def cost_basis(spec) -> tuple[float, str]:
    """$/GPU-hour for the spec's cost figures and where it comes from; a reference build says that its cost is a
    CPU server's throughput priced at a GPU's rate."""
    price = gpu_price(spec.hardware.gpu, spec.hardware.gpu_price_per_hour)
    if runtime_of(spec).gpu:
        return price.usd_per_hour, price.source
    return price.usd_per_hour, (price.source + "; CPU reference server: $/1M tok prices its CPU tok/s at that GPU "
                                "rate, an estimate of nothing deployed (compare runs with it, do not budget)")


def bench_spec(
    spec: BuildSpec,
    *,
    workload: WorkloadOptions,
    server: ServerUrls | None = None,
    repo: str | Path | None = None,
    sweep: SweepOptions = SweepOptions(),
    second_opinion: SecondOpinion | None = None,
    ready_timeout_s: float = 300.0,
) -> BenchReport:
    """Benchmark the deployment of `spec`: a running `server`, or start tritonserver on its repo first.

    Cost figures use the spec's $/GPU-hour and world size (TP×PP); prompts are counted with the build's tokenizer
    and checked against its max_input_len/max_seq_len before anything is sent. The repo is `repo`, else the
    build's Triton repo located check-only (`invoke build` first). With a `server` and no build here the fixed
    prompt set still runs (no token counts); the shared-prefix workload needs the tokenizer and is refused. Without
    a `server` one is started on free 127.0.0.1 ports and stopped after.
    """
    pricing = Pricing.of(spec)
    missing = None
    if repo is None:
        try:
            repo = built_repo(spec)
        except PipelineError as exc:
            if server is None:
                raise
            missing = str(exc)
    tokenizer_dir = tokenizer_dir_of(repo) if repo else None
    tokenizer = load_tokenizer(tokenizer_dir)
    if workload.shared_prefix_tokens and tokenizer is None:
        raise BenchError(f"--shared-prefix-tokens needs the build's tokenizer to make prompts of that many tokens: "
                         f"{missing or f'{repo} names no tokenizer.json'}; build it here or pass --repo")
    planned = plan_workload(workload, tokenizer=tokenizer, max_input_len=spec.max_input_len,
                            max_seq_len=spec.max_seq_len)  # refused before starting or calling a server

    plain_repo = _plain_repo(spec, workload, server)

    def run(urls: ServerUrls, plain: ServerUrls | None = None) -> BenchReport:
        return run_bench(urls, workload, sweep=sweep, pricing=pricing, tokenizer_dir=tokenizer_dir, planned=planned,
                         second_opinion=second_opinion, plain_server=plain)

    if server is not None:
        report = run(server)
    else:
        if repo is None:  # located above, or that raised
            raise BenchError("no model repository to serve; pass --repo")
        world = pricing.gpus if runtime_of(spec).gpu else 1
        with contextlib.ExitStack() as servers:
            started, plain = (servers.enter_context(TritonServer(Path(r), world_size=world,
                                                                 ready_timeout_s=ready_timeout_s)) if r else None
                              for r in (repo, plain_repo))
            assert started is not None
            report = run(ServerUrls(started.grpc_url, started.metrics_url, started.http_url),
                         ServerUrls(plain.grpc_url, plain.metrics_url, plain.http_url) if plain else None)
    report.model, report.precision = spec.model.name, spec.quantization.precision
    report.speculation_mode, report.draft_len = spec.speculation_mode, spec.draft_len
    return report
