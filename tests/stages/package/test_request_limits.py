"""The request ceilings every Python model of the repository imports (templates/triton/request_limits.py) and the
LLM-API model's sampling checks (templates/llmapi/.../llmapi_io.py): each field that multiplies work or memory at,
just over and far over its ceiling, and every float sampling value finite."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[3] / "pipeline" / "templates"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rl = _load("request_limits_under_test", TEMPLATES / "triton" / "request_limits.py")
LIMITS = rl.Limits(max_batch_size=8, max_beam_width=1, vocab_size=1000, max_seq_len=256, max_input_len=128)


@pytest.fixture(scope="module")
def llmapi_io():
    stub = types.ModuleType("triton_python_backend_utils")
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = stub
    try:
        yield _load("llmapi_io_under_test", TEMPLATES / "llmapi" / "tensorrt_llm" / "1" / "llmapi_io.py")
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


# ------------------------------------------------------------------------------------------------ ceilings
@pytest.mark.parametrize("n", [1, 8])
def test_num_return_sequences_up_to_the_max_batch_size_passes(n):
    rl.check_ceilings(LIMITS, num_return_sequences=n)


@pytest.mark.parametrize("n", [9, 100_000])
def test_num_return_sequences_over_the_max_batch_size_is_refused(n):
    with pytest.raises(rl.RequestError, match=f"num_return_sequences {n} is over the build's max batch size 8; "
                                              "send num_return_sequences <= 8"):
        rl.check_ceilings(LIMITS, num_return_sequences=n)


def test_num_return_sequences_with_beam_search_is_bounded_by_the_beam_width():
    wide = rl.Limits(max_batch_size=8, max_beam_width=4)
    rl.check_ceilings(wide, beam_width=4, num_return_sequences=4)
    with pytest.raises(rl.RequestError, match="num_return_sequences 5 is over beam_width 4"):
        rl.check_ceilings(wide, beam_width=4, num_return_sequences=5)


@pytest.mark.parametrize("beam", [2, 100_000])
def test_beam_width_over_the_build_is_refused(beam):
    rl.check_ceilings(LIMITS, beam_width=1)
    with pytest.raises(rl.RequestError, match=f"beam_width {beam} is not supported: over the build's "
                                              "max_beam_width 1"):
        rl.check_ceilings(LIMITS, beam_width=beam)


def test_request_output_len_fits_beside_the_prompt():
    rl.check_ceilings(LIMITS, request_output_len=156, input_len=100)
    with pytest.raises(rl.RequestError, match="request_output_len 157 is over max_seq_len 256 - prompt length 100; "
                                              "send request_output_len <= 156"):
        rl.check_ceilings(LIMITS, request_output_len=157, input_len=100)
    with pytest.raises(rl.RequestError, match="request_output_len 257 is over max_seq_len 256;"):
        rl.check_ceilings(LIMITS, request_output_len=257)


@pytest.mark.parametrize("out_len", [0, -5])
def test_request_output_len_below_one_is_refused(out_len):
    with pytest.raises(rl.RequestError, match=f"request_output_len must be > 0, got {out_len}"):
        rl.check_ceilings(LIMITS, request_output_len=out_len)


def test_min_tokens_over_max_seq_len_is_refused():
    rl.check_ceilings(LIMITS, min_tokens=256)
    with pytest.raises(rl.RequestError, match="min_tokens 257 is over max_seq_len 256"):
        rl.check_ceilings(LIMITS, min_tokens=257)


def test_logits_over_the_byte_limit_are_refused():
    big = rl.Limits(max_batch_size=64, vocab_size=128_000, max_seq_len=8192)
    rl.check_ceilings(big, request_output_len=2000, logits=True)  # 2000 x 128000 x 4 = 1.02e9 < 2^30
    rl.check_ceilings(big, request_output_len=8000, num_return_sequences=64)  # no logits asked: no limit
    with pytest.raises(rl.RequestError, match="the logits asked for would be 4096000000 bytes, over the limit"):
        rl.check_ceilings(big, request_output_len=8000, logits=True)


def test_unknown_limits_check_nothing_but_the_positive_length():
    rl.check_ceilings(rl.Limits(), beam_width=4, num_return_sequences=4, request_output_len=10**9)
    rl.check_ceilings(rl.Limits(), num_return_sequences=10_000, logits=True)


def test_limits_come_from_the_model_config():
    config = {"max_batch_size": 4, "parameters": {"max_beam_width": {"string_value": "2"},
                                                  "max_seq_len": {"string_value": "512"},
                                                  "max_input_len": {"string_value": "${max_input_len}"}}}
    limits = rl.Limits.from_config(config, vocab_size=32000)
    assert (limits.max_batch_size, limits.max_beam_width, limits.max_seq_len, limits.max_input_len,
            limits.vocab_size) == (4, 2, 512, None, 32000)
    assert limits.word_tokens() == 512


# ------------------------------------------------------------------------------------------------ word lists, bias
def test_word_lists_are_bounded_by_the_input_length():
    rl.check_word_tokens("stop_words", 128, LIMITS)
    with pytest.raises(rl.RequestError, match="stop_words holds 129 token ids, over the limit of 128"):
        rl.check_word_tokens("stop_words", 129, LIMITS)


def test_bias_weights_pass_when_finite_and_at_most_one_per_token():
    assert rl.check_bias("embedding_bias_weights", [0.5, -2.0, 1e30], LIMITS) == [0.5, -2.0, 1e30]
    rl.check_bias("embedding_bias_weights", [0.0] * 1000, LIMITS)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_bias_weights_must_be_finite(bad):
    with pytest.raises(rl.RequestError, match=f"embedding_bias_weights must be finite, got {bad}"):
        rl.check_bias("embedding_bias_weights", [1.0, bad], LIMITS)


def test_bias_weights_over_the_vocab_are_refused():
    with pytest.raises(rl.RequestError, match=r"has 1001 values; it needs at most one per vocabulary token \(1000\)"):
        rl.check_bias("embedding_bias_weights", [0.0] * 1001, LIMITS)


def test_an_embedding_bias_needs_exactly_one_value_per_token():
    rl.check_bias("embedding_bias", [0.0] * 1000, LIMITS, exact=True)
    with pytest.raises(rl.RequestError, match=r"has 999 values; it needs one per vocabulary token \(1000\)"):
        rl.check_bias("embedding_bias", [0.0] * 999, LIMITS, exact=True)


def test_a_bias_value_that_is_not_a_number_is_refused():
    with pytest.raises(rl.RequestError, match="embedding_bias_weights must be a number, got 'x'"):
        rl.check_bias("embedding_bias_weights", ["x"], LIMITS)


# ------------------------------------------------------------------------------------------------ sampling values
FLOATS = ["temperature", "runtime_top_p", "runtime_top_p_min", "runtime_top_p_decay", "repetition_penalty",
          "presence_penalty", "frequency_penalty", "len_penalty", "beam_search_diversity_rate"]


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_every_float_sampling_value_must_be_finite(name, bad):
    with pytest.raises(rl.RequestError, match=f"{name} must be finite, got {bad}; send a finite number"):
        rl.check_sampling({name: bad})


def test_in_range_sampling_values_pass():
    rl.check_sampling({"temperature": 0.0, "runtime_top_p": 1.0, "runtime_top_p_min": 0.0, "runtime_top_p_decay": 1.0,
                       "repetition_penalty": 1e-6, "presence_penalty": -2.0, "frequency_penalty": 2.0,
                       "len_penalty": 0.0, "beam_search_diversity_rate": 0.0, "num_return_sequences": 1,
                       "beam_width": 1, "runtime_top_k": 0, "min_tokens": 0, "runtime_top_p_reset_ids": 0})
    rl.check_sampling({"runtime_top_p": 0.0})  # <= 0: unset, as the tensorrtllm backend reads it


@pytest.mark.parametrize(("name", "value", "message"), [
    ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
    ("runtime_top_p", 1.5, r"runtime_top_p must be in \(0, 1\], got 1.5"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0"),
    ("num_return_sequences", 0, "num_return_sequences must be >= 1, got 0"),
])
def test_out_of_range_sampling_values_are_refused(name, value, message):
    with pytest.raises(rl.RequestError, match=message):
        rl.check_sampling({name: value})


# ------------------------------------------------------------------------------------------------ LLM-API model
@pytest.mark.parametrize("name", ["temperature", "top_p", "frequency_penalty", "presence_penalty"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_llmapi_float_sampling_values_must_be_finite(llmapi_io, name, bad):
    with pytest.raises(llmapi_io.BadRequest, match=f"sampling_param_{name} must be finite, got {bad}"):
        llmapi_io.check_sampling({name: bad})


def test_llmapi_ceilings_come_from_the_llm_arguments(llmapi_io):
    ceilings = llmapi_io.request_ceilings({"max_batch_size": 8, "max_seq_len": 256, "max_input_len": 128})
    assert ceilings == {"best_of": 8, "max_tokens": 256}
    llmapi_io.check_sampling({"best_of": 8, "max_tokens": 256, "frequency_penalty": -1.5}, ceilings)
    with pytest.raises(llmapi_io.BadRequest, match="sampling_param_best_of 100000 is over the build's max_batch_size 8"):
        llmapi_io.check_sampling({"best_of": 100_000}, ceilings)
    with pytest.raises(llmapi_io.BadRequest, match="sampling_param_max_tokens 257 is over the build's max_seq_len 256"):
        llmapi_io.check_sampling({"max_tokens": 257}, ceilings)
    assert llmapi_io.request_ceilings({}) == {}
