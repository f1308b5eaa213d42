"""One way to count a response's output tokens, shared by smoke and bench on every route (HTTP, gRPC unary and
streaming, ensemble, BLS, llmapi): the server's own count when it reports one, else one token per streamed
response, else the text re-tokenized with the build's tokenizer, else whitespace words; each count says its source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.tokenizer import load_tokenizer_json

SOURCES = {
    "server": "the server's num_output_tokens/sequence_length",
    "stream": "streamed responses",
    "tokenizer": "re-tokenizing the text",
    "responses": "responses (no tokenizer)",
    "words": "whitespace words (no tokenizer)",
}


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    source: str  # a key of SOURCES


def stream_token_count(counts: Sequence[int]) -> int:
    """Tokens of a stream from per-response server counts: cumulative counts (strictly increasing, ending at
    least at the number of responses) give the last one; per-response counts are summed."""
    if len(counts) > 1 and all(b > a for a, b in zip(counts, counts[1:])) and counts[-1] >= len(counts):
        return counts[-1]
    return sum(counts)


def server_count(result: Any) -> int | None:
    """Output tokens one gRPC response reports: `num_output_tokens`, else `sequence_length` (None: neither)."""
    for name in ("num_output_tokens", "sequence_length"):
        try:
            arr = result.as_numpy(name)
        except Exception:  # tritonclient raises when the response has no such output
            arr = None
        if arr is not None and arr.size:
            return int(arr.reshape(-1)[0])
    return None


def load_tokenizer(tokenizer_dir: str | Path | None) -> Any:
    """A `tokenizers.Tokenizer` from `tokenizer_dir/tokenizer.json` (None when there is none).

    Raises:
        PipelineError: it is not a regular file, oversized or not a tokenizer (`core.tokenizer.load_tokenizer_json`).
    """
    if not tokenizer_dir:
        return None
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    return load_tokenizer_json(path, fix="pass the build's tokenizer directory (--tokenizer-dir)")


PROMPT_CHUNK_CHARS = 65_536  # a prompt longer than this is counted a chunk at a time, up to the limit


def prompt_tokens(tokenizer: Any, text: str, *, limit: int) -> int:
    """Tokens of a prompt as preprocessing counts them (special tokens added), exactly when at most `limit`.

    A prompt over `PROMPT_CHUNK_CHARS` characters is tokenized a chunk at a time (cut at whitespace) and counting
    stops once it is surely over `limit` (each cut may add up to two tokens, so they are taken off): the count
    returned is then over `limit` but only a lower bound, and the work and memory stay proportional to `limit`, not
    to the prompt. A prompt that ends before that is tokenized whole, exactly.
    """
    if len(text) > PROMPT_CHUNK_CHARS:
        counted = len(tokenizer.encode("").ids)  # the special tokens preprocessing adds
        start = cuts = 0
        while start < len(text):
            end = min(len(text), start + PROMPT_CHUNK_CHARS)
            if end < len(text):
                space = text.rfind(" ", start + PROMPT_CHUNK_CHARS // 2, end)
                end, cuts = (space if space > start else end), cuts + 1
            counted += len(tokenizer.encode(text[start:end], add_special_tokens=False).ids)
            if counted - 2 * cuts > limit:
                return counted - 2 * cuts
            start = end
    return len(tokenizer.encode(text).ids)


def count_output_tokens(*, server_counts: Sequence[int] = (), streamed: bool = False, stream_chunks: int = 0,
                        text: str = "", tokenizer: Any = None, retokenize: bool = False) -> TokenCount:
    """Output tokens of one response (or one streamed request).

    Args:
        server_counts: the server's count from each response that carried one (`num_output_tokens`, else
            `sequence_length`)
        streamed: the request streamed (`stream_chunks` responses with text)
        text: the whole output text (for re-tokenizing)
        tokenizer: the build's `tokenizers.Tokenizer`, or None
        retokenize: prefer the tokenizer over streamed responses (a route whose responses carry several tokens,
            such as the llmapi model's cumulative text)
    """
    counted = (stream_token_count(server_counts) if streamed else server_counts[-1]) if server_counts else 0
    if counted > 0:
        return TokenCount(counted, "server")
    if tokenizer is not None and text and (retokenize or not (streamed and stream_chunks)):
        return TokenCount(len(tokenizer.encode(text, add_special_tokens=False).ids), "tokenizer")
    if streamed and stream_chunks:
        return TokenCount(stream_chunks, "stream")
    if tokenizer is not None:
        return TokenCount(0, "tokenizer")
    return TokenCount(len(text.split()), "words")
