"""Aggregated replicas or disaggregated prefill and decode workers (Dynamo's `--mode disagg`): which one serves the
SLO cheaper (`plan --slo` prints both bests and the verdict).

A disaggregated unit is `x` prefill workers that only run prompts and hand each request's KV cache to `y` decode
workers that only decode. The model composes perf_model's engine steps the way NVIDIA AIConfigurator 0.12 composes
its database's in its agg-vs-disagg search (`aiconfigurator cli default`; aiconfigurator/sdk/inference_session.py
and picking.py):

- a prefill worker runs one prompt per step: its rate is one request per step; its TTFT is that step times
  `PREFILL_QUEUE` (prompts wait at a worker the rate matching keeps busy), plus the KV hand-off over NVLink;
- a decode worker runs decode-only steps of `batch` sequences: its TPOT is one step, its rate `batch` requests per
  `output_len` steps (no prompt ever shares its steps: the point of disaggregating);
- both steps take `STEP_CORRECTION` (what AIConfigurator adds to disaggregated workers' latencies to match silicon);
- `x` and `y` are matched: the unit serves min(x · prefill rate · PREFILL_PAIRING, y · decode rate · DECODE_PAIRING)
  requests/s (pipeline bubbles; decode slots not kept full); the unit is a size whose copies tile nodes (a
  power-of-two share of a node, or whole nodes) within the spec's GPUs.

The constants are AIConfigurator's, which NVIDIA fitted to measurements; tests/planning/test_disagg_agreement.py
checks the verdict and the disagg/agg ratio against recorded AIConfigurator runs (scripts/record_aic_disagg.py).
Disaggregated workers run without speculation on the PyTorch runtime (Dynamo's TensorRT-LLM worker runs only it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import SpecError
from pipeline.core.runtimes import runtime_of
from pipeline.core.gpus import GPUS, gpu_price
from pipeline.core.spec import MAX_UNIT_WORKERS, DisaggTarget, PlannedEstimate, ServingTarget
from pipeline.planning.limits_choice import with_batch
from pipeline.planning.perf_model import CALIBRATION, INTERCONNECT_GB_S, EngineCost, kv_bytes_per_token
from pipeline.planning.placement import capacity, node_gpus
from pipeline.planning.planner import cost_per_1m
from pipeline.planning.slo_search import (
    Candidate, Slo, SloSearch, Structure, Traffic, fit_reason, fleet_hit, layout_overrides, search_space,
    serving_target,
)

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

PREFILL_QUEUE = 1.8  # AIConfigurator's TTFT factor for prompts queueing at a busy prefill worker
STEP_CORRECTION = {"prefill": 1.1, "decode": 1.08}  # its latency corrections of disaggregated workers
PREFILL_PAIRING = 0.9  # its rate-matching shares: pipeline bubbles on prefill ...
DECODE_PAIRING = 0.92  # ... and decode batch slots not kept full
MAX_WORKERS = MAX_UNIT_WORKERS  # per role in a unit (AIConfigurator's default too)
CLOSE = 0.10  # a winner by less than this share is within the estimate's error: say so
RUNTIME = "pytorch"
# A decode worker's batch is its own max batch, set per deployment: searched finely (its rate rises with the batch
# until the TPOT or the KV pool stops it); the largest DECODE_KEEP meeting the TPOT are matched.
DECODE_BATCHES = (*range(1, 16), *range(16, 32, 2), *range(32, 128, 4), *range(128, 1025, 8))
DECODE_KEEP = 16


@dataclass(frozen=True)
class Worker:
    """One role's worker: its layout, its latency (prefill: TTFT; decode: TPOT) and requests/s it serves alone."""

    role: str  # prefill | decode
    precision: str
    tp: int
    batch: int
    latency_ms: float
    requests_per_s: float

    def label(self) -> str:
        at = f" batch {self.batch}" if self.role == "decode" else ""
        return f"{self.role} {self.precision} tp={self.tp}{at}"


@dataclass(frozen=True)
class DisaggCandidate:
    """x prefill + y decode workers matched into one unit, and the units the traffic needs."""

    prefill: Worker
    prefill_workers: int
    decode: Worker
    decode_workers: int
    gpus: int  # one unit
    replicas: int  # units (1 without a rate)
    requests_per_s: float  # one unit, rate-matched
    tokens_per_s_per_gpu: float
    ttft_ms: float
    tpot_ms: float
    cost_per_1m_output_tokens_usd: float

    def label(self) -> str:
        return (f"{self.prefill_workers} x {self.prefill.label()} + {self.decode_workers} x {self.decode.label()} "
                f"({self.gpus} GPUs)")


@dataclass
class ServingModes:
    """The cheapest aggregated configuration (the search's pick) beside the cheapest disaggregated unit, and which
    serves the SLO cheaper. `ratio`: aggregated $ per 1M over disaggregated (above 1: disagg pays)."""

    agg: str
    agg_cost_per_1m_usd: float
    agg_tokens_per_s_per_gpu: float
    disagg: DisaggCandidate | None
    ratio: float | None
    winner: str  # agg | disagg
    note: str = ""  # why disagg was not searched or has no candidate

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        if self.disagg is None:
            return [f"serving mode: aggregated ({self.note})"]
        d, ratio = self.disagg, self.ratio or 0.0
        lines = [f"disaggregated best: {d.label()} x {d.replicas}: TTFT {d.ttft_ms:,.0f} ms, TPOT {d.tpot_ms:.1f} ms, "
                 f"{d.tokens_per_s_per_gpu:,.0f} tok/s per GPU, ${d.cost_per_1m_output_tokens_usd:.4f} per 1M"]
        if self.winner == "disagg":
            verdict = (f"disaggregated pays: {ratio:.2f}x cheaper than aggregated {self.agg} (`--write-spec FILE` "
                       "writes the unit, `invoke build --spec FILE` builds it, `invoke deploy --platform dynamo --spec "
                       "FILE` renders it)")
        else:
            verdict = f"aggregated wins: {1 / ratio:.2f}x cheaper than disaggregated" if ratio else "aggregated wins"
        if abs(ratio - 1) < CLOSE:
            verdict += f" (within {CLOSE:.0%}: inside the estimate's error; measure both with `invoke bench --url`)"
        return lines + [f"serving mode: {verdict}"]


def _worker_spec(spec: BuildSpec, precision: str, tp: int, check: Callable[..., BuildSpec]) -> BuildSpec | None:
    """The spec of a worker of `tp` GPUs (batch 1; no speculation; the PyTorch runtime); None where `check`'s rules
    refuse it."""
    try:
        return check(**layout_overrides(spec, Structure(precision, tp, 1, None, None, RUNTIME, None), batch=1))
    except SpecError:
        return None


def _step_ms(spec: BuildSpec, **step: Any) -> float:
    q = spec.quantization
    cost = EngineCost(spec.model.architecture, q.precision, q.kv, spec.parallelism.tp, GPUS[spec.hardware.gpu])
    return cost.step_ms(CALIBRATION, **step)


def prefill_worker(spec: BuildSpec, traffic: Traffic, *, prefix_hit: float) -> Worker:
    """A prefill worker of `spec` (its TP): one prompt per step, TTFT with the queue and the KV hand-off."""
    block = spec.limits.tokens_per_block
    reused = int(prefix_hit * traffic.input_len) // block * block if spec.serving.enable_kv_cache_reuse else 0
    step = _step_ms(spec, context_tokens=max(1, traffic.input_len - reused), context_len=traffic.input_len,
                    decode_seqs=0, decode_len=0) * STEP_CORRECTION["prefill"]
    arch, gpu = spec.model.architecture, spec.hardware.gpu
    handoff = traffic.input_len * kv_bytes_per_token(arch, spec.quantization.kv) / (INTERCONNECT_GB_S.get(gpu, 64.0)
                                                                                     * 1e6)
    return Worker("prefill", spec.quantization.precision, spec.parallelism.tp, 1,
                  round(step * PREFILL_QUEUE + handoff, 1), 1e3 / step)


def decode_worker(spec: BuildSpec, traffic: Traffic, batch: int) -> Worker:
    """A decode worker of `spec` at `batch`: decode-only steps."""
    step = _step_ms(spec, context_tokens=0, context_len=0, decode_seqs=batch,
                    decode_len=traffic.input_len + traffic.output_len / 2) * STEP_CORRECTION["decode"]
    return Worker("decode", spec.quantization.precision, spec.parallelism.tp, batch, round(step, 2),
                  batch * 1e3 / (step * traffic.output_len))


def unit_sizes(spec: BuildSpec) -> tuple[int, ...]:
    """GPU counts a unit may take so its copies tile nodes: divisors of a node's GPUs, then whole nodes."""
    per, total = node_gpus(spec.hardware), capacity(spec.hardware)
    return tuple(n for n in range(1, total + 1) if (per % n == 0) or (n % per == 0))


@functools.cache
def _pairs(prefill_tp: int, decode_tp: int, sizes: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """(prefill workers, decode workers, GPUs) of every unit of one of `sizes` GPUs."""
    return tuple((x, y, x * prefill_tp + y * decode_tp) for y in range(1, MAX_WORKERS + 1)
                 for x in range(1, MAX_WORKERS + 1) if x * prefill_tp + y * decode_tp in sizes)


def match(p: Worker, d: Worker, sizes: tuple[int, ...]) -> tuple[int, int, float] | None:
    """The prefill and decode worker counts (and the unit's requests/s) with the most requests/s per GPU in a unit
    of one of `sizes` GPUs; None when no pair fits."""
    best: tuple[int, int, float] | None = None
    best_per_gpu = 0.0
    for x, y, gpus in _pairs(p.tp, d.tp, sizes):
        rate = min(x * p.requests_per_s * PREFILL_PAIRING, y * d.requests_per_s * DECODE_PAIRING)
        if rate / gpus > best_per_gpu:
            best, best_per_gpu = (x, y, rate), rate / gpus
    return best


def _unit(p: Worker, d: Worker, matched: tuple[int, int, float], traffic: Traffic, price: float
          ) -> DisaggCandidate:
    x, y, rate = matched
    gpus = x * p.tp + y * d.tp
    replicas, tokens = 1, rate * traffic.output_len
    if traffic.rate:
        replicas = max(1, math.ceil(traffic.rate / rate - 1e-9))
        tokens = traffic.rate * traffic.output_len
    return DisaggCandidate(p, x, d, y, gpus, replicas, round(rate, 3),
                           round(rate * traffic.output_len / gpus, 1), p.latency_ms, d.latency_ms,
                           cost_per_1m(replicas * gpus, price, tokens) or math.inf)


def _decode_workers(one: BuildSpec, traffic: Traffic, slo: Slo, batches: tuple[int, ...]) -> list[Worker]:
    """Decode workers of `one`'s layout at each batch that fits and meets the TPOT (both fail from some batch on)."""
    found: list[Worker] = []
    for batch in batches:
        sized = with_batch(one, batch)
        if fit_reason(sized, traffic, batch) is not None:
            break
        d = decode_worker(sized, traffic, batch)
        if d.latency_ms > slo.tpot_ms:
            break
        found.append(d)
    return found[-DECODE_KEEP:]


def _prefill_for(one: BuildSpec, traffic: Traffic, x: int, replicas: int) -> Worker:
    """`one`'s prefill worker among `x` x `replicas` of them: the fleet's prefix hits under the traffic's routing."""
    return prefill_worker(one, traffic, prefix_hit=fleet_hit(one, 1, traffic, x * replicas))


def search(spec: BuildSpec, slo: Slo, traffic: Traffic, precisions: tuple[str, ...], *,
           check: Callable[..., BuildSpec]) -> DisaggCandidate | None:
    """The cheapest disaggregated unit meeting `slo`: each precision's prefill and decode workers of every TP that
    fits and meets its half of the SLO (the spec's TP and max batch when it sets them), matched (with a prefix share: matched again at the prefill workers' fleet
    hit ratio); None when none does."""
    sizes = unit_sizes(spec)
    price = gpu_price(spec.hardware.gpu, spec.hardware.gpu_price_per_hour).usd_per_hour
    space = search_space(spec, speculation=False)  # a TP or max batch the spec sets stays fixed
    batches = space.batches if len(space.batches) == 1 else DECODE_BATCHES
    best: DisaggCandidate | None = None
    for precision in precisions:
        layouts = [one for tp in space.tps
                   if (one := _worker_spec(spec, precision, tp, check)) is not None
                   and fit_reason(one, traffic, 1) is None]
        decodes = [d for one in layouts for d in _decode_workers(one, traffic, slo, batches)]
        for one in layouts:
            first = _prefill_for(one, traffic, 1, 1)
            if first.latency_ms > slo.ttft_ms:
                continue
            for d in decodes:
                p, matched = first, match(first, d, sizes)
                if matched and traffic.prefix_share:
                    c = _unit(p, d, matched, traffic, price)
                    p = _prefill_for(one, traffic, matched[0], c.replicas)
                    matched = match(p, d, sizes) if p.latency_ms <= slo.ttft_ms else None
                if matched is None:
                    continue
                c = _unit(p, d, matched, traffic, price)
                if best is None or (c.cost_per_1m_output_tokens_usd, c.gpus) < (best.cost_per_1m_output_tokens_usd,
                                                                                 best.gpus):
                    best = c
    return best


def serving_modes(spec: BuildSpec, result: SloSearch, *, check: Callable[..., BuildSpec]) -> ServingModes | None:
    """The search's pick (aggregated) beside the cheapest disaggregated unit at the pick's precision (the quality
    it was picked for) for the same SLO and traffic; None without a pick."""
    pick: Candidate | None = result.pick
    if pick is None:
        return None
    refusal = _unsearched(spec)
    best = None if refusal else search(spec, result.slo, result.traffic, (pick.precision,), check=check)
    ratio = round(pick.cost_per_1m_output_tokens_usd / best.cost_per_1m_output_tokens_usd, 4) if best else None
    return ServingModes(agg=pick.label(), agg_cost_per_1m_usd=pick.cost_per_1m_output_tokens_usd,
                        agg_tokens_per_s_per_gpu=pick.tokens_per_s_per_gpu, disagg=best, ratio=ratio,
                        winner="disagg" if ratio and ratio > 1 else "agg",
                        note=refusal or ("" if best else "no disaggregated unit meets the SLO within the spec's GPUs"))


def written_unit(spec: BuildSpec, result: SloSearch, d: DisaggCandidate) -> tuple[dict[str, Any], ServingTarget]:
    """`--write-spec` of a disaggregated win: the decode workers' layout (the PyTorch runtime, their TP and batch)
    and a `serving_target` of `d.replicas` units with the unit (`disagg`) and its estimate."""
    overrides = layout_overrides(spec, Structure(d.decode.precision, d.decode.tp, 1, None, None, RUNTIME, None),
                                 batch=d.decode.batch)
    planned = serving_target(result)
    estimate = PlannedEstimate(ttft_ms=d.ttft_ms, tpot_ms=d.tpot_ms,
                               tokens_per_s=round(d.requests_per_s * result.traffic.output_len, 1),
                               cost_per_1m_output_tokens_usd=round(d.cost_per_1m_output_tokens_usd, 6))
    unit = DisaggTarget(prefill_workers=d.prefill_workers, prefill_tp=d.prefill.tp, decode_workers=d.decode_workers)
    traffic = planned.traffic.model_copy(update={"acceptance": None})  # the unit does not speculate
    return overrides, planned.model_copy(update={"replicas": d.replicas, "traffic": traffic, "estimate": estimate,
                                                 "disagg": unit})


def _unsearched(spec: BuildSpec) -> str:
    """Why the spec leaves disaggregation out ("" when it does not)."""
    if "runtime" in spec.model_fields_set and not runtime_of(spec).deploys_on("dynamo"):
        return (f"disaggregation not searched: Dynamo's TensorRT-LLM worker runs the pytorch runtime, the spec fixes "
                f"{spec.runtime}")
    if capacity(spec.hardware) < 2:
        return "disaggregation not searched: it needs 2 GPUs or more (--gpu-count)"
    return ""
