"""The prefix-cache hit ratio of N replicas behind a router, from one server's ratio (pure arithmetic).

`h1` is one server's hit ratio for the traffic (`plan --prefix-hit`, a spec's `prefix_share`, or a bench report's
measured ratio): the share of prompt tokens served from its cache. The fleet's ratio is `h1` times what N replicas
change, under these assumptions:

- The traffic's shared prefixes: `prefixes` distinct ones of `prefix_tokens` reusable tokens each (whole KV blocks),
  chosen uniformly and independently per request (the worst case for a given working set; skewed popularity and
  ordered traffic do better), each reused by `requests_per_prefix` requests over its life (math.inf: a prefix lives
  forever, e.g. one system prompt; a chat session: its turns).
- Each replica's cache: `cache_tokens` free for idle prefixes (its KV pool less what in-flight requests hold), evicted
  LRU. Under uniform independent choice an LRU cache of C tokens holds a prefix when it is asked for with probability
  held(C) = min(1, C / working set), the working set being prefixes x prefix_tokens.
- Cold misses: a prefix's first request on a replica misses. One server takes 1 per prefix: a share 1/m of the
  prefix's m requests. Round-robin (or random) routing sends its m requests to N(1 - (1 - 1/N)^m) distinct replicas
  on average, each of them missing once.

Then, relative to one server taking the whole traffic with the same cache per replica:

- round-robin: each replica sees every prefix at 1/N of the rate; the LRU hit probability depends on the popularity
  and the cache size, not the rate, so held(C) is unchanged; only the cold misses multiply: h1 x (1 - reached/m) /
  (1 - 1/m). In steady state (m = inf) round-robin keeps h1, and gives up the N x C tokens of cache it could pool.
- KV-aware routing: each prefix stays on the replica that holds it, so the fleet pools its caches: held(N x C), one
  cold miss per prefix: h1 x held(N x C) / held(C), at most the share the prefixes cover. The router trades overlap
  against load: a `spill` share of requests goes where round-robin would have sent them (a stated parameter,
  `DEFAULT_SPILL`, not fitted to a measurement).

With one replica both routings give h1, so a single server's figures are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    requests_per_prefix: float = math.inf


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
        if self.shape.prefixes < 1 or self.shape.requests_per_prefix < 1 or not 0.0 <= self.spill <= 1.0:
            raise SpecError("fleet prefix model: prefixes and requests per prefix must be >= 1, spill within 0..1")


def held(cache_tokens: float, working_set: float) -> float:
    """The probability an LRU cache of `cache_tokens` holds a prefix asked for (uniform independent choice)."""
    return 1.0 if working_set <= 0 else max(0.0, min(1.0, cache_tokens / working_set))


def replicas_reached(requests: float, replicas: int) -> float:
    """Distinct replicas that round-robin/random routing sends `requests` requests of one prefix to, on average."""
    if math.isinf(requests):
        return float(replicas)
    return replicas * (1.0 - math.pow(1.0 - 1.0 / replicas, requests))


def _warm(requests: float, reached: float) -> float:
    """Share of a prefix's requests that are not its first on their replica."""
    return 1.0 if math.isinf(requests) else max(0.0, 1.0 - reached / requests)


def single_server_hit(share: float, cache: FleetCache, shape: PrefixShape) -> float:
    """One server's expected ratio when prefixes cover `share` of every prompt (the model's h1, for a traffic
    described by its shape rather than measured)."""
    working_set = shape.prefixes * cache.prefix_tokens
    return share * held(cache.cache_tokens, working_set) * _warm(shape.requests_per_prefix, 1.0)


def fleet_hit_ratio(h1: float, cache: FleetCache, routing: Routing) -> float:
    """The fleet's expected hit ratio under `routing` from one server's `h1` (the module's derivation)."""
    shape, n = routing.shape, cache.replicas
    kept = held(cache.cache_tokens, shape.prefixes * cache.prefix_tokens)
    first = _warm(shape.requests_per_prefix, 1.0)
    if n <= 1 or h1 <= 0 or kept <= 0 or first <= 0:
        return h1
    spread = h1 * _warm(shape.requests_per_prefix, replicas_reached(shape.requests_per_prefix, n)) / first
    if routing.router == "round-robin":
        return spread
    pooled = h1 * held(n * cache.cache_tokens, shape.prefixes * cache.prefix_tokens) / kept
    return min(1.0, (1.0 - routing.spill) * pooled + routing.spill * spread)
