"""TensorRT-LLM 1.2.0 `tensorrt_llm/llmapi/llm_args.py` fields this pipeline may write, transcribed from the Sphinx
viewcode rendering of that file in the 1.2.0 documentation (gh-pages `1.2.0/_modules/tensorrt_llm/llmapi/
llm_args.html`, generated from commit dbdb13b; the code index holds no tagged 1.2.1 `.py`). Kept as data,
independent of pipeline/stages/package/llmapi_options.py, so a test comparing the YAML we write with it can fail.

`FROM_DICT`: the `decoding_type` keys of `DecodingBaseConfig.from_dict`'s dispatch table (case-sensitive; the key is
removed before the class is built). Each config class is a StrictBaseModel (extra="forbid")."""

from __future__ import annotations

FROM_DICT = {"MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "SaveState", "UserProvided", "AUTO"}

DECODING_BASE = {"max_draft_len", "max_total_draft_tokens", "speculative_model", "speculative_model_dir",
                 "max_concurrency", "draft_len_schedule", "load_format", "acceptance_window",
                 "acceptance_length_threshold", "allow_advanced_sampling"}  # speculative_model_dir: its alias

CLASSES = {
    "DraftTarget": DECODING_BASE,
    "NGram": DECODING_BASE | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "Eagle": DECODING_BASE | {"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree",
                              "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer",
                              "eagle3_one_model", "eagle3_layers_to_capture", "eagle3_model_arch"},
}

# BaseLlmArgs / TorchLlmArgs top-level fields among those the pipeline writes
LLM_ARGS = {"model", "tokenizer", "backend", "tensor_parallel_size", "pipeline_parallel_size",
            "moe_expert_parallel_size", "moe_tensor_parallel_size", "max_batch_size", "max_num_tokens",
            "max_seq_len", "max_beam_width", "enable_chunked_prefill", "kv_cache_config", "speculative_config",
            "disable_overlap_scheduler"}
