"""One output-token count for smoke and bench on every route (pipeline.serving.token_count)."""

from __future__ import annotations

import pytest

from pipeline.serving.smoke import count_tokens
from pipeline.serving.token_count import SOURCES, count_output_tokens, stream_token_count


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "quick", "brown", "fox", "jumps"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_the_servers_count_wins_on_every_route(tokenizer):
    text = "the quick brown fox"
    unary = count_output_tokens(server_counts=[24], text=text, tokenizer=tokenizer)
    stream = count_output_tokens(server_counts=[1] * 24, streamed=True, stream_chunks=20, text=text,
                                 tokenizer=tokenizer)
    assert (unary.tokens, unary.source) == (stream.tokens, stream.source) == (24, "server")


def test_stream_counts_cumulative_or_per_response():
    assert stream_token_count([1, 1, 1, 1]) == 4
    assert stream_token_count([1, 2, 3, 4]) == 4
    assert stream_token_count([2, 1, 3]) == 6
    assert stream_token_count([]) == 0


def test_without_a_server_count(tokenizer):
    text = "the quick brown fox jumps"
    c = count_output_tokens(text=text, tokenizer=tokenizer)
    assert (c.tokens, c.source) == (5, "tokenizer")
    c = count_output_tokens(streamed=True, stream_chunks=3, text=text, tokenizer=tokenizer)
    assert (c.tokens, c.source) == (3, "stream")  # one token per streamed response
    c = count_output_tokens(streamed=True, stream_chunks=3, text=text, tokenizer=tokenizer, retokenize=True)
    assert (c.tokens, c.source) == (5, "tokenizer")  # responses carrying several tokens (llmapi): re-tokenized
    c = count_output_tokens(text="a b c")
    assert (c.tokens, c.source) == (3, "words")
    assert all(s in SOURCES for s in ("server", "stream", "tokenizer", "responses", "words"))


def test_smoke_routes_use_the_same_count():
    http = count_tokens(None, "x y", [24])
    grpc = count_tokens(None, "x y", [1] * 24, streamed=True, stream_chunks=2)
    assert http == grpc and http.source == "server"


def test_server_count_reads_num_output_tokens_else_sequence_length():
    import numpy as np

    from pipeline.serving.token_count import server_count

    class Result:
        def __init__(self, **outputs):
            self.outputs = outputs

        def as_numpy(self, name):
            if name not in self.outputs:
                raise KeyError(name)  # as tritonclient does for an output the response lacks
            return np.array([[self.outputs[name]]], dtype=np.int32)

    assert server_count(Result(num_output_tokens=24, sequence_length=30)) == 24
    assert server_count(Result(sequence_length=30)) == 30
    assert server_count(Result()) is None


class _Recording:
    """A tokenizer that records how many characters it was asked to encode."""

    def __init__(self, tok):
        self.tok, self.chars = tok, 0

    def encode(self, text, add_special_tokens=True):
        self.chars += len(text)
        return self.tok.encode(text, add_special_tokens=add_special_tokens)


def test_a_prompt_far_over_the_limit_is_counted_only_until_it_is_surely_over(tokenizer):
    """A 2.4 M-character prompt against a 1,000-token limit: the count is over the limit, and the tokenizer saw
    at most a few chunks of it, never the whole prompt."""
    from pipeline.serving.token_count import PROMPT_CHUNK_CHARS, prompt_tokens

    rec = _Recording(tokenizer)
    text = "the quick brown fox " * 120_000
    n = prompt_tokens(rec, text, limit=1000)
    assert 1000 < n <= len(tokenizer.encode(text).ids)
    assert rec.chars <= 2 * PROMPT_CHUNK_CHARS < len(text) // 10


def test_a_long_prompt_within_the_limit_is_counted_exactly(tokenizer):
    from pipeline.serving.token_count import PROMPT_CHUNK_CHARS, prompt_tokens

    text = "the quick brown fox jumps " * (3 * PROMPT_CHUNK_CHARS // 26)
    exact = len(tokenizer.encode(text).ids)
    assert len(text) > 2 * PROMPT_CHUNK_CHARS
    assert prompt_tokens(tokenizer, text, limit=exact) == exact
    assert prompt_tokens(tokenizer, text, limit=exact + 10_000) == exact
    assert prompt_tokens(tokenizer, text, limit=exact - 1) >= exact - 1  # over the limit, counted up to it


def test_bench_refuses_a_prompt_far_over_max_input_len_saying_at_least(tokenizer):
    from pipeline.core.errors import BenchError
    from pipeline.serving.bench import check_prompt_limits

    rec = _Recording(tokenizer)
    huge = "the quick brown fox " * 200_000
    with pytest.raises(BenchError, match=r"is at least \d+ tokens with the build's tokenizer, over its "
                                         r"max_input_len 2048"):
        check_prompt_limits([huge, "the fox"], rec, max_tokens=16, max_input_len=2048, max_seq_len=4096)
    assert rec.chars < len(huge) // 10
