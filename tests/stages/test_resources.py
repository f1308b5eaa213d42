"""Resource plan: disk per stage and calibration memory from the registry numbers, against published checkpoint
sizes and (slow) what the stages actually write for the tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.gpus import GIB
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from pipeline.stages.resources import (
    ROUNDTRIP_MAX_PARAMS,
    SizeInputs,
    calibration_memory,
    checkpoint_bytes,
    download_bytes,
    plan_resources,
)

# Hub `model.safetensors.index.json` metadata.total_size (bf16 tensors) of the meta-llama Instruct repositories;
# single-file repos: the size of model.safetensors less its header.
PUBLISHED_BF16_BYTES = {
    "llama-70b": 141_107_412_992,  # meta-llama/Llama-3.1-70B-Instruct ("141 GB")
    "llama-8b": 16_060_522_496,  # meta-llama/Llama-3.1-8B-Instruct ("16.1 GB")
    "llama-3b": 6_425_499_648,  # meta-llama/Llama-3.2-3B-Instruct
    "llama-1b": 2_471_628_800,  # meta-llama/Llama-3.2-1B-Instruct
}


def _within(estimate: float, actual: float, tolerance: float = 0.10) -> bool:
    return abs(estimate - actual) <= tolerance * actual


@pytest.mark.parametrize("name", sorted(PUBLISHED_BF16_BYTES))
def test_download_estimate_matches_published_checkpoint_sizes(name):
    entry = get_model(name)
    estimate = download_bytes(entry, tokenizer=9_200_000)
    assert _within(estimate, PUBLISHED_BF16_BYTES[name], 0.01), (name, estimate)


def test_fp8_checkpoint_is_about_half_the_bf16_one_and_tp_barely_changes_it():
    arch = get_model("llama-70b").architecture
    bf16 = checkpoint_bytes(arch, "bf16", tp=1, pp=1)
    fp8 = checkpoint_bytes(arch, "fp8", tp=1, pp=1)
    assert _within(bf16, PUBLISHED_BF16_BYTES["llama-70b"], 0.01)
    assert 0.45 < fp8 / bf16 < 0.55  # linear layers at 1 byte, embeddings and lm_head stay 16-bit
    assert _within(checkpoint_bytes(arch, "fp8", tp=4, pp=2), fp8, 0.01)  # embeddings shard, norms replicate
    awq = checkpoint_bytes(arch, "int4_awq", tp=1, pp=1)
    assert awq < fp8 and _within(awq, bf16 * 0.27, 0.10)


def test_calibration_gpu_memory_terms():
    big = calibration_memory(resolve_spec(model="llama-70b", precision="fp8", tp=4), "target")
    weights = big.params * 2
    assert big.gpu_terms["weights"] == weights and big.gpu_terms["export_copy"] == 0  # exported in place
    big_hf = calibration_memory(resolve_spec(model="llama-70b", precision="fp8", tp=4, runtime="pytorch"), "target")
    assert big_hf.gpu_terms["export_copy"] == weights  # one bf16 copy for the HF exporter to pack
    small_hf = calibration_memory(resolve_spec(model="llama-1b", precision="fp8", runtime="pytorch"), "target")
    assert small_hf.gpu_terms["export_copy"] == small_hf.params * 8  # two float32 copies when the round trip runs
    assert big.gpu_terms["roundtrip_float32"] == 0 and big.params > ROUNDTRIP_MAX_PARAMS
    assert weights < big.gpu_bytes < 1.1 * weights and big_hf.gpu_bytes > 2 * weights
    small = calibration_memory(resolve_spec(model="llama-1b", precision="fp8"), "target")
    assert small.gpu_terms["roundtrip_float32"] == small.params * 2  # the round trip casts the copy to float32
    assert small.cpu_ram_bytes > small.params * 4 * 2  # float32 model and its re-load on CPU


def test_activations_scale_with_calibration_batch_and_sequence():
    one = calibration_memory(resolve_spec(model="llama-8b", calib_seq_len=512), "target").gpu_terms["activations"]
    four = calibration_memory(resolve_spec(model="llama-8b", calib_seq_len=1024, calib_batch_size=2), "target")
    assert four.gpu_terms["activations"] == 4 * one


def test_awq_cpu_time_counts_the_scale_search():
    fp8 = calibration_memory(resolve_spec(model="llama-8b", precision="fp8", calib_size=32), "target")
    awq = calibration_memory(resolve_spec(model="llama-8b", precision="int4_awq", kv_cache="bf16", calib_size=32,
                                          enable_kv_cache_reuse=False, enable_chunked_context=False), "target")
    assert awq.cpu_seconds_per_core > 5 * fp8.cpu_seconds_per_core


def test_present_outputs_need_nothing_and_json_keys():
    spec = resolve_spec(model="llama-8b", precision="fp8", draft="llama-1b", max_batch_size=8)
    full = plan_resources(spec)
    assert {d.role for d in full.disk if d.stage == "download"} == {"target", "draft"}
    part = plan_resources(spec, SizeInputs(present=frozenset({("download", "target"), ("download", "draft")})))
    assert part.stage_bytes("download") == 0 and part.stage_bytes("download", needed=False) > 16 * GIB
    data = full.as_dict()
    assert [d["stage"] for d in data["disk"]] == ["download", "calibrate", "compile", "package", "release"]
    assert set(data["disk"][0]) == {"stage", "volume", "bytes", "needed_bytes", "roles"}
    assert set(data["calibration"][0]) == {"role", "params", "present", "gpu_bytes", "gpu_terms_bytes",
                                           "host_bytes_with_gpu", "cpu_ram_bytes", "cpu_core_hours"}
    reference = plan_resources(resolve_spec(model="llama-8b", target="reference"))
    assert "compile" not in {d.stage for d in reference.disk}


# --- measured: what the stages write for the tiny models -------------------------------------------------------------
def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [dict(precision="fp8"), dict(precision="fp8", tp=2),
                                       dict(precision="int4_awq", kv_cache="bf16")])
def test_tiny_checkpoint_estimate_within_10_percent_of_what_calibrate_writes(tiny_models, overrides):
    from pipeline.stages.host_check import repo_code_bytes
    from tests.support.calibrate_fixtures import calibrated, make_spec

    written = _tree_bytes(calibrated(tiny_models, **overrides).path)
    spec = make_spec(**overrides)
    plan = plan_resources(spec, SizeInputs(repo_code_bytes=repo_code_bytes()))
    assert _within(plan.stage_bytes("calibrate"), written), (plan.stage_bytes("calibrate"), written)


@pytest.mark.slow
def test_tiny_download_and_repository_estimates_within_10_percent(tiny_models, tiny_reference_repo):
    from pipeline.stages.host_check import repo_code_bytes

    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference")
    plan = plan_resources(spec, SizeInputs(repo_code_bytes=repo_code_bytes()))
    roles = {d.role: d.bytes for d in plan.disk if d.stage == "download"}
    assert _within(roles["target"], _tree_bytes(tiny_models["tiny-llama"]))
    assert _within(roles["draft"], _tree_bytes(tiny_models["tiny-llama-draft"]))
    repo = tiny_reference_repo("h17-sizes")
    assert _within(plan.stage_bytes("package"), _tree_bytes(repo)), (plan.stage_bytes("package"), _tree_bytes(repo))


@pytest.mark.slow
def test_tied_embeddings_are_exported_twice(tmp_path):
    """ModelOpt writes lm_head as its own tensor for a tied Llama (Llama 3.2 1B/3B), so the checkpoint holds both."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.core.registry import Architecture

    arch = Architecture(num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=4, head_dim=32,
                        intermediate_size=512, vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=True)
    model = LlamaForCausalLM(LlamaConfig(**arch.hf_config())).eval()
    with torch.inference_mode():
        export_tensorrt_llm_checkpoint(model, "llama", torch.bfloat16, export_dir=tmp_path,
                                       inference_tensor_parallel=1, inference_pipeline_parallel=1)
    written = _tree_bytes(tmp_path)
    assert written > arch.total_params * 2 + arch.vocab_size * arch.hidden_size * 2  # lm_head on top of the tie
    assert _within(checkpoint_bytes(arch, "bf16", tp=1, pp=1), written)


def test_an_eagle3_head_is_downloaded_and_carried_never_calibrated():
    """The head is fetched and carried into the repository as downloaded: no checkpoint, engine or calibration
    memory of its own (a draft model has all three)."""
    from pipeline.core.errors import SpecError

    head = resolve_spec(model="llama-8b", precision="fp8", speculative_decoding="eagle3", draft="auto",
                        runtime="pytorch", max_batch_size=16)
    plain = resolve_spec(model="llama-8b", precision="fp8", runtime="pytorch", max_batch_size=16)
    plan, base = plan_resources(head), plan_resources(plain)
    assert {(d.stage, d.role) for d in plan.disk if d.role == "draft"} == {("download", "draft")}
    assert [c.role for c in plan.calibration] == ["target"]
    carried = next(d.bytes for d in plan.disk if d.role == "draft")
    assert carried > 0
    assert plan.stage_bytes("package", needed=False) == base.stage_bytes("package", needed=False) + carried
    with pytest.raises(SpecError, match="no draft model to calibrate"):
        calibration_memory(head, "draft")
