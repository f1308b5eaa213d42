"""The repositories we generate declare NVIDIA's complete 1.2 `inflight_batcher_llm` contract, model by model:
every input and output (name, type, dims, optional, reshape, ragged), every parameter, the ensemble's data flow and
the draft-target layout. Checked for `--target trtllm` (from 1.2.1-shaped engine dirs) and `--target reference`."""

from __future__ import annotations

import os

import pytest

from pipeline.core.spec import resolve_spec
from pipeline.stages.package import package_repo, validate_repo
from pipeline.stages.package.inputs import PackageInputs
from tests.support import triton_contract_table as table
from tests.support.triton_fixtures import fabricated_checkpoint, fabricated_engine, fake_tokenizer

UPSTREAM = {
    "preprocessing": (table.PREPROCESSING_INPUTS, table.PREPROCESSING_OUTPUTS, table.PREPROCESSING_PARAMETERS),
    "postprocessing": (table.POSTPROCESSING_INPUTS, table.POSTPROCESSING_OUTPUTS, table.POSTPROCESSING_PARAMETERS),
    "tensorrt_llm": (table.TENSORRT_LLM_INPUTS, table.TENSORRT_LLM_OUTPUTS, table.TENSORRT_LLM_PARAMETERS),
    "tensorrt_llm_draft": (table.TENSORRT_LLM_INPUTS, table.TENSORRT_LLM_OUTPUTS, table.TENSORRT_LLM_PARAMETERS),
    "tensorrt_llm_bls": (table.TENSORRT_LLM_BLS_INPUTS, table.TENSORRT_LLM_BLS_OUTPUTS,
                         table.TENSORRT_LLM_BLS_PARAMETERS),
    "ensemble": (table.ENSEMBLE_INPUTS, table.ENSEMBLE_OUTPUTS, table.ENSEMBLE_PARAMETERS),
}
# Parameters only our python models read, beside upstream's (the C++ backend takes these from the engine).
REFERENCE_ONLY = {"reference_dtype", "tokens_per_block", "max_input_len", "max_seq_len"}
OURS_ONLY = {"tensorrt_llm_bls": {"default_num_draft_tokens", "max_batch_for_speculation"},
             "preprocessing": {"max_input_len"}}
# The one deliberate difference: Triton (2.51) checks only the number of inputs of a request, and its ensemble
# scheduler fills only *optional* missing inputs, so an ensemble request without a required input never runs its
# first step (a decoupled ensemble then answers nothing: a hang). Optional here, preprocessing still requires them
# and fails such a request at once, naming the missing input.
DEVIATIONS = {("ensemble", "text_input STRING [1]"): "text_input STRING [1] optional",
              ("ensemble", "max_tokens INT32 [1]"): "max_tokens INT32 [1] optional"}


def _rows(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _row(tensor) -> str:
    from tritonclient.grpc import model_config_pb2

    flags = []
    if getattr(tensor, "optional", False):
        flags.append("optional")
    if tensor.HasField("reshape"):
        flags.append("reshape" + str(list(tensor.reshape.shape)).replace(" ", ""))
    if getattr(tensor, "allow_ragged_batch", False):
        flags.append("ragged")
    dtype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
    return " ".join([tensor.name, dtype, str(list(tensor.dims)).replace(" ", ""), *flags])


@pytest.fixture
def out_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _trtllm_repo(out_env, *, draft: bool, **spec_args):
    base = out_env / "out" / "engines" / "llama-70b-fp8-0123456789ab"
    engine = fabricated_engine(base / "engine", max_batch_size=64, world=4, max_draft_len=5 if draft else 0)
    if draft:
        fabricated_engine(base / "draft_engine", max_batch_size=8, world=1)
    fake_tokenizer(base / "checkpoint" / "tokenizer")
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b" if draft else None,
                        target="trtllm", **spec_args)
    draft_tok = base / "checkpoint" / "tokenizer" if draft else None
    return package_repo(spec, PackageInputs(engine=engine, draft_tokenizer=draft_tok)).path


def _reference_repo(out_env, *, draft: bool, **spec_args):
    engines = out_env / "out" / "engines"
    ckpt = fabricated_checkpoint(engines / "tiny-llama-fp8-cccccccccccc" / "checkpoint")
    draft_ckpt = fabricated_checkpoint(engines / "tiny-llama-draft-fp8-dddddddddddd" / "checkpoint") if draft else None
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto" if draft else None, target="reference",
                        **spec_args)
    return package_repo(spec, PackageInputs(checkpoint=ckpt, draft_checkpoint=draft_ckpt)).path


@pytest.fixture(params=["trtllm", "reference"])
def repo(request, out_env):
    make = _trtllm_repo if request.param == "trtllm" else _reference_repo
    return request.param, validate_repo(make(out_env, draft=True))


@pytest.mark.parametrize("model", sorted(UPSTREAM))
def test_every_tensor_of_the_upstream_model_is_declared_identically(repo, model):
    target, summary = repo
    cfg = summary.models[model]
    ins, outs, _ = UPSTREAM[model]
    ours_in, ours_out = [_row(t) for t in cfg.input], [_row(t) for t in cfg.output]
    assert len(ours_in) == len(set(ours_in)) and len(ours_out) == len(set(ours_out)), f"{model}: duplicate tensor"
    expected_in = [DEVIATIONS.get((model, row), row) for row in _rows(ins)]
    assert sorted(ours_in) == sorted(expected_in), f"{target} {model} inputs differ from upstream"
    assert sorted(ours_out) == sorted(_rows(outs)), f"{target} {model} outputs differ from upstream"


@pytest.mark.parametrize("model", sorted(UPSTREAM))
def test_every_upstream_parameter_is_present_and_nothing_unread_is_added(repo, model):
    target, summary = repo
    ours = set(summary.models[model].parameters)
    upstream = UPSTREAM[model][2]
    assert upstream <= ours, f"{target} {model} lacks {sorted(upstream - ours)}"
    allowed = OURS_ONLY.get(model, set())
    if target == "reference" and model in ("tensorrt_llm", "tensorrt_llm_draft"):
        allowed = allowed | REFERENCE_ONLY
    assert ours - upstream == allowed


def test_text_outputs_are_one_dimensional(repo):
    _, summary = repo
    for model, name in (("ensemble", "text_output"), ("tensorrt_llm_bls", "text_output"),
                        ("postprocessing", "OUTPUT")):
        (tensor,) = [t for t in summary.models[model].output if t.name == name]
        assert list(tensor.dims) == [-1]


def test_cpp_backend_parameters_it_reads_unguarded_are_present(repo):
    """model_instance_state.cc reads these without a fallback: a config without them fails to load."""
    _, summary = repo
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        for key in ("tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path"):
            assert key in summary.models[model].parameters
    assert "multimodal_model_path" in summary.models["preprocessing"].parameters


def test_ensemble_data_flow_matches_upstream(repo):
    _, summary = repo
    cfg = summary.models["ensemble"]
    ens_inputs = {t.name for t in cfg.input}
    ens_outputs = {t.name for t in cfg.output}
    producer, flow, outputs_from = {}, {}, {}
    for step in cfg.ensemble_scheduling.step:
        for key, tensor in step.output_map.items():
            producer[tensor] = f"{step.model_name}.{key}"
            if tensor in ens_outputs:
                outputs_from[tensor] = f"{step.model_name}.{key}"
    for step in cfg.ensemble_scheduling.step:
        flow[step.model_name] = {k: v if v in ens_inputs else producer[v] for k, v in step.input_map.items()}
    assert flow == table.ENSEMBLE_FLOW
    assert outputs_from == table.ENSEMBLE_OUTPUTS_FROM


def test_trtllm_repo_from_121_engine_dirs_points_at_them(out_env):
    summary = validate_repo(repo := _trtllm_repo(out_env, draft=True))
    engines = out_env / "out" / "engines" / "llama-70b-fp8-0123456789ab"
    for model, engine in (("tensorrt_llm", "engine"), ("tensorrt_llm_draft", "draft_engine")):
        assert summary.models[model].backend == "tensorrtllm"
        path = summary.param(model, "gpt_model_path")
        assert not os.path.isabs(path) and (repo / model / path).resolve() == (engines / engine).resolve()
        assert summary.param(model, "gpt_model_type") == "inflight_fused_batching"
    assert summary.models["tensorrt_llm_draft"].max_batch_size == 8  # the draft engine's own limit


@pytest.mark.parametrize("make", [_trtllm_repo, _reference_repo], ids=["trtllm", "reference"])
def test_layout_upstream_draft_target_recipe_by_default_streaming_without_draft(out_env, make):
    spec_layout = validate_repo(make(out_env, draft=True))
    for model in ("tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"):
        assert not spec_layout.decoupled(model), f"{model} must be unary for upstream's draft-target clients"
    plain = validate_repo(make(out_env / "plain", draft=False))
    assert plain.decoupled("tensorrt_llm") and "tensorrt_llm_bls" not in plain.models


def test_spec_can_keep_a_streaming_target_beside_the_draft(out_env):
    summary = validate_repo(_reference_repo(out_env, draft=True, decoupled=True))
    assert summary.decoupled("tensorrt_llm")
    assert not summary.decoupled("tensorrt_llm_draft") and not summary.decoupled("tensorrt_llm_bls")


def test_reference_parameters_carry_the_build_limits(out_env):
    summary = validate_repo(_reference_repo(out_env, draft=True))
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference")
    assert summary.param("tensorrt_llm", "max_input_len") == str(spec.max_input_len)
    assert summary.param("tensorrt_llm", "max_seq_len") == str(spec.max_seq_len)
    assert summary.param("tensorrt_llm_draft", "max_seq_len") == str(spec.max_seq_len + spec.draft_len)
    assert summary.param("tensorrt_llm", "tokens_per_block") == str(spec.limits.tokens_per_block)


def test_draft_gets_its_own_devices_and_kv_budget_in_orchestrator_mode(out_env):
    summary = validate_repo(_trtllm_repo(out_env, draft=True))
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", target="trtllm")
    assert summary.param("tensorrt_llm", "gpu_device_ids") == "0,1,2,3"
    assert summary.param("tensorrt_llm_draft", "gpu_device_ids") == "0"  # draft TP 1, beside target rank 0
    assert summary.param("tensorrt_llm_draft", "max_tokens_in_paged_kv_cache") == \
        str(spec.draft_max_tokens_in_paged_kv_cache)
    assert summary.param("tensorrt_llm", "participant_ids") == ""  # the orchestrator spawns the workers
    plain = validate_repo(_trtllm_repo(out_env / "plain", draft=False))
    assert plain.param("tensorrt_llm", "gpu_device_ids") == ""  # leader mode: one rank per GPU under mpirun
