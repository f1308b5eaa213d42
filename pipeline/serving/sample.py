"""One bench request's measurements (`pipeline.serving.bench` sums them into a level's figures)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestSample:
    ok: bool
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    reused_blocks: int | None = None  # prefix-cache blocks reused (the OpenAI route: cached prompt tokens)
    total_blocks: int | None = None  # blocks newly allocated (the OpenAI route: prompt tokens not cached)
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None
    error: str | None = None
    token_source: str | None = None  # a key of pipeline.serving.token_count.SOURCES
    speculated: bool | None = None  # total_draft_tokens > 0 (None: the route reports no draft tokens)
    ttft_source: str | None = None  # "stream" (client-observed) | "server" (the server's token timestamps)
    arm: str = "server"  # the level's speculation arm: "server" | "off"

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (decode speed seen by one request)."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)
