"""Model families (pipeline/core/architectures.py): one test group per upstream source file each fact was read from.

The upstream excerpts below were read at the stored versions named in `architectures.SOURCES` (NVIDIA/TensorRT-LLM
has no tagged 1.2.1 copy in the code index); ModelOpt's facts are checked against the installed 0.37 package.
"""

from __future__ import annotations

import inspect
import json

import pytest

from pipeline.core.architectures import (
    FAMILIES,
    SOURCES,
    UnsupportedArchitecture,
    architecture_fields,
    checkpoint_fields,
    support_blocker,
)
from pipeline.core.errors import SpecError
from pipeline.core.registry import Architecture, get_model, load_registry
from pipeline.core.spec import resolve_spec


def reject(match: str, **kw) -> str:
    with pytest.raises(SpecError, match=match) as info:
        resolve_spec(**kw)
    assert "\n" not in str(info.value)
    return str(info.value)


# --- tensorrt_llm/models/__init__.py: MODEL_MAP (checkpoint `architecture` -> model class) -------------------------
MODEL_MAP_EXCERPT = {
    "LlamaForCausalLM": "LLaMAForCausalLM", "MistralForCausalLM": "LLaMAForCausalLM",
    "MixtralForCausalLM": "LLaMAForCausalLM", "Qwen2ForCausalLM": "QWenForCausalLM",
    "Qwen3ForCausalLM": "QWenForCausalLM",
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_model_map_class_per_family(name):
    fam = FAMILIES[name]
    assert MODEL_MAP_EXCERPT[fam.hf_architecture] == fam.trtllm_class
    assert "models/__init__.py" in SOURCES["model_map"]


# --- tensorrt_llm/models/qwen/config.py: QWenConfig (qwen_type = HF model_type; attn_bias False for qwen3) --------
def test_qwen_config_fields():
    q2 = get_model("qwen2.5-7b").architecture
    q3 = get_model("qwen3-8b").architecture
    assert checkpoint_fields(q2) == {"architecture": "Qwen2ForCausalLM", "qwen_type": "qwen2", "attn_bias": True}
    assert checkpoint_fields(q3) == {"architecture": "Qwen3ForCausalLM", "qwen_type": "qwen3", "attn_bias": False}
    assert FAMILIES["qwen3"].qk_norm and not FAMILIES["qwen2"].qk_norm
    # the q/k/v biases (Qwen2) and per-head q/k norms (Qwen3) are counted as 16-bit parameters
    plain = q2.model_copy(update={"family": "llama"})
    assert q2.norm_params - plain.norm_params == 28 * (28 + 2 * 4) * 128


# --- tensorrt_llm/models/llama/config.py: LLaMAConfig (Mixtral: moe from num_local_experts, RENORMALIZE, swiglu) --
def test_mixtral_checkpoint_fields():
    a = get_model("mixtral-8x7b").architecture
    assert checkpoint_fields(a) == {"architecture": "MixtralForCausalLM", "hidden_act": "swiglu",
                                    "moe": {"num_experts": 8, "top_k": 2, "normalization_mode": 1}}
    assert checkpoint_fields(get_model("mistral-7b").architecture) == {"architecture": "MistralForCausalLM"}
    assert checkpoint_fields(get_model("llama-8b").architecture) == {"architecture": "LlamaForCausalLM"}


# --- tensorrt_llm/layers/moe.py: MoeConfig.validate (both or neither of num_experts / top_k) -----------------------
def test_moe_config_both_or_neither():
    base = get_model("mixtral-8x7b").architecture.model_dump()
    with pytest.raises(ValueError, match="both or neither"):
        Architecture(**{**base, "experts_per_token": 0})
    with pytest.raises(ValueError, match="takes no num_experts"):
        Architecture(**{**get_model("llama-8b").architecture.model_dump(), "num_experts": 8, "experts_per_token": 2})
    with pytest.raises(ValueError, match="exceeds num_experts"):
        Architecture(**{**base, "experts_per_token": 9})


def test_moe_params_total_vs_active():
    """Mixtral-8x7B: 46.7 B parameters, 12.9 B active per token (top-2 of 8 experts)."""
    a = get_model("mixtral-8x7b").architecture
    assert round(a.total_params / 1e9, 1) == 46.7
    assert round(a.active_params / 1e9, 1) == 12.9
    assert a.router_params == 32 * 4096 * 8
    # a step of one token reads 2 of 8 experts per layer; a large batch reads all of them
    assert a.expert_linear_params_touched(1) == pytest.approx(a.active_linear_params)
    assert a.expert_linear_params_touched(10_000) == pytest.approx(a.linear_params)
    dense = get_model("llama-8b").architecture
    assert dense.active_params == dense.total_params


# --- tensorrt_llm/mapping.py: moe_tp_size x moe_ep_size == tp_size; layers/moe.py: experts % moe_ep_size ---------
def test_moe_ep_divides_tp():
    reject(r"moe_tp x moe_ep must equal tp=2", model="mixtral-8x7b", precision="fp8", tp=2, moe_ep=4,
           runtime="pytorch", gpu_count=8)


def test_moe_ep_divides_experts():
    arch = get_model("mixtral-8x7b").architecture.model_copy(update={"num_experts": 6})
    entry = get_model("mixtral-8x7b").model_copy(update={"architecture": arch})
    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=4, runtime="pytorch", validate=False)
    spec = spec.model_copy(update={"model": entry})
    spec.parallelism.moe_ep = 4
    from pipeline.core.spec_rules import validate_spec

    with pytest.raises(SpecError, match="6 experts are not a multiple of the EP size"):
        validate_spec(spec)


def test_moe_ep_on_the_pytorch_backend_only():
    msg = reject(r"parallelism.moe_ep=2: engine checkpoints are exported with experts TP-sharded",
                 model="mixtral-8x7b", precision="fp8", tp=2, moe_ep=2)
    assert "tensorrt_llm_utils.py" in msg
    spec = resolve_spec(model="mixtral-8x7b", precision="fp8", tp=2, moe_ep=2, runtime="pytorch")
    assert (spec.parallelism.moe_tp_size, spec.parallelism.moe_ep_size) == (1, 2)


def test_moe_ep_refused_for_a_dense_model():
    reject(r"not a mixture-of-experts model", model="llama-8b", precision="fp8", moe_ep=1)


# --- docs/source/legacy/reference/precision.md (engine) and examples/models/core/qwen/README.md ------------------
@pytest.mark.parametrize("name,precision,ok", [
    ("mixtral", "fp8", True), ("mixtral", "int4_awq", False), ("mixtral", "int8_sq", False),
    ("mistral", "int8_sq", True), ("mistral", "int4_awq", True), ("mistral", "w4a8_awq", False),
    ("qwen2", "int4_awq", True), ("qwen2", "int8_sq", True), ("qwen3", "fp8", True), ("qwen3", "int4_awq", False),
    ("llama", "w4a8_awq", True), ("llama", "int8_sq", True),
])
def test_engine_support_cells(name, precision, ok):
    assert (support_blocker(name, pytorch_backend=False, precision=precision) is None) is ok


# --- docs/source/features/quantization.md: Model Supported Matrix (PyTorch backend) -------------------------------
@pytest.mark.parametrize("name,precision,ok", [
    ("mixtral", "fp8", True), ("mixtral", "int4_awq", False), ("mixtral", "w4a8_awq", False),
    ("mistral", "int4_awq", True), ("mistral", "w4a8_awq", False), ("qwen2", "w4a8_awq", True),
    ("qwen3", "int4_awq", True), ("qwen3", "w4a8_awq", False), ("llama", "w4a8_awq", True),
])
def test_pytorch_support_cells(name, precision, ok):
    assert (support_blocker(name, pytorch_backend=True, precision=precision) is None) is ok


def test_check_refuses_unsupported_combination_naming_source():
    msg = reject(r"MixtralForCausalLM has no int4_awq on the engine runtime", model="mixtral-8x7b",
                 precision="int4_awq", tp=2)
    assert "precision.md" in msg and "--runtime pytorch" in msg
    msg = reject(r"Qwen3ForCausalLM has no w4a8_awq on the pytorch runtime", model="qwen3-8b",
                 precision="w4a8_awq", runtime="pytorch")
    assert "features/quantization.md" in msg


# --- modelopt 0.37 model_utils.py (MODEL_NAME_TO_TYPE) and tensorrt_llm_utils.py (manual exporter) ---------------
@pytest.mark.slow
def test_modelopt_decoder_types_and_manual_exporter():
    from modelopt.torch.export import model_utils, tensorrt_llm_utils

    for fam in FAMILIES.values():
        model = type(fam.hf_architecture, (), {})()
        assert model_utils.get_model_type(model) == fam.modelopt_decoder_type, fam.name
    # the exporter's own config path (no tensorrt_llm): decoder types it writes by hand
    src = inspect.getsource(tensorrt_llm_utils.convert_to_tensorrt_llm_config)
    assert 'if decoder_type in ["gpt", "gemma", "llama"]' in src
    assert '"moe_ep_size"] = 1' in src and '"normalization_mode": 1' in src
    assert 'f"Cannot export tensorrt_llm checkpoint for model {decoder_type}' in src  # "qwen" lands here
    for fam in FAMILIES.values():
        assert fam.trtllm_export_decoder == "llama", fam.name  # the manual writer's branch, weights as "llama"


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen3-8b"])
def test_reference_target_accepts_qwen_engine_export(model):
    """The engine checkpoint of a dense Qwen is written on a CPU host too (export.complete_config)."""
    spec = resolve_spec(model=model, precision="fp8", target="reference")
    assert spec.model.architecture.family in ("qwen2", "qwen3") and spec.runtime == "engine"


def test_trtllm_config_fields_per_family():
    """QWenConfig.from_hugging_face (models/qwen/config.py): qwen_type = model_type, attn_bias False for qwen3 only,
    rotary_base from rope_theta (default 100000), seq_length 8192, a dense MoeConfig(0, 0, NONE); Llama-class
    families add nothing (LLaMAConfig's fields are what ModelOpt's manual writer writes)."""
    from pipeline.core.architectures import trtllm_config_fields

    q2 = trtllm_config_fields({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 1e6,
                               "tie_word_embeddings": True})
    assert (q2["qwen_type"], q2["attn_bias"], q2["rotary_base"], q2["tie_word_embeddings"]) == ("qwen2", True, 1e6, True)
    assert q2["moe"] == {"num_experts": 0, "top_k": 0, "normalization_mode": 0} and q2["seq_length"] == 8192
    q3 = trtllm_config_fields({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    assert (q3["qwen_type"], q3["attn_bias"], q3["rotary_base"]) == ("qwen3", False, 100000.0)
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"):
        assert trtllm_config_fields({"architectures": [arch]}) == {}
    with pytest.raises(UnsupportedArchitecture, match="GPT2LMHeadModel"):
        trtllm_config_fields({"architectures": ["GPT2LMHeadModel"]})


@pytest.mark.parametrize("key,value", [("seq_length", 0), ("seq_length", -1), ("seq_length", 32.5),
                                       ("seq_length", True), ("seq_length", "8192"), ("use_logn_attn", "false"),
                                       ("use_logn_attn", 1)])
def test_trtllm_config_fields_take_numbers_as_written(key, value):
    from pipeline.core.architectures import UnusableConfigField, trtllm_config_fields

    with pytest.raises(UnusableConfigField, match=f"config.json field '{key}'={value!r}: expected"):
        trtllm_config_fields({**QWEN25_7B_CONFIG, key: value})


# --- transformers config.json -> architecture numbers -------------------------------------------------------------
QWEN25_7B_CONFIG = {  # Qwen/Qwen2.5-7B-Instruct config.json
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
    "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 152064,
}


def test_architecture_fields_match_the_registry_rows():
    fields = architecture_fields(QWEN25_7B_CONFIG)
    assert Architecture(**fields) == get_model("qwen2.5-7b").architecture
    mixtral = get_model("mixtral-8x7b").architecture
    assert Architecture(**architecture_fields(mixtral.hf_config())) == mixtral
    for entry in load_registry().values():  # every row round-trips through its family's config.json
        assert Architecture(**architecture_fields(json.loads(json.dumps(entry.architecture.hf_config())))) == \
            entry.architecture


def test_sliding_window_only_where_used():
    assert architecture_fields(QWEN25_7B_CONFIG)["sliding_window"] is None  # use_sliding_window: false
    mistral_v01 = {**get_model("mistral-7b").architecture.hf_config(), "sliding_window": 4096}
    assert architecture_fields(mistral_v01)["sliding_window"] == 4096


def test_architecture_fields_pass_values_as_written():
    """No int()/float()/bool() coercion: 32.5 heads, a "false" string or 0 kv heads reach the type checks as given."""
    fields = architecture_fields({**QWEN25_7B_CONFIG, "num_attention_heads": 32.5, "num_key_value_heads": 0,
                                  "tie_word_embeddings": "false", "rope_theta": float("nan")})
    assert (fields["num_heads"], fields["num_kv_heads"], fields["tie_word_embeddings"]) == (32.5, 0, "false")
    assert fields["rope_theta"] != fields["rope_theta"] and fields["head_dim"] is None


def test_unsupported_architecture_named():
    with pytest.raises(UnsupportedArchitecture, match="'GPT2LMHeadModel'.*supported: LlamaForCausalLM"):
        architecture_fields({"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnsupportedArchitecture, match="lacks a usable 'intermediate_size'"):
        architecture_fields({k: v for k, v in QWEN25_7B_CONFIG.items() if k != "intermediate_size"})


# --- registry rows and draft pairs --------------------------------------------------------------------------------
def test_llama_dumps_unchanged():
    """Entries without the family fields dump (and hash into build ids) exactly as before they existed."""
    dumped = get_model("llama-8b").architecture.model_dump()
    assert set(dumped) == {"num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                           "vocab_size", "max_position_embeddings", "tie_word_embeddings", "rope_theta"}
    assert "tokenizer_size" not in get_model("llama-8b").model_dump()
    assert "moe_ep" not in resolve_spec(model="llama-8b").parallelism.model_dump()


@pytest.mark.parametrize("target,draft", [("qwen2.5-7b", "qwen2.5-0.5b"), ("qwen2.5-72b", "qwen2.5-1.5b"),
                                          ("qwen3-8b", "qwen3-0.6b"), ("qwen3-32b", "qwen3-0.6b")])
def test_natural_draft_pairs(target, draft):
    spec = resolve_spec(model=target, precision="fp8", draft="auto", tp=4 if "72b" in target else 1)
    assert spec.draft_model.name == draft


def test_draft_tokenizer_still_enforced():
    msg = reject(r"speculation.draft=qwen3-0.6b: its tokenizer \(qwen3", model="qwen2.5-7b", precision="fp8",
                 draft="qwen3-0.6b")
    assert "must share one tokenizer" in msg
    reject(r"its tokenizer", model="mistral-7b", precision="fp8", draft="llama-1b")


def test_readme_table_matches_the_adapters():
    """The docs' supported-architecture table (docs/model-families.md) is the adapters' data, cell by cell."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "model-families.md").read_text()
    cols = ["bf16", "fp8", "int4_awq", "w4a8_awq", "int8_sq"]
    rows = {}
    for line in text.splitlines():
        for fam in FAMILIES.values():
            if line.startswith("| ") and f"(`{fam.hf_architecture}`" in line:
                rows[fam.name] = [c.strip() for c in line.strip("|").split("|")][1:]
    assert set(rows) == set(FAMILIES)
    for name, cells in rows.items():
        fam = FAMILIES[name]
        engine, pytorch = cells[:5], cells[5:9]
        assert engine == ["Y" if p in fam.engine.precisions else "-" for p in cols], name
        assert pytorch == ["Y" if p in fam.pytorch.precisions else "-" for p in cols[:4]], name


def test_sliding_window_warns_past_the_window(tmp_path):
    models = tmp_path / "models.yaml"
    arch = {**get_model("mistral-7b").architecture.model_dump(), "sliding_window": 4096}
    import yaml

    models.write_text(yaml.safe_dump({"models": {"mistral-v01": {
        "repo_id": "mistralai/Mistral-7B-Instruct-v0.1", "tokenizer_family": "mistral-v1", "architecture": arch}}}))
    spec = resolve_spec(model="mistral-v01", models_file=str(models), precision="fp8", max_seq_len=8192,
                        max_input_len=2048)
    assert any("sliding window 4096" in w and "max_attention_window" in w for w in spec.warnings)
    spec = resolve_spec(model="mistral-v01", models_file=str(models), precision="fp8", max_seq_len=4096,
                        max_input_len=2048)
    assert not any("sliding window" in w for w in spec.warnings)
