"""The cheapest serving configuration for an SLO and a traffic shape (`invoke plan --slo`).

Searches precision x TP x PP x max batch x speculation mode (none; draft-target with the registry's draft; ngram
where the spec's runtime runs it; eagle3 with the registry's head for the model, where the runtime runs it) x K (x runtime where the rules accept only one) with the planner's memory model
(what fits, how many requests the KV pool holds) and its calibrated estimate (TTFT, TPOT, tok/s; speculation through
each mode's acceptance rate and `max_batch_for_speculation`, the planner's load gate: a mode is searched only up to
it; prefix reuse through the prefill it saves). Memory prunes first: a structure that does not
fit at a batch does not fit at a larger one. The spec's intrinsic rules (`resolve_spec`) refuse structures; the pick and the front pass the whole of
`check`'s rules through the `check` callable the caller hands in (`resolve_checked_spec`: stages sit above us).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.core.runtimes import runtime_of, runtime_named
from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPUS, ChosenPrice, gpu_price
from pipeline.core.model_entry import MAX_DRAFT_LEN
from pipeline.core.registry import eagle3_heads
from pipeline.core.spec import (
    DRAFT_TARGET, EAGLE3, NGRAM, SECTIONS, PlannedEstimate, PlannedTraffic, ServingTarget, resolve_spec,
)
from pipeline.core.table import format_table
from pipeline.core.untrusted import parse_json, read_bytes
from pipeline.planning.fleet import Routing, fleet_hit_ratio
from pipeline.planning.fleet_plan import fleet_cache
from pipeline.planning.limits_choice import with_batch
from pipeline.planning.placement import capacity
from pipeline.planning.planner import (
    TP_CHOICES, cost_per_1m, engine_shapes, fit_shortfall, kv_cache_tokens, kv_concurrency, serving_estimate,
)
from pipeline.planning.speculation_modes import MODES, acceptance_for_length

if TYPE_CHECKING:
    from pipeline.core.manifests import PrecisionSearch
    from pipeline.core.spec import BuildSpec

SEARCH_PRECISIONS = ("bf16", "fp8", "int4_awq", "w4a8_awq")
PP_CHOICES = (1, 2)
DRAFT_LENS = (1, 2, 3, 4, 5, 6, 7, 8)  # K; the rules warn above 8
BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
           640, 768, 896, 1024)
RUNTIMES = ("engine", "pytorch")
BENCH_REPORT_MAX_BYTES = 16 << 20  # a bench report is a few KB
LOSSES = ("refused", "does not fit", "misses TTFT", "misses TPOT", "quality unchecked", "costs more")
MAX_FLEET_RESIZES = 4  # fewer fleet hits -> more replicas -> fewer hits: the count settles in one or two
REFERENCE_PRECISIONS = ("bf16", "fp16")  # unquantized: what a quality gate compares against, checked by definition
QUALITY_RANK: dict[str | None, int] = {"checked": 0, "unchecked": 1, "failed": 2}  # the pick prefers the first


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class Traffic:
    """Requests as they arrive: lengths, the prompt share a cached prefix covers, rate (None: fully loaded)."""

    input_len: int
    output_len: int
    prefix_share: float = 0.0
    rate: float | None = None  # requests per second
    acceptance: float | None = None  # per drafted token, of `measured_mode` (None: its default)
    measured_mode: str = DRAFT_TARGET  # the mode `acceptance` was measured in; the others take their defaults
    routing: Routing = Routing()  # the replicas' router and the prefixes' shape (pipeline.planning.fleet)

    def acceptance_for(self, mode: str) -> float:
        """The acceptance rate per drafted token the search assumes for `mode`."""
        if mode == self.measured_mode and self.acceptance is not None:
            return self.acceptance
        return MODES[mode].acceptance

    def describe_acceptance(self) -> str:
        return ", ".join(f"{mode} {self.acceptance_for(mode):.0%}" for mode in MODES)


@dataclass(frozen=True)
class Structure:
    """One engine layout the search varies: everything but the max batch."""

    precision: str
    tp: int
    pp: int
    draft: str | None
    draft_len: int | None
    runtime: str
    mode: str | None = None  # draft-target (with `draft`), eagle3 (with its head as `draft`), ngram, or None

    def label(self, batch: int | None = None) -> str:
        draft = f"draft {self.draft} K={self.draft_len}" if self.draft else "no draft"
        if self.mode == NGRAM:
            draft = f"ngram K={self.draft_len}"
        elif self.mode == EAGLE3:
            draft = f"eagle3 {self.draft} K={self.draft_len}"
        at = f" batch {batch}" if batch is not None else ""
        return f"{self.precision} tp={self.tp} pp={self.pp}{at}, {draft}, {self.runtime}"


@dataclass
class Candidate:
    precision: str
    kv_cache: str
    tp: int
    pp: int
    max_batch: int
    draft: str | None
    draft_len: int | None
    runtime: str
    gpus: int
    ttft_ms: float
    tpot_ms: float
    tokens_per_s: float  # one replica, fully loaded at max_batch
    tokens_per_s_per_gpu: float
    speculation_active: bool
    replicas: int  # 1 without a rate; else enough to serve it
    cost_per_1m_output_tokens_usd: float
    quality: str | None = None  # checked | unchecked | failed (its quality gate); None: not judged
    mode: str | None = None  # the speculation mode (draft-target, eagle3, ngram) or None
    prefix_hit_ratio: float = 0.0  # the estimate's: the traffic's share, the fleet's with replicas (`fleet_hit`)

    def label(self) -> str:
        return self.structure().label(self.max_batch)

    def structure(self) -> Structure:
        return Structure(self.precision, self.tp, self.pp, self.draft, self.draft_len, self.runtime, self.mode)


class ModeVerdict(Protocol):
    """Aggregated vs disaggregated serving for the pick (`pipeline.planning.disagg.ServingModes`, which imports this
    module): its lines under the pick."""

    def lines(self) -> list[str]: ...


@dataclass
class Loss:
    count: int = 0
    example: str = ""


@dataclass
class SloSearch:
    model: str
    gpu: str
    gpu_price_per_hour: float
    gpu_price_source: str
    slo: Slo
    traffic: Traffic
    searched: int
    pick: Candidate | None
    front: list[Candidate]  # Pareto front of the fitting candidates within the TTFT: tok/s per GPU up, TPOT down
    losses: dict[str, Loss] = field(default_factory=dict)
    nearest_miss: str = ""
    precisions: tuple[str, ...] = ()  # the precisions searched
    precision_source: str = "searched"  # or the quality record whose passing set they are
    quality_note: str = ""  # how quality weighed in the pick ("" when not judged)
    speculation_note: str = ""  # why the pick's speculation mode: the best of each other mode, or why unsearched
    serving_modes: ModeVerdict | None = None  # the pick beside the cheapest disaggregated unit (planning.disagg)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Space:
    precisions: tuple[str, ...]
    tps: tuple[int, ...]
    pps: tuple[int, ...]
    modes: tuple[tuple[str | None, str | None, int | None], ...]  # (speculation mode, draft model, K)
    batches: tuple[int, ...]
    runtimes: tuple[str, ...]
    unsearched: dict[str, str] = field(default_factory=dict)  # speculation mode -> why the search leaves it out


def search_space(spec: BuildSpec, *, speculation: bool = True, precisions: tuple[str, ...] | None = None) -> _Space:
    """Every dimension the searched spec left unset is searched; what the user set stays fixed. `precisions`: the
    precisions that passed the quality gate (a `precision: auto` build's record) replace the default candidates."""
    q, p, lim, sp = spec.quantization, spec.parallelism, spec.limits, spec.speculation
    given_batch = "max_batch_size" in lim.model_fields_set and "max_batch_size" not in spec.limit_reasons
    gpus = capacity(spec.hardware)
    placed = spec.placement_reason is not None  # a TP chosen by cost for want of one is searched again
    tps = (p.tp,) if "tp" in p.model_fields_set and not placed else tuple(t for t in TP_CHOICES if t <= gpus)
    pps = (p.pp,) if "pp" in p.model_fields_set and not placed else PP_CHOICES
    draft_name = spec.model.default_draft
    modes: list[tuple[str | None, str | None, int | None]] = [(None, None, None)]
    unsearched: dict[str, str] = {}
    if {"draft", "speculative_decoding"} & sp.model_fields_set:  # the spec's mode (or none) is fixed
        if spec.speculation_mode is not None:
            draft = spec.draft_model.name if spec.draft_model else None
            modes = [(spec.speculation_mode, draft, spec.draft_len)]
        unsearched = {m: "the spec fixes its speculation mode" for m in MODES if m != spec.speculation_mode}
    elif speculation:
        lens = (sp.draft_len,) if sp.draft_len else DRAFT_LENS
        if draft_name:
            modes += [(DRAFT_TARGET, draft_name, k) for k in lens]
        else:
            unsearched[DRAFT_TARGET] = f"{spec.model.name} has no default draft model"
        refusal = _mode_refusal(spec, NGRAM)
        if refusal is None:
            modes += [(NGRAM, None, k) for k in lens]
        else:
            unsearched[NGRAM] = refusal
        heads = eagle3_heads(spec.model.name, models_file=spec.models_file)
        refusal = _mode_refusal(spec, EAGLE3, heads[0].name) if heads else (
            f"no EAGLE-3 head in the registry is trained for {spec.model.name} (`plan --compare` estimates one)")
        if refusal is None:
            modes += [(EAGLE3, heads[0].name, k) for k in lens]
        else:
            unsearched[EAGLE3] = refusal
    return _Space(
        precisions=(q.precision,) if "precision" in q.model_fields_set else (precisions or SEARCH_PRECISIONS),
        tps=tps, pps=pps, modes=tuple(modes), batches=(spec.max_batch_size,) if given_batch else BATCHES,
        runtimes=(spec.runtime,) if "runtime" in spec.model_fields_set else RUNTIMES, unsearched=unsearched)


def _mode_refusal(spec: BuildSpec, mode: str, draft: str | None = None) -> str | None:
    """Why the spec's rules refuse speculation `mode` (with `draft`: eagle3's head) on the spec's runtime (given or
    default: the search does not switch runtimes to reach a mode), else None."""
    s = Structure(spec.quantization.precision, spec.parallelism.tp, spec.parallelism.pp, draft, None, spec.runtime,
                  mode)
    try:
        _structure_spec(spec, s)
    except SpecError as exc:
        return str(exc)
    return None


def _structure_spec(spec: BuildSpec, s: Structure) -> BuildSpec:
    """`spec` as structure `s` at batch 1, the spec's intrinsic rules applied (the batch is varied on a copy).

    Raises:
        SpecError: a rule of the spec refuses the structure.
    """
    return resolve_spec(**layout_overrides(spec, s, batch=1))


def fit_reason(spec: BuildSpec, traffic: Traffic, batch: int) -> str | None:
    """Why `spec` at max batch `batch` does not serve `batch` requests of the traffic's lengths; None if it does."""
    gpu = GPUS[spec.hardware.gpu]
    if fit_shortfall(spec, *engine_shapes(spec), gpu) > 0:
        return f"weights, activations and one {spec.max_seq_len}-token sequence exceed a {gpu.name}"
    fits, concurrent = kv_concurrency(spec, gpu, traffic.input_len, traffic.output_len)
    if not fits or concurrent < batch:
        return (f"its KV pool holds {concurrent} requests of {traffic.input_len}+{traffic.output_len} tokens, "
                f"fewer than batch {batch}")
    return None


def _batches(space: _Space, s: Structure, gate: int) -> tuple[int, ...]:
    """The batches searched for `s`: with speculation only up to the planner's load gate (above it speculation is
    gated off and the same engine without it serves as cheap or cheaper)."""
    if s.mode is None:
        return space.batches
    return tuple(b for b in space.batches if b <= gate) or space.batches[:1]


def _fitting_count(spec: BuildSpec, traffic: Traffic, batches: tuple[int, ...]) -> int:
    """How many of the ascending `batches` fit (fit is monotone: bisect, the memory model's cost dominates)."""
    low, high = 0, len(batches)
    while low < high:
        mid = (low + high) // 2
        if fit_reason(with_batch(spec, batches[mid]), traffic, batches[mid]) is None:
            low = mid + 1
        else:
            high = mid
    return low


def _candidate(spec: BuildSpec, s: Structure, batch: int, traffic: Traffic, price: float) -> Candidate:
    """One configuration at `batch`: its estimate, and with a rate the replicas it provisions, paid whether busy
    or not; with more than one, the estimate is at the fleet's prefix-hit ratio under the traffic's routing (more
    replicas for fewer hits: re-sized until the count holds)."""
    gpu = GPUS[spec.hardware.gpu]
    terms: dict[str, Any] = dict(tp=s.tp, batch=batch, input_len=traffic.input_len, output_len=traffic.output_len,
                                 acceptance=traffic.acceptance_for(s.mode) if s.mode else None)
    hit = traffic.prefix_share
    est, active = serving_estimate(spec, gpu, prefix_hit_ratio=hit, **terms)
    gpus = s.tp * s.pp
    replicas = 1
    cost = cost_per_1m(gpus, price, est.output_tokens_per_s) or math.inf
    if traffic.rate:  # provisioned replicas, paid whether busy or not, over the tokens the traffic asks for
        demand = traffic.rate * traffic.output_len
        replicas = max(1, math.ceil(demand / est.output_tokens_per_s - 1e-9))
        for _ in range(MAX_FLEET_RESIZES):
            hit = fleet_hit(spec, batch, traffic, replicas)
            est, active = serving_estimate(spec, gpu, prefix_hit_ratio=hit, **terms)
            needed = max(1, math.ceil(demand / est.output_tokens_per_s - 1e-9))
            if needed <= replicas:
                break
            replicas = needed
        cost = cost_per_1m(replicas * gpus, price, demand) or math.inf
    return Candidate(
        precision=s.precision, kv_cache=spec.quantization.kv, tp=s.tp, pp=s.pp, max_batch=batch, draft=s.draft,
        draft_len=s.draft_len, runtime=s.runtime, gpus=gpus, ttft_ms=round(est.ttft_ms, 1),
        tpot_ms=round(est.tpot_ms, 2), tokens_per_s=round(est.output_tokens_per_s, 1),
        tokens_per_s_per_gpu=round(est.output_tokens_per_s / gpus, 1), speculation_active=active,
        replicas=replicas, cost_per_1m_output_tokens_usd=cost, mode=s.mode, prefix_hit_ratio=round(hit, 4))


def fleet_hit(spec: BuildSpec, batch: int, traffic: Traffic, replicas: int) -> float:
    """The prefix-hit ratio of `replicas` copies of `spec` at `batch` (the traffic's share with one)."""
    if replicas <= 1 or traffic.prefix_share <= 0:
        return traffic.prefix_share
    tokens = kv_cache_tokens(spec, GPUS[spec.hardware.gpu], traffic.input_len, traffic.output_len)
    cache = fleet_cache(spec, replicas=replicas, kv_tokens=tokens, ceiling=batch, input_len=traffic.input_len,
                        output_len=traffic.output_len, prefix_hit_ratio=traffic.prefix_share)
    return traffic.prefix_share if cache is None else fleet_hit_ratio(traffic.prefix_share, cache, traffic.routing)


def _structures(spec: BuildSpec, space: _Space, losses: dict[str, Loss]) -> Iterator[tuple[Structure, BuildSpec]]:
    """(structure, its spec) for each structure some runtime's rules accept; refusals counted in `losses`."""
    gate = spec.speculation.max_batch_for_speculation
    for precision in space.precisions:
        for tp in space.tps:
            for pp in space.pps:
                if tp * pp > capacity(spec.hardware):
                    continue
                for mode, draft, k in space.modes:
                    refusal = ""
                    for runtime in space.runtimes:  # the first runtime whose rules accept it
                        s = Structure(precision, tp, pp, draft, k, runtime, mode)
                        try:
                            yield s, _structure_spec(spec, s)
                            break
                        except SpecError as exc:
                            refusal = refusal or f"{s.label()}: {exc}"
                    else:
                        _lose(losses, "refused", refusal, len(_batches(space, s, gate)))


def _lose(losses: dict[str, Loss], why: str, example: str, count: int = 1) -> None:
    loss = losses.setdefault(why, Loss())
    loss.count += count
    loss.example = loss.example or example


def _verdict(c: Candidate, slo: Slo) -> str | None:
    if c.ttft_ms > slo.ttft_ms:
        return "misses TTFT"
    if c.tpot_ms > slo.tpot_ms:
        return "misses TPOT"
    return None


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Candidates no other beats on both tok/s per GPU (higher) and TPOT (lower), by TPOT."""
    front: list[Candidate] = []
    for c in sorted(cands, key=lambda c: (c.tpot_ms, -c.tokens_per_s_per_gpu)):
        if not front or c.tokens_per_s_per_gpu > front[-1].tokens_per_s_per_gpu:
            front.append(c)
    return front


def _miss_ratio(c: Candidate, slo: Slo) -> float:
    return max(c.ttft_ms / slo.ttft_ms, c.tpot_ms / slo.tpot_ms)


def _order(c: Candidate) -> tuple[float, int, float, float]:
    return (c.cost_per_1m_output_tokens_usd, c.gpus * c.replicas, c.tpot_ms, c.ttft_ms)


def quality_of(precision: str, verdicts: Mapping[str, bool]) -> str:
    """`checked` (a passing quality gate, or unquantized), `failed` (only failing ones) or `unchecked` (none)."""
    if precision in REFERENCE_PRECISIONS or verdicts.get(precision):
        return "checked"
    return "failed" if precision in verdicts else "unchecked"


def search(spec: BuildSpec, slo: Slo, traffic: Traffic, *, check: Callable[..., BuildSpec],
           speculation: bool = True, precisions: tuple[str, ...] | None = None,
           precision_source: str = "searched", quality: Mapping[str, bool] | None = None) -> SloSearch:
    """The cheapest candidate meeting `slo` ($ per 1M output tokens), the Pareto front, and why the rest lose.

    `check(model=..., **overrides)` is `check`'s whole rule set (`resolve_checked_spec`): the pick and the front's
    members pass it or are refused. `speculation=False` searches without a draft (AIConfigurator's space).
    `precisions` narrows the precisions searched (those that passed the quality gate; `precision_source` says
    where that set came from, printed with the result). `quality`: precision -> whether a quality gate of this
    model passed it (`quality_verdicts`); the pick then prefers checked precisions (bf16 is the reference) over
    cheaper unchecked ones and says so; None: quality is not judged (the cheapest wins).
    """
    if not runtime_of(spec).gpu:
        raise SpecError("plan --slo: the search plans GPU serving (target trtllm); drop --target reference")
    if slo.ttft_ms <= 0 or slo.tpot_ms <= 0:
        raise SpecError("plan --slo: --ttft-ms and --tpot-ms must be > 0")
    if not 0.0 <= traffic.prefix_share <= 1.0 or not 0.0 <= (traffic.acceptance or 0.0) <= 1.0:
        raise SpecError("plan --slo: --prefix-share and --acceptance must be within 0..1")
    space = search_space(spec, speculation=speculation, precisions=precisions)
    price = gpu_price(spec.hardware.gpu, spec.hardware.gpu_price_per_hour)
    losses: dict[str, Loss] = {}
    fitting: list[Candidate] = []
    for s, sspec in _structures(spec, space, losses):
        batches = _batches(space, s, sspec.speculation.max_batch_for_speculation)
        fits = _fitting_count(sspec, traffic, batches)
        if fits < len(batches):  # larger batches fit less: count them all, evaluate none
            first = batches[fits]
            why = fit_reason(with_batch(sspec, first), traffic, first)
            _lose(losses, "does not fit", f"{s.label(first)}: {why}", len(batches) - fits)
        fitting += [_candidate(with_batch(sspec, b), s, b, traffic, price.usd_per_hour) for b in batches[:fits]]
    if quality is not None:
        for c in fitting:
            c.quality = quality_of(c.precision, quality)
    searched = sum(loss.count for loss in losses.values()) + len(fitting)
    result = _decide(spec, slo, traffic, fitting, losses, check=check, price=price, searched=searched)
    result.precisions, result.precision_source = space.precisions, precision_source
    result.speculation_note = _speculation_note(result.pick, fitting, slo, space.unsearched)
    return result


def _mode_name(mode: str | None) -> str:
    return mode or "no speculation"


def _speculation_note(pick: Candidate | None, fitting: list[Candidate], slo: Slo, unsearched: Mapping[str, str]
                      ) -> str:
    """Why the pick's speculation mode: its cost beside the cheapest candidate of each other mode meeting the SLO,
    and the modes the search left out."""
    if pick is None:
        return ""
    parts = []
    for mode in (None, *MODES):
        if mode == pick.mode:
            continue
        if mode is not None and mode in unsearched:
            parts.append(f"{mode} not searched ({unsearched[mode]})")
            continue
        rivals = [c for c in fitting if c.mode == mode]
        best = min((c for c in rivals if _verdict(c, slo) is None), key=_order, default=None)
        if best is not None:
            parts.append(f"{_mode_name(mode)} at best ${best.cost_per_1m_output_tokens_usd:.4f} ({best.label()})")
        elif rivals:
            parts.append(f"{_mode_name(mode)}: none of {len(rivals)} fitting meets the SLO")
    gated = " (gated off at this batch)" if pick.mode and not pick.speculation_active else ""
    return (f"speculation: {_mode_name(pick.mode)}{gated}, the cheapest meeting the SLO at "
            f"${pick.cost_per_1m_output_tokens_usd:.4f} per 1M; " + "; ".join(parts))


def _checked(spec: BuildSpec, c: Candidate, check: Callable[..., BuildSpec]) -> str | None:
    """None when `check`'s rules accept the candidate, else their one line."""
    try:
        check(**layout_overrides(spec, c.structure(), batch=c.max_batch))
    except SpecError as exc:
        return str(exc)
    return None


def _decide(spec: BuildSpec, slo: Slo, traffic: Traffic, fitting: list[Candidate], losses: dict[str, Loss], *,
            check: Callable[..., BuildSpec], price: ChosenPrice, searched: int) -> SloSearch:
    meeting = []
    for c in fitting:
        why = _verdict(c, slo)
        if why:
            _lose(losses, why, f"{c.label()}: TTFT {c.ttft_ms:,.0f} ms, TPOT {c.tpot_ms:.1f} ms")
        else:
            meeting.append(c)
    pick, tried = None, set()
    for c in sorted(meeting, key=lambda c: (QUALITY_RANK.get(c.quality, 0), *_order(c))):
        tried.add(id(c))
        refusal = _checked(spec, c, check)
        if refusal is None:
            pick = c
            break
        _lose(losses, "refused", f"{c.label()}: {refusal}")
    if pick is not None:
        for c in sorted((c for c in meeting if id(c) not in tried), key=_order):
            cost = f"{c.label()}: ${c.cost_per_1m_output_tokens_usd:.4f} per 1M"
            if _order(c) < _order(pick):  # cheaper, passed over for its quality
                _lose(losses, "quality unchecked", f"{cost}, quality {c.quality}")
            else:
                _lose(losses, "costs more", cost)
    timely = [c for c in fitting if c.ttft_ms <= slo.ttft_ms]
    front = [c for c in pareto_front(timely) if c is pick or _checked(spec, c, check) is None]
    if pick is not None and pick not in front:  # with a rate, cost is not tok/s per GPU alone
        front = sorted([*front, pick], key=lambda c: (c.tpot_ms, -c.tokens_per_s_per_gpu))
    nearest = ""
    if pick is None and fitting:
        near = min(fitting, key=lambda c: _miss_ratio(c, slo))
        nearest = f"{near.label()}: TTFT {near.ttft_ms:,.0f} ms, TPOT {near.tpot_ms:.1f} ms"
    ordered = {k: losses[k] for k in LOSSES if k in losses}
    note = _quality_note(pick, ordered.get("quality unchecked"))
    return SloSearch(spec.model.name, spec.hardware.gpu, price.usd_per_hour, price.source, slo, traffic, searched,
                     pick, front, ordered, nearest, quality_note=note)


def _quality_note(pick: Candidate | None, passed_over: Loss | None) -> str:
    """How quality weighed in the pick: checked and preferred (naming the cheaper unchecked option), or none of
    those meeting the SLO checked (the cheapest picked)."""
    if pick is None or pick.quality is None:
        return ""
    check = "`invoke build --precision auto` (or a build at that precision) checks it against the quality gate"
    if pick.quality != "checked":
        return (f"quality: no precision meeting the SLO has a passing quality gate of this model (all unchecked): "
                f"picked the cheapest, {pick.precision} ({pick.quality}); {check}")
    why = "the unquantized reference" if pick.precision in REFERENCE_PRECISIONS else "its quality gate passed"
    if passed_over is None:
        return f"quality: {pick.precision} is checked ({why})"
    return (f"quality: prefers checked precisions: {pick.precision} is checked ({why}) over {passed_over.count:,} "
            f"cheaper unchecked (e.g. {passed_over.example}); {check}")


def layout_overrides(spec: BuildSpec, s: Structure, *, batch: int) -> dict[str, Any]:
    """`resolve_spec`/`check` keyword arguments for structure `s` at max batch `batch` out of the searched spec:
    what the user set is kept, limits the memory model chose are left unset, the draft's placement defaults."""
    overrides: dict[str, Any] = {}
    for section in (spec.quantization, spec.parallelism, spec.limits, spec.speculation, spec.serving, spec.hardware):
        overrides.update(section.model_dump(exclude_unset=True))
    overrides.update(dict.fromkeys(spec.limit_reasons))
    overrides.update(precision=s.precision, tp=s.tp, pp=s.pp, draft=s.draft, draft_len=s.draft_len,
                     max_batch_size=batch, draft_precision=None, draft_gpu_device_ids=None,
                     speculative_decoding=s.mode if s.mode in (NGRAM, EAGLE3) else None)
    if s.mode != NGRAM:
        overrides.update(max_matching_ngram_size=None)
    if s.draft is None or runtime_named(s.runtime, spec.target).llmapi:  # the LLM API runs the draft in the target
        overrides.update(draft_tp=None, draft_max_batch_size=None)
    return dict(model=spec.model.name, target=spec.target, runtime=s.runtime, models_file=spec.models_file,
                **overrides)


def serving_target(r: SloSearch) -> ServingTarget:
    """The pick's `serving_target` spec section: the replicas it provisions, the SLO, the traffic and its estimate.

    Raises:
        SpecError: the search has no pick.
    """
    p, t = r.pick, r.traffic
    if p is None:
        raise SpecError("plan --slo: no pick to record; relax the SLO")
    return ServingTarget(
        replicas=p.replicas, ttft_ms=r.slo.ttft_ms, tpot_ms=r.slo.tpot_ms,
        traffic=PlannedTraffic(input_len=t.input_len, output_len=t.output_len, prefix_share=t.prefix_share,
                               acceptance=t.acceptance_for(p.mode or t.measured_mode), rate=t.rate,
                               shared_prefixes=t.routing.shape.prefixes,
                               requests_per_prefix=t.routing.shape.requests_per_prefix),
        estimate=PlannedEstimate(ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms, tokens_per_s=p.tokens_per_s,
                                 cost_per_1m_output_tokens_usd=round(p.cost_per_1m_output_tokens_usd, 6)))


def spec_document(overrides: dict[str, Any]) -> dict[str, Any]:
    """A spec file's mapping (model:, runtime:, quantization:, ...) of flat `resolve_spec` overrides, unset ones
    left out."""
    doc: dict[str, Any] = {k: overrides[k] for k in ("model", "target", "runtime", "models_file")
                           if overrides.get(k) is not None}
    for key, value in overrides.items():
        if value is None or key in doc:
            continue
        section = next((name for name, cls in SECTIONS.items() if key in cls.model_fields), None)
        if section is None:
            raise SpecError(f"plan --slo: '{key}' is no spec field")
        doc.setdefault(section, {})[key] = value
    return doc


def read_bench_terms(path: str | Path, *, model: str, precision: str | None,
                     accept_foreign: bool = False) -> dict[str, Any]:
    """`acceptance` and `prefix_share` from an `invoke bench --json-file` report (its `acceptance_rate` and
    `prefix_cache_hit_ratio`; other keys ignored, absent or null ones left out), once its top-level `model` and
    `precision` are `model` and `precision` (None: the search varies precision, any one is taken). A report that
    names its `speculation_mode` and K (`draft_len`) adds `mode`, and its acceptance becomes the perf model's rate:
    bench's rate is accepted over drafted tokens, a mean accepted length of 1 + K x rate, which
    `speculation_modes.acceptance_for_length` turns into the rate per drafted token the planner chains.

    Raises:
        SpecError: the file is missing, too large, not a JSON object, a value is outside 0..1, or the report is of
            another (or an unnamed) model or precision and `accept_foreign` is not set.
    """
    p = Path(path)
    fix = "pass the file `invoke bench --json-file` wrote"
    try:
        raw = read_bytes(p, cap=BENCH_REPORT_MAX_BYTES, what=f"--bench-report {p}", fix=fix, error=SpecError)
        data = parse_json(raw.decode("utf-8"), what=f"--bench-report {p}", fix=fix, error=SpecError)
    except FileNotFoundError:
        raise SpecError(f"--bench-report {p} does not exist; {fix}") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SpecError(f"--bench-report {p} is not a readable JSON report ({exc.__class__.__name__}); {fix}") from None
    if not isinstance(data, dict):
        raise SpecError(f"--bench-report {p}: expected a JSON object (`invoke bench --json-file`)")
    if not accept_foreign:
        _same_build(p, data, model, precision)
    terms = {}
    for ours, theirs in (("acceptance", "acceptance_rate"), ("prefix_share", "prefix_cache_hit_ratio")):
        value = data.get(theirs)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise SpecError(f"--bench-report {p}: {theirs}={value!r} must be a number within 0..1")
        terms[ours] = float(value)
    mode, k = data.get("speculation_mode"), data.get("draft_len")
    if mode is not None:
        if mode not in MODES:
            raise SpecError(f"--bench-report {p}: speculation_mode={mode!r} is none of {', '.join(MODES)}")
        terms["mode"] = mode
        if "acceptance" in terms and isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_DRAFT_LEN:
            terms["acceptance"] = round(acceptance_for_length(1 + k * terms["acceptance"], k), 4)
    return terms


def _same_build(p: Path, data: dict[str, Any], model: str, precision: str | None) -> None:
    """Refuse a report measured on another model or precision (an unnamed one counts as another)."""
    theirs = [v if isinstance(v, str) and v else "unknown" for v in (data.get("model"), data.get("precision"))]
    if theirs[0] == model and precision in (None, theirs[1]) and theirs[1] != "unknown":
        return
    ours = f"{model} {precision}" if precision else f"{model} (any precision)"
    raise SpecError(f"--bench-report {p} measured model {theirs[0]} precision {theirs[1]}, not {ours} as searched; "
                    f"pass a report `invoke bench --json-file` wrote for {model}, or --accept-foreign-bench-report to "
                    "use its acceptance and prefix share anyway")


def passing_precisions(record: PrecisionSearch, spec: BuildSpec, path: Path) -> tuple[str, ...]:
    """The precisions a `precision: auto` record (`PrecisionSearch`) found within the quality gate, for `spec`.

    Raises:
        SpecError: the record is of another model, or nothing in it passed the gate.
    """
    if record.model != spec.model.name:
        raise SpecError(f"--precision-search {path} records {record.model}, not {spec.model.name}; pass the "
                        f"record of a `--precision auto` build of {spec.model.name}")
    passing = tuple(p for p in record.passing if p in SEARCH_PRECISIONS or p == "int8_sq")
    if not passing:
        raise SpecError(f"--precision-search {path}: no precision passed the quality gate there; search without it "
                        "or re-run `invoke build --precision auto` with better calibration data")
    return passing


def _draft_cell(c: Candidate) -> str:
    if c.mode is None:
        return "-"
    name = f"{c.draft} K={c.draft_len}" if c.draft else f"{c.mode} K={c.draft_len}"
    if c.mode == EAGLE3:
        name = f"eagle3 {name}"
    return name + ("" if c.speculation_active else " (gated off)")


def _shape_flags(t: Traffic) -> str:
    """The plan flags that repeat the traffic's prefix shape (also recorded in the written spec's traffic)."""
    shape = t.routing.shape
    return (f" --shared-prefixes {shape.prefixes}" if shape.prefixes > 1 else "") + \
        (f" --prefix-requests {shape.requests_per_prefix:g}" if shape.requests_per_prefix is not None else "")


def format_search(r: SloSearch) -> str:
    """The pick, the Pareto front as a table, and one line per kind of loss (count and an example)."""
    t, slo = r.traffic, r.slo
    rate = f", {t.rate:g} req/s" if t.rate else ", fully loaded"
    lines = [f"{r.model} on {r.gpu} at ${r.gpu_price_per_hour:.2f}/GPU-h: SLO TTFT <= {slo.ttft_ms:g} ms, "
             f"TPOT <= {slo.tpot_ms:g} ms; {t.input_len}+{t.output_len} tokens, prefix share {t.prefix_share:.0%}, "
             f"acceptance {t.describe_acceptance()}{rate}; {r.searched:,} configurations searched"]
    if r.pick is not None:
        p = r.pick
        lines.append(f"pick: {p.label()}: TTFT {p.ttft_ms:,.0f} ms, TPOT {p.tpot_ms:.1f} ms, "
                     f"{p.tokens_per_s_per_gpu:,.0f} tok/s per GPU, ${p.cost_per_1m_output_tokens_usd:.4f} per 1M "
                     f"output tokens ({p.replicas} x {p.gpus} GPU{'s' if p.gpus > 1 else ''})")
        if p.replicas > 1 and t.prefix_share > 0:
            lines.append(f"fleet: {p.replicas} replicas behind {t.routing.router} routing: prefix hit "
                         f"{p.prefix_hit_ratio:.0%} of one server's {t.prefix_share:.0%} "
                         f"({t.routing.shape.prefixes} shared prefix{'es' if t.routing.shape.prefixes > 1 else ''}; "
                         f"`invoke plan --spec PICK --input-len {t.input_len} --output-len {t.output_len} "
                         f"--prefix-hit {t.prefix_share:g}{_shape_flags(t)}` compares round-robin with KV routing)")
        lines += [r.quality_note] if r.quality_note else []
        lines += [r.speculation_note] if r.speculation_note else []
        lines += r.serving_modes.lines() if r.serving_modes else []
    head = ("", "precision", "KV", "tp", "pp", "batch", "speculation", "runtime", "TTFT ms", "TPOT ms", "tok/s/GPU",
            "$/1M tok", "SLO", "quality")
    rows = [head]
    for c in r.front:
        verdict = _verdict(c, slo)
        rows.append(("*" if c is r.pick else "", c.precision, c.kv_cache, str(c.tp), str(c.pp), str(c.max_batch),
                     _draft_cell(c), c.runtime, f"{c.ttft_ms:,.0f}", f"{c.tpot_ms:.1f}",
                     f"{c.tokens_per_s_per_gpu:,.0f}", f"{c.cost_per_1m_output_tokens_usd:.4f}",
                     verdict or "meets", c.quality or "-"))
    lines += ["", f"Pareto front within TTFT {slo.ttft_ms:g} ms (tok/s per GPU vs TPOT; * the pick)",
              format_table(rows, header=True), "",
              "why the others lose"]
    lines += [f"  {why}: {loss.count:,} (e.g. {loss.example})" for why, loss in r.losses.items()]
    lines += ["", f"precisions: {', '.join(r.precisions)} ({r.precision_source})", f"GPU price: {r.gpu_price_source}",
              "$ per 1M output tokens = replicas x GPUs x $/GPU-h / 3600 / output tok/s x 1e6 (estimates: "
              "`invoke plan --compare` explains the model)"]
    return "\n".join(lines)
