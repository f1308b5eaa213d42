"""Every coherence rule, triggered by the exact bad input (FACTS §3 + support matrix)."""

from __future__ import annotations

import pytest

from pipeline.errors import SpecError
from pipeline.spec import resolve_spec


def reject(match: str, **kw):
    with pytest.raises(SpecError, match=match) as info:
        resolve_spec(**kw)
    assert "\n" not in str(info.value)  # one line
    return str(info.value)


def test_fp8_on_a100_rejected():
    msg = reject(r"hardware.gpu=a100: SM 8.0 has no FP8", model="llama-8b", precision="fp8", gpu="a100")
    assert "--gpu h100-sxm" in msg


def test_fp8_kv_on_a100_rejected_even_with_int4_weights():
    reject(r"no FP8", model="llama-8b", precision="int4_awq", kv_cache="fp8", gpu="a100",
           enable_kv_cache_reuse=False, enable_chunked_context=False)


def test_w4a8_needs_fp8_hardware():
    reject(r"no FP8", model="llama-8b", precision="w4a8_awq", gpu="a100")


def test_a100_bf16_accepted_with_warning():
    spec = resolve_spec(model="llama-8b", precision="bf16", gpu="a100")
    assert any("SM 8.0" in w for w in spec.warnings)


def test_l40s_fp8_accepted():
    spec = resolve_spec(model="llama-8b", precision="fp8", gpu="l40s")
    assert spec.quantization.kv == "fp8"


@pytest.mark.parametrize("precision", ["int4_awq", "int8_sq", "bf16"])
def test_fp8_kv_without_fp8_quant_loses_paged_context_fmha(precision):
    msg = reject(r"disables FP8 and so paged context FMHA", model="llama-70b", precision=precision, kv_cache="fp8")
    assert "KV reuse" in msg and "--kv-cache bf16" in msg


def test_int4_fp8_kv_allowed_without_reuse_or_chunking():
    spec = resolve_spec(model="llama-70b", precision="int4_awq", kv_cache="fp8",
                        enable_kv_cache_reuse=False, enable_chunked_context=False)
    assert spec.quantization.kv == "fp8"


def test_int4_fp8_kv_cannot_be_speculation_target():
    reject(r"draft-target speculation", model="llama-70b", precision="int4_awq", kv_cache="fp8", draft="llama-1b",
           enable_kv_cache_reuse=False, enable_chunked_context=False)


def test_int8_kv_disables_paged_context_fmha():
    reject(r"INT8 KV cache disables paged context FMHA", model="llama-8b", precision="int8_sq", kv_cache="int8")


def test_context_fmha_off_blocks_reuse(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-8b\nlimits: {context_fmha: false}\n")
    reject(r"context_fmha is disabled", spec_file=f)


def test_unquantized_kv_must_match_compute_dtype():
    reject(r"kv_cache=bf16: an unquantized KV cache uses the compute dtype fp16", model="llama-8b",
           precision="fp16", kv_cache="bf16")


def test_draft_with_other_tokenizer_rejected():
    msg = reject(r"must share one tokenizer", model="tiny-llama", precision="fp8", draft="llama-1b")
    assert "tiny-bpe-v1" in msg and "llama3" in msg


def test_draft_equal_to_target_rejected():
    reject(r"is the target itself", model="llama-8b", draft="llama-8b")


@pytest.mark.parametrize("k", [0, 9])
def test_draft_len_out_of_range(k):
    reject(r"draft_len=%d: must be within 1..8" % k, model="llama-70b", draft="llama-1b", draft_len=k)


def test_draft_len_without_draft():
    reject(r"no draft model", model="llama-70b", draft_len=4)


def test_auto_draft_uses_registry_default():
    spec = resolve_spec(model="llama-70b", tp=4, draft="auto", max_batch_size=4)
    assert spec.draft_model.name == "llama-1b" and spec.draft_len == 5
    assert spec.max_num_tokens >= 4 * 6


def test_auto_draft_without_default():
    reject(r"has no default_draft", model="llama-1b", draft="auto")


def test_speculation_at_high_batch_warns():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=64)
    assert any("max_batch_size=64" in w for w in spec.warnings)
    quiet = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=4)
    assert not quiet.warnings


def test_speculation_beam_search_rejected(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-70b\nspeculation: {draft: llama-1b}\nlimits: {max_beam_width: 2}\n")
    reject(r"max_beam_width=2", spec_file=f)


def test_speculation_memory_fractions(tmp_path):
    msg = reject(r"sum to 1.10 > 0.95", model="llama-70b", draft="llama-1b", kv_cache_free_gpu_mem_fraction=0.9)
    assert "--mem-fraction" in msg  # the flag that exists (pipeline/cli.py SPEC_FLAGS)


def test_tp_must_divide_heads():
    reject(r"tp=3: target tiny-llama has 8 attention heads", model="tiny-llama", tp=3)


def test_tp_must_divide_or_cover_kv_heads():
    reject(r"tp=12: target llama-3b has 8 KV heads", model="llama-3b", tp=12, gpu_count=16)


def test_tp_beyond_kv_heads_replicates():
    spec = resolve_spec(model="tiny-llama", tp=8)
    assert spec.parallelism.tp == 8


def test_pp_beyond_layers():
    reject(r"pp=8: target tiny-llama has only 4 layers", model="tiny-llama", pp=8)


def test_awq_block_per_rank():
    msg = reject(r"needs hidden_size/tp divisible by the AWQ block size 128", model="tiny-llama",
                 precision="int4_awq", tp=4)
    assert "tiny-llama" in msg
    assert resolve_spec(model="tiny-llama", precision="int4_awq", tp=2).parallelism.tp == 2


def test_world_size_beyond_host_gpus():
    reject(r"tp×pp=16 exceeds hardware.gpu_count=8", model="llama-70b", tp=8, pp=2)


def test_max_seq_len_beyond_positions():
    reject(r"max_seq_len=2000 exceeds tiny-llama's max_position_embeddings=1024", model="tiny-llama",
           max_seq_len=2000)


def test_max_seq_len_plus_draft_beyond_positions():
    reject(r"\+ draft_len 4 exceeds", model="tiny-llama", draft="auto", max_seq_len=1024)


def test_input_len_must_leave_room():
    reject(r"max_input_len=512 must be below max_seq_len=512", model="tiny-llama", max_input_len=512)


def test_opt_num_tokens_with_multiple_profiles(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-8b\nlimits: {opt_num_tokens: 512}\n")
    msg = reject(r"opt_num_tokens=512 cannot be combined with multiple_profiles", spec_file=f)
    assert "--no-multiple-profiles" in msg and "--opt-num-tokens" not in msg  # no such flag
    f.write_text("model: llama-8b\nlimits: {opt_num_tokens: 512, multiple_profiles: false}\n")
    assert resolve_spec(spec_file=f).limits.opt_num_tokens == 512


def test_max_num_tokens_below_input_without_chunking():
    reject(r"max_num_tokens=1024 is below max_input_len=4096", model="llama-8b", max_num_tokens=1024,
           enable_chunked_context=False)


def test_max_num_tokens_raised_for_speculation():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=8, max_num_tokens=16)
    assert spec.max_num_tokens == 8 * 6 or spec.max_num_tokens >= 48
    assert any("raised" in w for w in spec.warnings)


def test_unknown_precision_lists_choices():
    msg = reject(r"quantization.precision='fp9'", model="llama-8b", precision="fp9")
    assert "'int4_awq'" in msg


def test_unknown_gpu():
    reject(r"hardware.gpu='b200'", model="llama-8b", gpu="b200")


def test_validation_is_fast():
    import time

    t = time.perf_counter()
    for _ in range(20):
        resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="auto")
    assert (time.perf_counter() - t) / 20 < 0.1
