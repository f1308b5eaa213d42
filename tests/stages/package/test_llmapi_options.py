"""The LLM-API options: derived from the spec, strict like upstream's LlmArgs, written and read back as YAML."""

from __future__ import annotations

import pytest
import yaml

from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec
from pipeline.stages.package.llmapi_options import LlmApiOptions, llm_api_options


def test_options_from_a_speculative_fp8_spec():
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", runtime="pytorch", target="reference",
                        max_batch_size=4)
    opts = llm_api_options(spec, draft_dir="/models/draft")
    assert opts.as_dict() == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "max_batch_size": 4,
        "max_num_tokens": spec.max_num_tokens,
        "max_seq_len": 512,
        "enable_chunked_prefill": True,
        "kv_cache_config": {"dtype": "fp8", "enable_block_reuse": True, "free_gpu_memory_fraction": 0.7},
        "speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4,
                               "speculative_model_dir": "/models/draft", "max_concurrency": 8},
    }


def test_options_without_draft_and_with_a_16_bit_kv():
    spec = resolve_spec(model="tiny-llama", precision="bf16", tp=2, pp=2, runtime="pytorch",
                        enable_kv_cache_reuse=False, enable_chunked_context=False, target="reference")
    d = llm_api_options(spec, draft_dir=None).as_dict()
    assert "speculative_config" not in d
    assert (d["tensor_parallel_size"], d["pipeline_parallel_size"]) == (2, 2)
    assert d["kv_cache_config"] == {"dtype": "auto", "enable_block_reuse": False, "free_gpu_memory_fraction": 0.9}
    assert d["enable_chunked_prefill"] is False


def test_draft_dir_must_match_the_spec():
    spec = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    with pytest.raises(SpecError, match="needs the draft's checkpoint directory"):
        llm_api_options(spec, draft_dir=None)
    plain = resolve_spec(model="tiny-llama", runtime="pytorch", target="reference")
    with pytest.raises(SpecError, match="no draft directory"):
        llm_api_options(plain, draft_dir="/x")


def test_yaml_round_trip(tmp_path):
    spec = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    opts = llm_api_options(spec, draft_dir="draft")
    f = tmp_path / "extra.yaml"
    f.write_text(opts.to_yaml())
    assert yaml.safe_load(f.read_text())["speculative_config"]["decoding_type"] == "DraftTarget"
    assert LlmApiOptions.read(f) == opts


def test_speculative_spellings_are_those_1_2_from_dict_takes():
    """The written keys/values against the table read from 1.2's llm_args.py (llmapi_options.py cites it)."""
    from pipeline.stages.package.llmapi_options import (
        DRAFT_TARGET_DECODING_TYPE,
        FROM_DICT_DECODING_TYPES,
        SPECULATIVE_MODEL_INPUT_NAMES,
        DraftTargetConfig,
    )

    spec = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    written = yaml.safe_load(llm_api_options(spec, draft_dir="draft").to_yaml())["speculative_config"]
    assert written["decoding_type"] == DRAFT_TARGET_DECODING_TYPE == "DraftTarget"
    assert written["decoding_type"] in FROM_DICT_DECODING_TYPES and "Draft_Target" not in FROM_DICT_DECODING_TYPES
    model_keys = [k for k in written if k.startswith("speculative_model")]
    assert model_keys == ["speculative_model_dir"] and set(model_keys) <= set(SPECULATIVE_MODEL_INPUT_NAMES)
    assert set(written) <= set(DraftTargetConfig.model_fields)


@pytest.mark.parametrize("patch, match", [
    ({"max_batch_size": 0}, r"max_batch_size=0"),
    ({"enable_chunked_prefil": True}, r"enable_chunked_prefil=True: Extra inputs are not permitted"),
    ({"kv_cache_config": {"dtype": "int8"}}, r"kv_cache_config.dtype='int8'"),
    ({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model_dir": "d"}},
     r"speculative_config.decoding_type='Draft_Target'"),
    ({"speculative_config": {"max_draft_len": 4, "speculative_model": "d"}}, r"speculative_config"),
])
def test_bad_options_refused(patch, match):
    base = {"max_batch_size": 8, "max_num_tokens": 8192, "max_seq_len": 512}
    with pytest.raises(SpecError, match=match):
        LlmApiOptions.from_mapping({**base, **patch}, what="t.yaml")


def test_ngram_options_are_1_2_fields_with_its_required_values():
    from tests.support import llm_args_table as table

    spec = resolve_spec(model="tiny-llama", precision="fp8", speculative_decoding="ngram", draft_len=3,
                        max_matching_ngram_size=4, runtime="pytorch", target="reference", max_batch_size=4)
    written = yaml.safe_load(llm_api_options(spec, draft_dir=None).to_yaml())
    assert set(written) <= table.LLM_ARGS and written["disable_overlap_scheduler"] is True
    config = written["speculative_config"]
    assert config == {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 4, "max_concurrency": 8}
    assert config["decoding_type"] in table.FROM_DICT
    assert set(config) - {"decoding_type"} <= table.CLASSES["NGram"]
    # 1.2.0 declares max_matching_ngram_size=0 and asserts > 0: the default is always written
    default = resolve_spec(model="tiny-llama", speculative_decoding="ngram", runtime="pytorch", target="reference")
    assert llm_api_options(default, draft_dir=None).as_dict()["speculative_config"]["max_matching_ngram_size"] == 2
    # the KV pool is the target's alone (no draft model beside it)
    assert written["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    with pytest.raises(SpecError, match=r"speculative_config.*max_matching_ngram_size"):
        LlmApiOptions.from_mapping({**written, "speculative_config": {**config, "max_matching_ngram_size": 0}},
                                   what="t.yaml")


def test_draft_target_options_are_1_2_fields():
    from tests.support import llm_args_table as table

    spec = resolve_spec(model="tiny-llama", draft="auto", runtime="pytorch", target="reference")
    written = yaml.safe_load(llm_api_options(spec, draft_dir="d").to_yaml())
    assert set(written) <= table.LLM_ARGS and "disable_overlap_scheduler" not in written
    assert set(written["speculative_config"]) - {"decoding_type"} <= table.CLASSES["DraftTarget"]


def test_eagle3_options_are_1_2_eagle_fields():
    """EAGLE-3 is `decoding_type: Eagle` (1.2's `from_dict` has no "Eagle3" key), with the head's directory and
    the capture layers only where the head's registry entry names them; no sampler is chosen (TRTLLMSampler and
    EAGLE-3 are refused together upstream)."""
    from tests.support import llm_args_table as table

    tiny = resolve_spec(model="tiny-llama", precision="fp8", speculative_decoding="eagle3", draft="tiny-llama-eagle3",
                        runtime="pytorch", target="reference", max_batch_size=4)
    written = yaml.safe_load(llm_api_options(tiny, draft_dir="head").to_yaml())
    assert set(written) <= table.LLM_ARGS and "sampler_type" not in written
    assert "disable_overlap_scheduler" not in written  # one-model EAGLE-3 keeps the overlap scheduler
    config = written["speculative_config"]
    assert config == {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model_dir": "head",
                      "eagle3_layers_to_capture": [0, 1, 2], "max_concurrency": 8}
    assert config["decoding_type"] in table.FROM_DICT
    assert set(config) - {"decoding_type"} <= table.CLASSES["Eagle"]
    # the head's layer lives in the target's KV pool: the pool keeps the target's share
    assert written["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    big = resolve_spec(model="llama3.3-70b", precision="fp8", tp=4, speculative_decoding="eagle3", draft="auto",
                       runtime="pytorch", max_batch_size=16)
    config = llm_api_options(big, draft_dir="/h").as_dict()["speculative_config"]
    assert config == {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/h",
                      "max_concurrency": 8}  # upstream's default capture (1, 39, 76) for 80 layers
    with pytest.raises(SpecError, match="needs the EAGLE-3 head.s directory"):
        llm_api_options(big, draft_dir=None)


@pytest.mark.parametrize("patch, match", [
    ({"decoding_type": "Eagle3"}, r"speculative_config.decoding_type='Eagle3'"),
    ({"speculative_model_dir": None}, r"speculative_config.Eagle.speculative_model_dir"),
    ({"max_draft_len": 0}, r"speculative_config.Eagle.max_draft_len"),
    ({"eagle3_one_model": False}, r"speculative_config.Eagle.eagle3_one_model"),
])
def test_eagle_options_refused(patch, match):
    base = {"max_batch_size": 8, "max_num_tokens": 8192, "max_seq_len": 512}
    config = {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "h", **patch}
    with pytest.raises(SpecError, match=match):
        LlmApiOptions.from_mapping({**base, "speculative_config": config}, what="t.yaml")
