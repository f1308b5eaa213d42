"""Compile plans (exact trtllm-build argv per engine), derived values, the 1.2.1 flag set, rejections.

The whole-plan golden files (`compile --dry-run --json`) are in tests/stages/compile/test_golden.py.

Checkpoint configs are FABRICATED by the tests (tests/support/compile_fixtures.py): the planner reads config.json only.
"""

from __future__ import annotations

import pytest

from pipeline.core.errors import CompileError, SpecError
from pipeline.core.spec import resolve_spec
from pipeline.stages.compile import plan_compile
from pipeline.stages.compile.engine_plan import CHECKPOINT_PLACEHOLDER as CKPT
from pipeline.stages.compile.engine_plan import OUTPUT_PLACEHOLDER as OUT
from pipeline.stages.compile.flags import ACCEPTED, ENABLE_DISABLE_FLAGS, check_argv
from tests.support.compile_fixtures import write_fabricated_checkpoint


@pytest.fixture(autouse=True)
def _tree(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))


def _plan(tmp_path, spec, *, tp=1, pp=1, draft_tp=None, vocab=128256, draft_vocab=None):
    q = spec.quantization
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-target-ckpt", precision=q.precision, kv_cache=q.kv,
                                       tp=tp, pp=pp, vocab_size=vocab)
    draft_ckpt = None
    if spec.draft_model:
        draft_ckpt = write_fabricated_checkpoint(
            tmp_path / "fabricated-draft-ckpt", precision=spec.draft_precision, kv_cache=q.kv,
            tp=draft_tp or spec.draft_tp, pp=1, vocab_size=draft_vocab or vocab)
    return plan_compile(spec, checkpoint_dir=ckpt, output_dir=tmp_path / "b" / "engine", draft_checkpoint_dir=draft_ckpt)


def _common(batch, inp, seq, tokens, gemm, paged, fp8, workers, *, draft_len=None, reduce_fusion="disable",
            user_buffer="disable", swiglu="disable", low_latency="disable", dtype="bfloat16"):
    o = {
        "--checkpoint_dir": CKPT, "--output_dir": OUT, "--max_batch_size": str(batch), "--max_input_len": str(inp),
        "--max_seq_len": str(seq), "--max_num_tokens": str(tokens), "--max_beam_width": "1",
        "--kv_cache_type": "paged", "--tokens_per_block": "32", "--gemm_plugin": gemm,
        "--gpt_attention_plugin": dtype, "--context_fmha": "enable", "--use_paged_context_fmha": paged,
        "--use_fp8_context_fmha": fp8, "--remove_input_padding": "enable", "--multiple_profiles": "enable",
        "--use_fused_mlp": "enable", "--gemm_swiglu_plugin": swiglu, "--low_latency_gemm_plugin": low_latency,
        "--low_latency_gemm_swiglu_plugin": low_latency, "--reduce_fusion": reduce_fusion,
        "--user_buffer": user_buffer, "--workers": str(workers), "--output_timing_cache": f"{OUT}/timing.cache",
    }
    if draft_len:
        o["--speculative_decoding_mode"] = "draft_tokens_external"
        o["--max_draft_len"] = str(draft_len)
    else:
        o["--max_draft_len"] = "0"
    return o


def test_llama70b_fp8_tp4_argv(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", kv_cache="fp8", tp=4)
    plan = _plan(tmp_path, spec, tp=4)
    assert plan.draft is None
    t = plan.target
    # FP8 at batch 64: GEMM plugin off; Llama TP 4: reduce fusion + user buffers; 70B FP8 on Hopper: GEMM+SwiGLU
    assert t.options == _common(64, 4096, 8192, 8192, "disable", "enable", "enable", 4, reduce_fusion="enable",
                                user_buffer="enable", swiglu="fp8")
    pc = t.expected_build_config["plugin_config"]
    assert pc["gemm_plugin"] is None and pc["reduce_fusion"] is True and pc["user_buffer"] is True
    assert pc["gemm_swiglu_plugin"] == "fp8" and pc["low_latency_gemm_plugin"] is None
    assert t.rank_files == ["rank0.engine", "rank1.engine", "rank2.engine", "rank3.engine"]
    assert t.world_size == 4 and t.expected_build_config["max_seq_len"] == 8192
    assert pc["use_fp8_context_fmha"] is True
    assert t.argv[:3] == ["trtllm-build", "--checkpoint_dir", str(tmp_path / "fabricated-target-ckpt")]
    assert t.argv[t.argv.index("--output_timing_cache") + 1] == str(tmp_path / "b" / "engine" / "timing.cache")
    assert plan.memory["weights_gib_per_gpu"] == pytest.approx(67.7 / 4, rel=0.03)


def test_llama70b_int4_awq_tp2_argv(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="int4_awq", kv_cache="bf16", tp=2)
    t = _plan(tmp_path, spec, tp=2).target
    # INT4-AWQ GEMMs use the weight-only groupwise plugin automatically; --gemm_plugin covers the 16-bit lm_head.
    # Reduce fusion is kept by build() for Llama at TP > 1 whatever the quantization; user buffers are FP8-only.
    assert t.options == _common(64, 4096, 8192, 8192, "bfloat16", "enable", "disable", 2, reduce_fusion="enable")
    assert t.rank_files == ["rank0.engine", "rank1.engine"]


def test_llama8b_fp8_with_llama1b_draft_k5_small_batch(tmp_path):
    spec = resolve_spec(model="llama-8b", precision="fp8", draft="llama-1b", draft_len=5, max_batch_size=4)
    plan = _plan(tmp_path, spec)
    # batch <= 4: low-latency FP8 GEMM + SwiGLU plugins, GEMM plugin off (fp8-quantization.md)
    assert plan.target.options == _common(4, 4096, 8192, 8192, "disable", "enable", "enable", 1, draft_len=5,
                                          low_latency="fp8")
    # target: --max_seq_len S, build() adds K -> engine S+K; draft: given S+K explicitly (no speculative mode).
    assert plan.target.expected_build_config["max_seq_len"] == 8197
    assert plan.target.expected_build_config["speculative_decoding_mode"] == 2  # IntFlag DRAFT_TOKENS_EXTERNAL
    assert plan.draft.options == _common(4, 4096, 8197, 8192, "disable", "enable", "enable", 1, low_latency="fp8")
    assert plan.draft.expected_build_config["max_seq_len"] == 8197
    assert plan.draft.expected_build_config["max_draft_len"] == 0
    assert plan.draft.output_dir == str(tmp_path / "b" / "draft_engine")
    assert [p.role for p in plan.engines] == ["draft", "target"]


def test_draft_engine_has_its_own_tp_batch_and_workers(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b")  # target batch 64
    plan = _plan(tmp_path, spec, tp=4)
    d, t = plan.draft, plan.target
    assert (t.tp, t.options["--workers"], t.options["--max_batch_size"]) == (4, "4", "64")
    # the draft: TP 1 (no all-reduce per draft token), one worker, batch = the speculation cap 8, one rank file
    assert (d.tp, d.world_size, d.options["--workers"], d.options["--max_batch_size"]) == (1, 1, "1", "8")
    assert d.rank_files == ["rank0.engine"]
    assert d.options["--reduce_fusion"] == "disable" and d.options["--user_buffer"] == "disable"
    assert d.options["--max_num_tokens"] == "8192"  # min(8192, 8 x 8197)
    assert d.expected_build_config["max_batch_size"] == 8
    # orchestrator mode spawns the target's ranks: reduce fusion stays, user buffers do not (trtllm_rules.user_buffer)
    assert t.options["--reduce_fusion"] == "enable" and t.options["--user_buffer"] == "disable"
    assert t.expected_build_config["plugin_config"]["user_buffer"] is False


def test_draft_tp2_and_batch_from_the_spec(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", draft_tp=2,
                        draft_max_batch_size=2, max_batch_size=8)
    d = _plan(tmp_path, spec, tp=4).draft
    assert (d.tp, d.options["--workers"], d.options["--max_batch_size"]) == (2, "2", "2")
    # the draft at TP 2 is a Llama at TP > 1: build() keeps reduce fusion; its ranks are spawned: no user buffers
    assert d.options["--reduce_fusion"] == "enable" and d.options["--user_buffer"] == "disable"
    # batch 2 <= 4: the low-latency FP8 GEMM plugins
    assert d.options["--low_latency_gemm_plugin"] == "fp8"
    assert d.rank_files == ["rank0.engine", "rank1.engine"]


def test_draft_checkpoint_at_the_targets_tp_is_refused(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", max_batch_size=8)
    with pytest.raises(CompileError, match=r"draft checkpoint .* mapped tp=4 .* re-export with --draft-tp 1"):
        _plan(tmp_path, spec, tp=4, draft_tp=4)


def test_dry_run_derives_the_draft_checkpoint_at_draft_tp(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", max_batch_size=8)
    plan = plan_compile(spec, checkpoint_dir=tmp_path / "nope", output_dir=tmp_path / "e",
                        draft_checkpoint_dir=tmp_path / "nope-draft", allow_derived=True)
    assert plan.draft.checkpoint_derived and plan.draft.world_size == 1 and plan.target.world_size == 4


def test_tiny_llama_fp8_with_tiny_draft(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft")
    plan = _plan(tmp_path, spec, vocab=1024)
    # max_num_tokens 8192 is clipped to max_seq_len * max_batch_size as check_max_num_tokens() would.
    assert plan.target.options == _common(8, 256, 512, 4096, "disable", "enable", "enable", 1, draft_len=4)
    assert plan.draft.options == _common(8, 256, 516, 4128, "disable", "enable", "enable", 1)
    assert plan.target.expected_build_config["max_seq_len"] == 516
    text = plan.format()
    assert text.count("trtllm-build --checkpoint_dir") == 2 and "estimated GPU memory" in text


@pytest.mark.parametrize("kw, reduce_fusion, user_buffer", [
    ({"precision": "fp8", "tp": 1}, "disable", "disable"),  # build() drops reduce_fusion at tp_size == 1
    ({"precision": "fp8", "tp": 2}, "enable", "enable"),
    ({"precision": "fp8", "tp": 1, "pp": 2}, "disable", "disable"),  # PP alone has no TP all-reduce
    ({"precision": "w4a8_awq", "tp": 4}, "enable", "disable"),  # user buffers: FP8 Llama only (plugin.py)
    ({"precision": "int8_sq", "kv_cache": "bf16", "tp": 2}, "enable", "disable"),
    ({"precision": "bf16", "tp": 8}, "enable", "disable"),
])
def test_reduce_fusion_and_user_buffer_exactly_where_build_keeps_them(tmp_path, kw, reduce_fusion, user_buffer):
    spec = resolve_spec(model="llama-70b", **kw)
    t = _plan(tmp_path, spec, tp=spec.parallelism.tp, pp=spec.parallelism.pp).target
    assert (t.options["--reduce_fusion"], t.options["--user_buffer"]) == (reduce_fusion, user_buffer)
    pc = t.expected_build_config["plugin_config"]
    assert (pc["reduce_fusion"], pc["user_buffer"]) == (reduce_fusion == "enable", user_buffer == "enable")


def test_reduce_fusion_follows_the_checkpoint_architecture(tmp_path):
    import json

    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-ckpt", precision="fp8", kv_cache="fp8", tp=4)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architecture"] = "MistralForCausalLM"  # build() overrides reduce_fusion to False for it
    (ckpt / "config.json").write_text(json.dumps(cfg))
    t = plan_compile(spec, checkpoint_dir=ckpt, output_dir=tmp_path / "e").target
    assert t.options["--reduce_fusion"] == "disable" and t.options["--user_buffer"] == "disable"


@pytest.mark.parametrize("kw, swiglu, low_latency", [
    ({"model": "llama-70b", "tp": 4}, "fp8", "disable"),  # large FP8 model, batch 64
    ({"model": "llama-70b", "tp": 4, "max_batch_size": 4}, "disable", "fp8"),  # small batch: low latency
    ({"model": "llama-70b", "tp": 4, "max_batch_size": 5}, "fp8", "disable"),
    ({"model": "llama-8b"}, "disable", "disable"),  # 8B at batch 128: the default fused-MLP path
    ({"model": "llama-8b", "max_batch_size": 1}, "disable", "fp8"),
    ({"model": "llama-70b", "tp": 4, "gpu": "l40s", "gpu_count": 8}, "disable", "disable"),  # SwiGLU: Hopper only
    ({"model": "llama-70b", "precision": "w4a8_awq", "tp": 4, "max_batch_size": 2}, "disable", "disable"),
])
def test_fp8_gemm_plugin_decisions(tmp_path, kw, swiglu, low_latency):
    spec = resolve_spec(**({"precision": "fp8"} | kw))
    t = _plan(tmp_path, spec, tp=spec.parallelism.tp).target
    assert t.options["--gemm_swiglu_plugin"] == swiglu
    assert t.options["--low_latency_gemm_plugin"] == t.options["--low_latency_gemm_swiglu_plugin"] == low_latency
    assert t.options["--use_fused_mlp"] == "enable"  # the SwiGLU plugins need it (optimize_model_with_config)
    if spec.quantization.precision == "fp8":
        assert t.options["--gemm_plugin"] == "disable"  # at every batch size (fp8-quantization.md)


def test_int4_with_fp8_kv_plans_paged_context_fmha_off(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="int4_awq", kv_cache="fp8", enable_kv_cache_reuse=False,
                        enable_chunked_context=False)
    t = _plan(tmp_path, spec).target
    assert t.options["--use_paged_context_fmha"] == "disable" and t.options["--use_fp8_context_fmha"] == "disable"


def test_fp8_with_bf16_kv_plans_fp8_context_fmha_off(tmp_path):
    t = _plan(tmp_path, resolve_spec(model="llama-8b", precision="fp8", kv_cache="bf16")).target
    assert t.options["--use_paged_context_fmha"] == "enable" and t.options["--use_fp8_context_fmha"] == "disable"


def test_fp16_recipe_uses_float16_plugins(tmp_path):
    spec = resolve_spec(model="llama-8b", precision="fp16", multiple_profiles=False)
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-ckpt", precision="fp16", kv_cache="fp16",
                                       dtype="float16")
    t = plan_compile(spec, checkpoint_dir=ckpt, output_dir=tmp_path / "e").target
    assert t.options["--gemm_plugin"] == "float16" and t.options["--gpt_attention_plugin"] == "float16"
    # without multiple profiles the plan passes opt_num_tokens explicitly (build() would default it)
    assert t.options["--multiple_profiles"] == "disable" and t.options["--opt_num_tokens"] == "128"


def test_w4a8_awq_builds_with_float16_activations_as_upstream(tmp_path):
    """Upstream's W4A8-AWQ recipes: quantize.py --dtype float16, then --gemm_plugin float16/auto."""
    spec = resolve_spec(model="llama-70b", precision="w4a8_awq", tp=4)
    t = _plan(tmp_path, spec, tp=4).target
    assert t.options["--gemm_plugin"] == "float16" and t.options["--gpt_attention_plugin"] == "float16"
    assert t.expected_build_config["plugin_config"]["gemm_plugin"] == "float16"
    assert t.options["--use_fp8_context_fmha"] == "enable"  # the KV stays FP8
    # the dry run's derived checkpoint states what calibrate exports: dtype float16
    d = plan_compile(spec, checkpoint_dir=tmp_path / "none", output_dir=tmp_path / "d", allow_derived=True).target
    assert d.options["--gemm_plugin"] == "float16" and d.options["--gpt_attention_plugin"] == "float16"
    # a draft in W4A8-AWQ is built in float16 while an FP8 target stays bfloat16
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", draft_precision="w4a8_awq")
    p = _plan(tmp_path / "pair", spec, tp=4)
    assert p.target.options["--gpt_attention_plugin"] == "bfloat16"
    assert (p.draft.options["--gemm_plugin"], p.draft.options["--gpt_attention_plugin"]) == ("float16", "float16")


def test_checkpoint_in_another_compute_dtype_is_refused(tmp_path):
    """A W4A8-AWQ checkpoint exported in bfloat16 would build bf16 activations upstream never ships: refused."""
    spec = resolve_spec(model="llama-70b", precision="w4a8_awq", tp=4)
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-ckpt", precision="w4a8_awq", kv_cache="fp8", tp=4,
                                       dtype="bfloat16")
    with pytest.raises(CompileError, match=r"has dtype=bfloat16, but w4a8_awq computes in float16; re-run `invoke "
                                           r"calibrate`"):
        plan_compile(spec, checkpoint_dir=ckpt, output_dir=tmp_path / "e")


def test_speculative_floor_raises_only_the_targets_max_num_tokens(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft", max_num_tokens=16)
    plan = _plan(tmp_path, spec, vocab=1024)
    assert plan.target.options["--max_num_tokens"] == str(8 * (4 + 1))  # max_batch_size x (K+1)
    # the draft is not speculative: only check_max_num_tokens()' floor of one KV block applies
    assert plan.draft.options["--max_num_tokens"] == "32"


def test_max_num_tokens_at_least_tokens_per_block(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", max_num_tokens=16)
    assert _plan(tmp_path, spec, vocab=1024).target.options["--max_num_tokens"] == "32"  # check_max_num_tokens()


def test_max_input_len_equal_to_max_seq_len_plans(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", max_input_len=512, max_seq_len=512)
    t = _plan(tmp_path, spec, vocab=1024).target
    assert t.options["--max_input_len"] == t.options["--max_seq_len"] == "512"


def test_other_recipes_argv_use_only_accepted_flags(tmp_path):
    """Recipes beyond the goldens (tests/stages/compile/test_golden.py walks those): FP8 KV without paged context FMHA,
    FP16 with one profile (--opt_num_tokens), a TP 2 draft at small batch."""
    specs = [
        resolve_spec(model="llama-70b", precision="int4_awq", kv_cache="fp8", enable_kv_cache_reuse=False,
                     enable_chunked_context=False),
        resolve_spec(model="llama-8b", precision="fp16", multiple_profiles=False),
        resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", draft_tp=2, max_batch_size=2),
    ]
    for i, spec in enumerate(specs):
        plan = _plan(tmp_path / str(i), spec, tp=spec.parallelism.tp)
        for p in plan.engines:
            check_argv(p.argv)
            flags = [a for a in p.argv if a.startswith("--")]
            assert set(flags) <= set(ACCEPTED) and len(flags) == len(set(flags))
            for flag in set(flags) & ENABLE_DISABLE_FLAGS:
                assert p.argv[p.argv.index(flag) + 1] in ("enable", "disable")


def test_workers_capped_by_gpu_count(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, gpu_count=4)
    assert _plan(tmp_path, spec, tp=4).target.options["--workers"] == "4"


# --- the flag-set checker ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, match", [
    (["trtllm-build", "--max_output_len", "256"], "has no option '--max_output_len'"),
    (["trtllm-build", "--use_custom_all_reduce", "enable"], "has no option"),
    (["trtllm-build", "--auto_parallel", "2"], "has no option"),
    (["trtllm-build", "--use_paged_context_fmha", "true"], "not one of enable, disable"),
    (["trtllm-build", "--gemm_plugin", "int4"], "not one of auto"),
    (["trtllm-build", "--kv_cache_type", "blocked"], "not one of continuous, paged, disabled"),
    (["trtllm-build", "--speculative_decoding_mode", "draft_target"], "not one of draft_tokens_external"),
    (["trtllm-build", "--max_batch_size", "eight"], "needs an integer"),
    (["trtllm-build", "--workers"], "needs a value"),
    (["trtllm-build", "--workers", "1", "--workers", "2"], "given twice"),
    (["python", "--workers", "1"], "must start with trtllm-build"),
])
def test_check_argv_rejects(argv, match):
    with pytest.raises(CompileError, match=match):
        check_argv(argv)


def test_check_argv_accepts_aliases_and_store_true():
    check_argv(["trtllm-build", "--max_decoder_seq_len", "4", "--strip_plan", "--lora_dir", "a", "b",
                "--log_level", "info", "--reduce_fusion", "enable", "--use_fused_mlp", "disable"])


# --- checkpoint problems ---------------------------------------------------------------------------------------

def test_missing_checkpoint_config_names_calibrate(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8")
    with pytest.raises(CompileError, match=r"does not exist; run `invoke calibrate`"):
        plan_compile(spec, checkpoint_dir=tmp_path / "nope", output_dir=tmp_path / "e")


def test_dry_run_plans_from_spec_without_checkpoint(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    plan = plan_compile(spec, checkpoint_dir=tmp_path / "nope", output_dir=tmp_path / "e", allow_derived=True)
    assert plan.target.checkpoint_derived and plan.target.world_size == 4
    assert "not exported yet" in plan.format()


@pytest.mark.parametrize("kw, match", [
    ({"tp": 2}, r"mapped tp=2 pp=1 .* re-export with --tp 1"),
    ({"precision": "int4_awq"}, r"quant_algo=W4A16_AWQ, but the spec asks for fp8"),
    ({"kv_cache": "bf16"}, r"kv_cache_quant_algo=None, but the spec asks for kv_cache=fp8"),
    ({"vocab_size": 32000}, r"vocab_size=32000, but tiny-llama has 1024"),
])
def test_checkpoint_not_matching_spec_rejected(tmp_path, kw, match):
    args = {"precision": "fp8", "kv_cache": "fp8", "vocab_size": 1024} | kw
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-ckpt", **args)
    with pytest.raises(CompileError, match=match):
        plan_compile(resolve_spec(model="tiny-llama", precision="fp8"), checkpoint_dir=ckpt, output_dir=tmp_path / "e")


def test_draft_needs_draft_checkpoint(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft")
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-ckpt", precision="fp8", kv_cache="fp8", vocab_size=1024)
    with pytest.raises(CompileError, match="no draft checkpoint was given"):
        plan_compile(spec, checkpoint_dir=ckpt, output_dir=tmp_path / "e")


def test_reference_target_has_no_engines(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(CompileError, match="has no TensorRT-LLM engines"):
        plan_compile(spec, checkpoint_dir=tmp_path, output_dir=tmp_path / "e")


# --- every combination that trtllm-build 1.2.1 cannot honour is rejected by resolve_spec ---------------

REJECTED = [
    ({"model": "llama-8b", "precision": "fp8", "gpu": "a100"}, r"SM 8.0 has no FP8"),
    ({"model": "llama-8b", "precision": "bf16", "kv_cache": "fp8", "gpu": "a100"}, r"SM 8.0 has no FP8"),
    ({"model": "llama-70b", "precision": "int4_awq", "kv_cache": "fp8"}, r"disables FP8 and so paged context FMHA"),
    ({"model": "llama-70b", "precision": "int8_sq", "kv_cache": "fp8"}, r"disables FP8 and so paged context FMHA"),
    ({"model": "llama-70b", "precision": "int4_awq", "kv_cache": "fp8", "draft": "llama-1b", "enable_kv_cache_reuse": False,
          "enable_chunked_context": False}, r"need\(s\) it.*|draft-target speculation"),
    ({"model": "llama-8b", "precision": "int8_sq", "kv_cache": "int8"}, r"INT8 KV cache disables paged context FMHA"),
    ({"model": "llama-8b", "precision": "fp8", "context_fmha": False}, r"context_fmha is disabled"),
    ({"model": "llama-8b", "precision": "fp8", "opt_num_tokens": 256}, r"cannot be combined with multiple_profiles"),
    ({"model": "tiny-llama", "precision": "fp8", "draft": "llama-1b"}, r"must share one tokenizer"),
    ({"model": "llama-70b", "precision": "fp8", "tp": 8, "pp": 2}, r"tp×pp=16 exceeds hardware.gpu_count=8"),
    ({"model": "tiny-llama", "precision": "fp8", "draft": "tiny-llama-draft", "max_seq_len": 1024},
     r"max_seq_len=1024 \+ draft_len 4 exceeds"),
    ({"model": "llama-8b", "precision": "fp8", "draft": "llama-1b", "draft_len": 0}, r"draft_len=0: must be >= 1"),
    ({"model": "llama-8b", "precision": "fp8", "draft": "llama-1b", "enable_kv_cache_reuse": False},
     r"KV cache block reuse must be enabled for speculative decoding target model"),
    ({"model": "llama-70b", "precision": "fp8", "tp": 1, "max_batch_size": 65536}, r"at most \d+ fits"),
    ({"model": "llama-8b", "precision": "fp8", "draft": "llama-1b", "max_beam_width": 2}, r"needs 1"),
]


@pytest.mark.parametrize("kw, match", REJECTED, ids=[m for _, m in REJECTED])
def test_unbuildable_combinations_rejected(kw, match):
    from pipeline.stages.check import resolve_checked_spec

    with pytest.raises(SpecError, match=match) as info:
        resolve_checked_spec(**kw)
    assert "\n" not in str(info.value)


def test_mixtral_dry_run_derives_moe_checkpoint_and_plugin(tmp_path):
    """A MoE checkpoint (derived as ModelOpt 0.37 exports it: LLaMAConfig's `moe`, experts TP-sharded) builds with
    the MixtureOfExperts plugin; dense models never get the flag."""
    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=2)
    plan = plan_compile(spec, checkpoint_dir=tmp_path / "none", output_dir=tmp_path / "e", allow_derived=True)
    argv = plan.target.argv
    assert argv[argv.index("--moe_plugin") + 1] == "bfloat16"
    check_argv(argv)
    from pipeline.stages.compile.checkpoint_config import derived_checkpoint_config

    cfg = derived_checkpoint_config(tmp_path, spec.model, precision="fp8", kv_cache="fp8", compute_dtype="bf16",
                                    tp=2, pp=1).config
    assert cfg["architecture"] == "MixtralForCausalLM" and cfg["moe"]["num_experts"] == 8
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1, "moe_tp_size": 2, "moe_ep_size": 1}
    dense = plan_compile(resolve_spec(model="llama-8b", precision="fp8"), checkpoint_dir=tmp_path / "none2",
                         output_dir=tmp_path / "e2", allow_derived=True)
    assert "--moe_plugin" not in dense.target.argv
