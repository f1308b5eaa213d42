"""The prefix-cache hit ratio of N replicas behind a router, from one server's ratio (pure arithmetic).

`h1` is one server's hit ratio for the traffic when its cache holds the traffic's shared prefixes (`plan
--prefix-hit`, a spec's `prefix_share`: the share of prompt tokens the prefixes cover; a bench report's measured
ratio on one server). The fleet's ratio follows under these assumptions:

- The traffic's shared prefixes: `prefixes` distinct ones of `prefix_tokens` reusable tokens each (whole KV blocks),
  chosen uniformly and independently per request (the worst case for a given working set; skewed popularity and
  ordered traffic do better), each reused by `requests_per_prefix` requests over its life (None: a prefix lives
  forever, e.g. one system prompt; a chat session: its turns).
- Each replica's cache: `cache_tokens` free for idle prefixes (its KV pool less what in-flight requests hold), evicted
  LRU. Under uniform independent choice an LRU cache of C tokens holds a prefix when it is asked for with probability
  held(C) = min(1, C / W), W = prefixes x prefix_tokens (the working set). The request rate does not enter: a replica
  that sees 1/N of the requests sees the same prefixes in the same proportions.
- Cold misses: a prefix's first request on a replica misses. Round-robin (or random) routing sends a prefix's m
  requests to reached = N(1 - (1 - 1/N)^m) distinct replicas on average, each missing once: a share reached/m of
  them (none in steady state, m unbounded).

Then:

- round-robin: every replica caches every prefix: h1 x held(C) x (1 - reached/m).
- KV-aware routing: a prefix's requests go to the replica holding it, so the replicas pool their caches and a prefix
  misses once: h1 x held(N x C) x (1 - 1/m). The router trades overlap against load: a `spill` share of requests
  goes where round-robin would have sent it (a stated parameter, `DEFAULT_SPILL`, not fitted to a measurement).

With one replica both give h1 x held(C) x (1 - 1/m): h1 itself for bench's workload (one shared prefix that fits,
reused forever), which is the planner's single-server figure. Round-robin loses to KV routing where the working set
outgrows one replica's cache or prefixes are reused by few requests (chat sessions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import SpecError

ROUTINGS = ("round-robin", "kv")
# Share of requests the KV router sends away from the replica holding their prefix to balance load. Dynamo's
# router scores overlap against load; 0.1 is a conservative guess for a loaded fleet, not a fit.
DEFAULT_SPILL = 0.1


@dataclass(frozen=True)
class PrefixShape:
    """How the traffic shares prefixes: `prefixes` distinct ones, each reused by `requests_per_prefix` requests
    over its life (the defaults: bench's shared-prefix workload, one prefix for every request, forever)."""

    prefixes: int = 1
    requests_per_prefix: float | None = None  # None: unbounded (steady state)


@dataclass(frozen=True)
class FleetCache:
    """The fleet: `replicas`, each with `cache_tokens` free for idle prefixes; one prefix's reusable tokens."""

    replicas: int
    cache_tokens: float
    prefix_tokens: int


@dataclass(frozen=True)
class Routing:
    """Which router the deployment has (`ROUTINGS`), the traffic's prefixes, and the KV router's load spill."""

    router: str = "round-robin"
    shape: PrefixShape = PrefixShape()
    spill: float = DEFAULT_SPILL

    def __post_init__(self) -> None:
        if self.router not in ROUTINGS:
            raise SpecError(f"router {self.router!r}: expected one of {', '.join(ROUTINGS)}")
        m = self.shape.requests_per_prefix
        if self.shape.prefixes < 1 or (m is not None and m < 1) or not 0.0 <= self.spill <= 1.0:
            raise SpecError("fleet prefix model: --shared-prefixes and --prefix-requests must be >= 1 and the KV "
                            "router's spill within 0..1; pass values in range")


def held(cache_tokens: float, working_set: float) -> float:
    """The probability an LRU cache of `cache_tokens` holds a prefix asked for (uniform independent choice)."""
    return 1.0 if working_set <= 0 else max(0.0, min(1.0, cache_tokens / working_set))


def replicas_reached(requests: float | None, replicas: int) -> float:
    """Distinct replicas that round-robin/random routing sends `requests` requests of one prefix to, on average
    (None: unbounded, every replica)."""
    if requests is None:
        return float(replicas)
    return replicas * (1.0 - math.pow(1.0 - 1.0 / replicas, requests))


def _warm(requests: float | None, reached: float) -> float:
    """Share of a prefix's requests that are not its first on their replica."""
    return 1.0 if requests is None else max(0.0, 1.0 - reached / requests)


def fleet_hit_ratio(h1: float, cache: FleetCache, routing: Routing) -> float:
    """The fleet's expected hit ratio under `routing` from one server's `h1` (the module's derivation)."""
    shape, n = routing.shape, cache.replicas
    working_set = shape.prefixes * cache.prefix_tokens
    m = shape.requests_per_prefix
    spread = h1 * held(cache.cache_tokens, working_set) * _warm(m, replicas_reached(m, max(1, n)))
    if routing.router == "round-robin" or n <= 1:
        return spread
    pooled = h1 * held(n * cache.cache_tokens, working_set) * _warm(m, 1.0)
    return (1.0 - routing.spill) * pooled + routing.spill * spread


def traffic_routing(traffic: Any, router: str = "round-robin") -> Routing:
    """`router` over the prefix shape a spec's planned traffic recorded (`serving_target.traffic`)."""
    return Routing(router, PrefixShape(traffic.shared_prefixes, traffic.requests_per_prefix))
