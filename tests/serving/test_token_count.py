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
