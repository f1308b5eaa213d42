"""The planner's fleet prefix figures: with a spec's `serving_target` of N > 1 replicas, the prefix-hit ratio the
estimate uses is the fleet's under the deployment's router (`pipeline.planning.fleet`), and the plan says what KV
routing saves against round-robin (hit ratio, TTFT, $ per 1M output tokens) at the operating point."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pipeline.planning.fleet import FleetCache

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec


def replicas_of(spec: BuildSpec) -> int:
    """The replicas the spec's `serving_target` provisions (1 without one)."""
    return spec.serving_target.replicas if spec.serving_target is not None else 1


def fleet_cache(spec: BuildSpec, *, replicas: int, kv_tokens: int, ceiling: int, input_len: int, output_len: int,
                prefix_hit_ratio: float) -> FleetCache | None:
    """Each of `replicas`' cache for idle prefixes: its KV pool (`kv_tokens`) less the unshared tokens of a full
    batch (`ceiling`) in flight; None with one replica or nothing reused (block reuse off, or no prefix hit)."""
    block = spec.limits.tokens_per_block
    reused = int(prefix_hit_ratio * input_len) // block * block if spec.serving.enable_kv_cache_reuse else 0
    if replicas <= 1 or reused <= 0:
        return None
    own = math.ceil((input_len - reused + output_len) / block) * block
    return FleetCache(replicas, max(0.0, kv_tokens - ceiling * own), reused)


@dataclass(frozen=True)
class FleetPrefix:
    """The plan's `fleet`: the replicas, the router the estimate assumes, and per router the fleet hit ratio and
    the estimate's TTFT and $ per 1M output tokens at the operating point."""

    replicas: int
    router: str
    shared_prefixes: int
    requests_per_prefix: float | None  # None: unbounded (steady state)
    spill: float
    hit_ratio: dict[str, float]
    ttft_ms: dict[str, float]
    cost_per_1m_output_tokens_usd: dict[str, float | None]

    def kv_saves(self) -> tuple[float | None, float]:
        """$ per 1M and TTFT ms that KV routing saves against round-robin (negative: it costs)."""
        rr, kv = self.cost_per_1m_output_tokens_usd["round-robin"], self.cost_per_1m_output_tokens_usd["kv"]
        usd = round(rr - kv, 4) if rr is not None and kv is not None else None
        return usd, round(self.ttft_ms["round-robin"] - self.ttft_ms["kv"], 1)

    def as_dict(self) -> dict[str, Any]:
        usd, ttft = self.kv_saves()
        return asdict(self) | {"kv_saves_usd_per_1m": usd, "kv_saves_ttft_ms": ttft}

    def line(self) -> str:
        """One line: both routings' hit ratios and what KV routing saves."""
        usd, ttft = self.kv_saves()
        h = self.hit_ratio
        saving = f"${usd:.4f} per 1M output tokens" if usd is not None else "n/a per 1M output tokens"
        return (f"prefix hit over {self.replicas} replicas: {h['round-robin']:.0%} round-robin vs {h['kv']:.0%} KV "
                f"routing ({self.shared_prefixes} shared prefix{'es' if self.shared_prefixes > 1 else ''}); KV "
                f"routing saves {saving} and {ttft:g} ms TTFT")
