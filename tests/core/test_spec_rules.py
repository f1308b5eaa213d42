"""Every coherence rule, triggered by the exact bad input (the support matrix)."""

from __future__ import annotations

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec


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


@pytest.mark.parametrize("k", [0, -1])
def test_draft_len_below_one_rejected(k):
    msg = reject(r"speculation.draft_len=%d: must be >= 1" % k, model="llama-70b", tp=4, draft="llama-1b",
                 draft_len=k)
    assert "--draft-len" in msg


@pytest.mark.parametrize("k", [9, 10, 16])
def test_long_draft_len_is_a_warning_not_a_refusal(k):
    # upstream's examples/draft_target_model README: draft_len "from 4 to 10 in common usage"; no bound in build()
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", draft_len=k, max_batch_size=4)
    assert spec.draft_len == k
    assert [w for w in spec.warnings if f"draft_len={k}" in w and "4-6" in w]


@pytest.mark.parametrize("k", [1, 5, 8])
def test_usual_draft_len_has_no_warning(k):
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", draft_len=k, max_batch_size=4)
    assert spec.warnings == []


@pytest.mark.parametrize("field, value", [("draft_tp", 2), ("draft_max_batch_size", 4),
                                          ("draft_gpu_device_ids", [1])])
def test_draft_engine_settings_without_draft(field, value):
    reject(rf"speculation.{field} is set but no draft model", model="llama-70b", tp=4, **{field: value})


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
    assert "--mem-fraction" in msg  # the flag that exists (pipeline/cli/flags/flags.py SPEC_FLAGS)


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


def test_max_seq_len_beyond_positions():
    reject(r"max_seq_len=2000 exceeds tiny-llama's max_position_embeddings=1024", model="tiny-llama",
           max_seq_len=2000)


def test_max_seq_len_plus_draft_beyond_positions():
    reject(r"\+ draft_len 4 exceeds", model="tiny-llama", draft="auto", max_seq_len=1024)


def test_input_len_equal_to_seq_len_accepted():
    # builder.py _init_max_seq_len() only clips max_input_len > max_seq_len: equal is a valid engine
    spec = resolve_spec(model="tiny-llama", max_input_len=512, max_seq_len=512)
    assert spec.max_input_len == spec.max_seq_len == 512


def test_input_len_beyond_seq_len_rejected():
    msg = reject(r"max_input_len=600 exceeds max_seq_len=512", model="tiny-llama", max_input_len=600)
    assert "--max-input-len" in msg


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
    assert spec.max_num_tokens == 8 * (5 + 1)  # max_batch_size x (draft_len + 1), llama-1b's draft_len is 5
    assert spec.warnings == ["limits.max_num_tokens=16 raised to 48 (max_batch_size x (draft_len+1))"]


def test_unknown_precision_lists_choices():
    msg = reject(r"quantization.precision='fp9'", model="llama-8b", precision="fp9")
    assert "'int4_awq'" in msg


def test_unknown_gpu():
    reject(r"hardware.gpu='b200'", model="llama-8b", gpu="b200")


# --- draft-target needs KV-cache reuse (upstream aborts the target at load without it) ---------------------------

def test_draft_without_kv_reuse_rejected():
    msg = reject(r"enable_kv_cache_reuse=false with draft llama-1b", model="llama-70b", tp=4, draft="llama-1b",
                 enable_kv_cache_reuse=False)
    assert "KV cache block reuse must be enabled for speculative decoding target model" in msg
    assert "--no-kv-reuse" in msg


def test_draft_with_kv_reuse_and_plain_without_it_accepted():
    assert resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=4).serving.enable_kv_cache_reuse
    plain = resolve_spec(model="llama-70b", tp=4, enable_kv_cache_reuse=False)
    assert not plain.serving.enable_kv_cache_reuse and plain.draft_model is None


def test_draft_without_chunked_context_accepted():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=4, enable_chunked_context=False)
    assert not spec.serving.enable_chunked_context


# --- the draft engine's own TP, batch and GPUs ------------------------------------------------------------------

def test_draft_defaults_tp1_speculation_batch_colocated():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b")
    assert spec.draft_tp == 1 and spec.draft_max_batch_size == 8  # max_batch_for_speculation, not the target's 64
    assert spec.draft_gpu_device_ids == [0] and spec.target_gpu_device_ids == [0, 1, 2, 3]
    assert spec.draft_max_seq_len == 8192 + 5
    assert spec.draft_max_tokens_in_paged_kv_cache == 8 * 8224  # 8197 tokens in whole 32-token blocks
    small = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=2)
    assert small.draft_max_batch_size == 2  # never above the target's batch


def test_participant_ids_orchestrator_first_then_draft_then_target():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", draft_tp=2, max_batch_size=4)
    assert spec.draft_participant_ids == [1, 2] and spec.target_participant_ids == [3, 4, 5, 6]
    assert resolve_spec(model="llama-70b", tp=4).target_participant_ids == [1, 2, 3, 4]


def test_draft_on_its_own_gpus_accepted():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", draft_tp=2, draft_gpu_device_ids=[4, 5],
                        max_batch_size=4)
    assert spec.draft_gpu_device_ids == [4, 5] and "draft_tp=2" in spec.summary()


@pytest.mark.parametrize("kw, match", [
    ({"draft_tp": 3}, r"speculation.draft_tp=3: draft llama-1b has 32 attention heads"),
    ({"draft_tp": 4, "gpu_count": 2, "tp": 2}, r"speculation.draft_tp=4 exceeds hardware.gpu_count=2"),
    ({"draft_gpu_device_ids": [0, 1]}, r"needs exactly 1 GPU id"),
    ({"draft_tp": 2, "draft_gpu_device_ids": [3, 3]}, r"ids must be distinct GPUs within 0..7"),
    ({"draft_gpu_device_ids": [8]}, r"ids must be distinct GPUs within 0..7"),
])
def test_draft_placement_rejected(kw, match):
    args = {"model": "llama-70b", "tp": 4, "draft": "llama-1b", "max_batch_size": 4} | kw
    msg = reject(match, **args)
    assert "--draft-tp" in msg or "GPU" in msg


def test_draft_tp_awq_block_rule():
    # llama-1b intermediate 8192: /16 = 512 fine, hidden 2048 / 32 = 64 is not a multiple of the 128 block
    reject(r"speculation.draft_tp=32: draft int4_awq needs hidden_size/tp divisible", model="llama-70b",
           precision="int4_awq", kv_cache="bf16", draft="llama-1b", draft_tp=32, gpu_count=32, max_batch_size=4)


def test_draft_batch_above_target_batch_warns():
    spec = resolve_spec(model="llama-70b", tp=4, draft="llama-1b", max_batch_size=4, draft_max_batch_size=16)
    assert spec.draft_max_batch_size == 16
    assert any("draft_max_batch_size=16 exceeds max_batch_size=4" in w for w in spec.warnings)


def test_large_max_num_tokens_warns_like_trtllm_build():
    spec = resolve_spec(model="llama-8b", precision="fp8", max_num_tokens=32768)
    assert any("max_num_tokens=32768 > 16384" in w for w in spec.warnings)
    assert not resolve_spec(model="llama-8b", precision="fp8", max_num_tokens=16384).warnings


# --- runtime pytorch (TensorRT-LLM 1.2.1 PyTorch backend) ---------------------------------------------------------


def test_pytorch_runtime_refuses_int8_smoothquant():
    msg = reject(r"precision=int8_sq has no PyTorch-backend kernels", model="llama-8b", precision="int8_sq",
                 kv_cache="bf16", runtime="pytorch")
    assert "--runtime engine" in msg
    resolve_spec(model="llama-8b", precision="int8_sq", kv_cache="bf16")  # the engine runtime builds it


def test_pytorch_runtime_refuses_int8_kv():
    reject(r"kv_cache=int8: the PyTorch backend's KV cache is fp8 or the compute dtype", model="llama-8b",
           precision="bf16", kv_cache="int8", runtime="pytorch", enable_kv_cache_reuse=False,
           enable_chunked_context=False)


def test_w4a8_awq_computes_in_fp16_for_target_and_draft_on_both_runtimes():
    """W4A8-AWQ is built as upstream's recipes (quantize.py --dtype float16 --qformat w4a8_awq): fp16 activations."""
    for runtime in ("engine", "pytorch"):
        no_fmha = {"enable_kv_cache_reuse": False, "enable_chunked_context": False} if runtime == "pytorch" else {}
        spec = resolve_spec(model="llama-8b", precision="w4a8_awq", runtime=runtime, **no_fmha)
        assert spec.quantization.compute_dtype == "fp16" and spec.compute_dtype_of("target") == "fp16"
        assert spec.quantization.kv == "fp8"  # the KV default stays FP8
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", draft_precision="w4a8_awq")
    assert (spec.compute_dtype_of("target"), spec.compute_dtype_of("draft")) == ("bf16", "fp16")
    spec = resolve_spec(model="llama-70b", precision="w4a8_awq", tp=4, draft="llama-1b")
    assert (spec.compute_dtype_of("target"), spec.compute_dtype_of("draft")) == ("fp16", "fp16")
    for precision in ("bf16", "fp8", "int4_awq", "int8_sq"):
        assert resolve_spec(model="llama-8b", precision=precision, kv_cache="fp8" if precision == "fp8" else None,
                            **({} if precision == "fp8" else {"enable_kv_cache_reuse": False,
                                                             "enable_chunked_context": False})
                            ).quantization.compute_dtype == "bf16"


def test_w4a8_awq_unquantized_kv_is_fp16():
    """`_check_kv` compares a 16-bit KV with the compute dtype: fp16 for W4A8-AWQ, for the target and the draft."""
    off = {"enable_kv_cache_reuse": False, "enable_chunked_context": False}
    reject(r"kv_cache=bf16: an unquantized KV cache uses the compute dtype fp16; use --kv-cache fp16", model="llama-8b",
           precision="w4a8_awq", kv_cache="bf16", **off)
    assert resolve_spec(model="llama-8b", precision="w4a8_awq", kv_cache="fp16", **off).quantization.kv == "fp16"
    msg = reject(r"kv_cache=bf16: an unquantized KV cache uses each model's compute dtype, here bf16 for the target "
                 r"\(precision=bf16\) and fp16 for the draft \(precision=w4a8_awq\)", model="llama-70b",
                 precision="bf16", tp=4, draft="llama-1b", draft_precision="w4a8_awq")
    assert "use --kv-cache fp8 or int8" in msg


def test_w4a8_fp8_kv_keeps_paged_context_on_engine_but_not_on_pytorch():
    resolve_spec(model="llama-8b", precision="w4a8_awq", kv_cache="fp8")
    reject(r"w4a8_awq with an FP8 KV cache has no FP8 attention on the PyTorch backend", model="llama-8b",
           precision="w4a8_awq", kv_cache="fp8", runtime="pytorch")
    resolve_spec(model="llama-8b", precision="w4a8_awq", kv_cache="fp8", runtime="pytorch",
                 enable_kv_cache_reuse=False, enable_chunked_context=False)


def test_int4_awq_fp8_kv_needs_features_off_on_both_runtimes():
    for runtime in ("engine", "pytorch"):
        reject(r"int4_awq with an FP8 KV cache", model="llama-8b", precision="int4_awq", kv_cache="fp8",
               runtime=runtime)


def test_pytorch_runtime_refuses_draft_engine_settings():
    reject(r"speculation.draft_tp is an engine-runtime setting", model="tiny-llama", draft="auto", draft_tp=1,
           runtime="pytorch", target="reference")
    spec = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    assert spec.draft_model.name == "tiny-llama-draft"


def test_pytorch_speculation_without_kv_reuse_is_allowed_only_there():
    reject(r"KV cache block reuse must be enabled", model="tiny-llama", draft="auto", enable_kv_cache_reuse=False)
    resolve_spec(model="tiny-llama", draft="auto", enable_kv_cache_reuse=False, runtime="pytorch")


def test_non_h100_warning_is_about_engines_only():
    engine = resolve_spec(model="llama-8b", precision="bf16", gpu="a100")
    pytorch = resolve_spec(model="llama-8b", precision="bf16", gpu="a100", runtime="pytorch")
    assert any("SM 8.0" in w for w in engine.warnings)
    assert not any("SM 8.0" in w for w in pytorch.warnings)
