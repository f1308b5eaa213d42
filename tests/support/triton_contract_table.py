"""The 1.2-era `inflight_batcher_llm` tensor and parameter contract, written from NVIDIA's templates
(TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt`, 1.2 line), model by model.

One row per tensor: `name TYPE [dims] [optional] [reshape[...]] [ragged]`; `${logits_datatype}` taken as FP32,
prompt-table / encoder-feature types as FP16 (the templates' defaults). Parameters: every key the template
declares. ENSEMBLE_FLOW: per step, model input <- ensemble input or `producer.output`; model output -> ensemble
output (or the consuming step). Kept as data independent of pipeline/templates so the test can fail."""

from __future__ import annotations

PREPROCESSING_INPUTS = """
QUERY STRING [1]
DECODER_QUERY STRING [1] optional
IMAGE_BYTES UINT8 [-1,-1,-1,-1] optional
IMAGE_URL STRING [1] optional
IMAGES STRING [-1] optional
VIDEO_BYTES UINT8 [-1,-1,-1,-1] optional
REQUEST_OUTPUT_LEN INT32 [1]
BAD_WORDS_DICT STRING [-1] optional
STOP_WORDS_DICT STRING [-1] optional
EMBEDDING_BIAS_WORDS STRING [-1] optional
EMBEDDING_BIAS_WEIGHTS FP32 [-1] optional
END_ID INT32 [1] optional
PAD_ID INT32 [1] optional
PROMPT_TABLE_EXTRA_ID UINT64 [1] optional
"""

PREPROCESSING_OUTPUTS = """
INPUT_ID INT32 [-1]
REQUEST_INPUT_LEN INT32 [1]
DECODER_INPUT_ID INT32 [-1]
REQUEST_DECODER_INPUT_LEN INT32 [1]
BAD_WORDS_IDS INT32 [2,-1]
STOP_WORDS_IDS INT32 [2,-1]
EMBEDDING_BIAS FP32 [-1]
REQUEST_OUTPUT_LEN INT32 [-1]
OUT_END_ID INT32 [1]
OUT_PAD_ID INT32 [1]
OUT_PROMPT_TABLE_EXTRA_IDS UINT64 [-1]
PIXEL_VALUES FP16 [-1,-1,-1,-1]
ASPECT_RATIO_IDS INT64 [-1]
ASPECT_RATIO_MASK INT64 [-1,-1]
CROSS_ATTENTION_MASK INT64 [-1,-1,-1]
IMAGE_SIZES INT64 [-1,2]
IS_VIDEO_INPUT BOOL [1]
ATTENTION_MASK INT64 [-1]
IMAGE_GRID_THW INT64 [3]
VISION_INPUT_ID INT32 [-1]
"""

PREPROCESSING_PARAMETERS = frozenset({
    "add_special_tokens", "gpt_model_path", "hf_model_path", "max_num_images", "multimodal_model_path",
    "tokenizer_dir",
})

POSTPROCESSING_INPUTS = """
TOKENS_BATCH INT32 [-1,-1]
SEQUENCE_LENGTH INT32 [-1]
"""

POSTPROCESSING_OUTPUTS = """
OUTPUT STRING [-1]
"""

POSTPROCESSING_PARAMETERS = frozenset({
    "skip_special_tokens", "tokenizer_dir",
})

TENSORRT_LLM_INPUTS = """
input_ids INT32 [-1] optional ragged
encoder_input_features FP16 [-1,-1] optional ragged
encoder_output_lengths INT32 [1] optional reshape[]
input_lengths INT32 [1] reshape[]
request_output_len INT32 [1] reshape[]
num_return_sequences INT32 [1] optional reshape[]
draft_input_ids INT32 [-1] optional ragged
decoder_input_ids INT32 [-1] optional ragged
decoder_input_lengths INT32 [1] optional reshape[]
draft_logits FP32 [-1,-1] optional ragged
draft_acceptance_threshold FP32 [1] optional reshape[]
end_id INT32 [1] optional reshape[]
pad_id INT32 [1] optional reshape[]
stop_words_list INT32 [2,-1] optional ragged
bad_words_list INT32 [2,-1] optional ragged
embedding_bias FP32 [-1] optional ragged
beam_width INT32 [1] optional reshape[]
temperature FP32 [1] optional reshape[]
runtime_top_k INT32 [1] optional reshape[]
runtime_top_p FP32 [1] optional reshape[]
runtime_top_p_min FP32 [1] optional reshape[]
runtime_top_p_decay FP32 [1] optional reshape[]
runtime_top_p_reset_ids INT32 [1] optional reshape[]
len_penalty FP32 [1] optional reshape[]
early_stopping BOOL [1] optional reshape[]
repetition_penalty FP32 [1] optional reshape[]
min_tokens INT32 [1] optional reshape[]
beam_search_diversity_rate FP32 [1] optional reshape[]
presence_penalty FP32 [1] optional reshape[]
frequency_penalty FP32 [1] optional reshape[]
seed UINT64 [1] optional reshape[]
return_log_probs BOOL [1] optional reshape[]
return_context_logits BOOL [1] optional reshape[]
return_generation_logits BOOL [1] optional reshape[]
return_perf_metrics BOOL [1] optional reshape[]
return_num_input_tokens BOOL [1] optional reshape[]
return_num_output_tokens BOOL [1] optional reshape[]
exclude_input_in_output BOOL [1] optional reshape[]
stop BOOL [1] optional reshape[]
streaming BOOL [1] optional reshape[]
prompt_embedding_table FP16 [-1,-1] optional ragged
prompt_table_extra_ids UINT64 [-1] optional ragged
prompt_vocab_size INT32 [1] optional reshape[]
cross_attention_mask BOOL [-1,-1] optional ragged
mrope_rotary_cos_sin FP32 [-1] optional
mrope_position_deltas INT64 [1] optional
lora_task_id UINT64 [1] optional reshape[]
lora_weights FP16 [-1,-1] optional ragged
lora_config INT32 [-1,3] optional ragged
context_phase_params UINT8 [-1] optional ragged
skip_cross_attn_blocks BOOL [1] optional ragged
retention_token_range_starts INT32 [-1] optional ragged
retention_token_range_ends INT32 [-1] optional ragged
retention_token_range_priorities INT32 [-1] optional ragged
retention_token_range_durations_ms INT32 [-1] optional ragged
retention_decode_priority INT32 [1] optional ragged
retention_decode_duration_ms INT32 [1] optional ragged
guided_decoding_guide_type STRING [1] optional ragged
guided_decoding_guide STRING [1] optional ragged
lookahead_window_size INT32 [1] optional ragged
lookahead_ngram_size INT32 [1] optional ragged
lookahead_verification_set_size INT32 [1] optional ragged
"""

TENSORRT_LLM_OUTPUTS = """
output_ids INT32 [-1,-1]
sequence_length INT32 [-1]
cum_log_probs FP32 [-1]
output_log_probs FP32 [-1,-1]
context_logits FP32 [-1,-1]
generation_logits FP32 [-1,-1,-1]
batch_index INT32 [1]
sequence_index INT32 [1]
context_phase_params UINT8 [-1]
kv_cache_alloc_new_blocks INT32 [1]
kv_cache_reused_blocks INT32 [1]
kv_cache_alloc_total_blocks INT32 [1]
arrival_time_ns INT64 [1]
first_scheduled_time_ns INT64 [1]
first_token_time_ns INT64 [1]
last_token_time_ns INT64 [1]
acceptance_rate FP32 [1]
total_accepted_draft_tokens INT32 [1]
total_draft_tokens INT32 [1]
num_input_tokens INT32 [1]
num_output_tokens INT32 [1]
"""

TENSORRT_LLM_PARAMETERS = frozenset({
    "FORCE_CPU_ONLY_INPUT_TENSORS", "batch_scheduler_policy", "cancellation_check_period_ms",
    "cross_kv_cache_fraction", "cuda_graph_cache_size", "cuda_graph_mode", "decoding_mode", "eagle_choices",
    "enable_chunked_context", "enable_context_fmha_fp32_acc", "enable_kv_cache_reuse", "enable_trt_overlap",
    "encoder_model_path", "exclude_input_in_output", "executor_worker_path", "gpt_model_path", "gpt_model_type",
    "gpu_device_ids", "gpu_weights_percent", "guided_decoding_backend", "iter_stats_max_iterations",
    "kv_cache_free_gpu_mem_fraction", "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks",
    "lookahead_ngram_size", "lookahead_verification_set_size", "lookahead_window_size",
    "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_cache_max_adapter_size",
    "lora_cache_optimal_adapter_size", "lora_prefetch_dir", "max_attention_window_size", "max_beam_width",
    "max_tokens_in_paged_kv_cache", "medusa_choices", "multi_block_mode", "normalize_log_probs", "num_nodes",
    "participant_ids", "request_stats_max_iterations", "sink_token_length", "speculative_decoding_fast_logits",
    "stats_check_period_ms", "tokenizer_dir", "xgrammar_tokenizer_info_path",
})

TENSORRT_LLM_BLS_INPUTS = """
text_input STRING [1]
decoder_text_input STRING [1] optional
image_input FP16 [-1,3,-1,-1] optional
image_bytes_input UINT8 [-1,-1,-1,-1] optional
image_url_input STRING [1] optional
video_bytes_input UINT8 [-1,-1,-1,-1] optional
max_tokens INT32 [1]
bad_words STRING [-1] optional
stop_words STRING [-1] optional
exclude_input_in_output BOOL [1] optional
end_id INT32 [1] optional
pad_id INT32 [1] optional
top_k INT32 [1] optional
top_p FP32 [1] optional
temperature FP32 [1] optional
length_penalty FP32 [1] optional
repetition_penalty FP32 [1] optional
min_tokens INT32 [1] optional
presence_penalty FP32 [1] optional
frequency_penalty FP32 [1] optional
seed UINT64 [1] optional
return_log_probs BOOL [1] optional reshape[]
return_context_logits BOOL [1] optional reshape[]
return_generation_logits BOOL [1] optional reshape[]
num_return_sequences INT32 [1] optional reshape[]
beam_width INT32 [1] optional
stream BOOL [1] optional
prompt_embedding_table FP16 [-1,-1] optional
prompt_vocab_size INT32 [1] optional
prompt_table_extra_id UINT64 [1] optional
embedding_bias_words STRING [-1] optional
embedding_bias_weights FP32 [-1] optional
num_draft_tokens INT32 [1] optional
use_draft_logits BOOL [1] optional reshape[]
lora_task_id UINT64 [1] optional reshape[]
lora_weights FP16 [-1,-1] optional ragged
lora_config INT32 [-1,3] optional ragged
return_perf_metrics BOOL [1] optional reshape[]
return_num_input_tokens BOOL [1] optional reshape[]
return_num_output_tokens BOOL [1] optional reshape[]
guided_decoding_guide_type STRING [1] optional
guided_decoding_guide STRING [1] optional
"""

TENSORRT_LLM_BLS_OUTPUTS = """
text_output STRING [-1]
cum_log_probs FP32 [-1]
output_log_probs FP32 [-1,-1]
context_logits FP32 [-1,-1]
generation_logits FP32 [-1,-1,-1]
batch_index INT32 [1]
sequence_index INT32 [1]
kv_cache_alloc_new_blocks INT32 [1]
kv_cache_reused_blocks INT32 [1]
kv_cache_alloc_total_blocks INT32 [1]
arrival_time_ns INT64 [1]
first_scheduled_time_ns INT64 [1]
first_token_time_ns INT64 [1]
last_token_time_ns INT64 [1]
acceptance_rate FP32 [1]
total_accepted_draft_tokens INT32 [1]
total_draft_tokens INT32 [1]
num_input_tokens INT32 [1]
num_output_tokens INT32 [1]
"""

TENSORRT_LLM_BLS_PARAMETERS = frozenset({
    "accumulate_tokens", "multimodal_encoders_name", "tensorrt_llm_draft_model_name", "tensorrt_llm_model_name",
})

ENSEMBLE_INPUTS = """
text_input STRING [1]
decoder_text_input STRING [1] optional
max_tokens INT32 [1]
num_return_sequences INT32 [1] optional
bad_words STRING [-1] optional
stop_words STRING [-1] optional
exclude_input_in_output BOOL [1] optional
end_id INT32 [1] optional
pad_id INT32 [1] optional
top_k INT32 [1] optional
top_p FP32 [1] optional
temperature FP32 [1] optional
length_penalty FP32 [1] optional
repetition_penalty FP32 [1] optional
min_tokens INT32 [1] optional
presence_penalty FP32 [1] optional
frequency_penalty FP32 [1] optional
seed UINT64 [1] optional
return_log_probs BOOL [1] optional
return_context_logits BOOL [1] optional
return_generation_logits BOOL [1] optional
return_perf_metrics BOOL [1] optional
return_num_input_tokens BOOL [1] optional
return_num_output_tokens BOOL [1] optional
beam_width INT32 [1] optional
stream BOOL [1] optional
prompt_embedding_table FP16 [-1,-1] optional
prompt_table_extra_id UINT64 [1] optional
prompt_vocab_size INT32 [1] optional
embedding_bias_words STRING [-1] optional
embedding_bias_weights FP32 [-1] optional
lora_task_id UINT64 [1] optional
lora_weights FP16 [-1,-1] optional ragged
lora_config INT32 [-1,3] optional ragged
guided_decoding_guide_type STRING [1] optional ragged
guided_decoding_guide STRING [1] optional ragged
"""

ENSEMBLE_OUTPUTS = """
text_output STRING [-1]
cum_log_probs FP32 [-1]
output_log_probs FP32 [-1,-1]
context_logits FP32 [-1,-1]
generation_logits FP32 [-1,-1,-1]
batch_index INT32 [1]
sequence_index INT32 [1]
kv_cache_alloc_new_blocks INT32 [1]
kv_cache_reused_blocks INT32 [1]
kv_cache_alloc_total_blocks INT32 [1]
arrival_time_ns INT64 [1]
first_scheduled_time_ns INT64 [1]
first_token_time_ns INT64 [1]
last_token_time_ns INT64 [1]
acceptance_rate FP32 [1]
total_accepted_draft_tokens INT32 [1]
total_draft_tokens INT32 [1]
num_input_tokens INT32 [1]
num_output_tokens INT32 [1]
"""

ENSEMBLE_PARAMETERS = frozenset({
   
})

ENSEMBLE_FLOW = {
    "preprocessing": {
        "BAD_WORDS_DICT": "bad_words",
        "DECODER_QUERY": "decoder_text_input",
        "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
        "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
        "END_ID": "end_id",
        "PAD_ID": "pad_id",
        "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
        "QUERY": "text_input",
        "REQUEST_OUTPUT_LEN": "max_tokens",
        "STOP_WORDS_DICT": "stop_words",
    },
    "tensorrt_llm": {
        "bad_words_list": "preprocessing.BAD_WORDS_IDS",
        "beam_width": "beam_width",
        "decoder_input_ids": "preprocessing.DECODER_INPUT_ID",
        "decoder_input_lengths": "preprocessing.REQUEST_DECODER_INPUT_LEN",
        "embedding_bias": "preprocessing.EMBEDDING_BIAS",
        "end_id": "preprocessing.OUT_END_ID",
        "exclude_input_in_output": "exclude_input_in_output",
        "frequency_penalty": "frequency_penalty",
        "guided_decoding_guide": "guided_decoding_guide",
        "guided_decoding_guide_type": "guided_decoding_guide_type",
        "input_ids": "preprocessing.INPUT_ID",
        "input_lengths": "preprocessing.REQUEST_INPUT_LEN",
        "len_penalty": "length_penalty",
        "lora_config": "lora_config",
        "lora_task_id": "lora_task_id",
        "lora_weights": "lora_weights",
        "min_tokens": "min_tokens",
        "num_return_sequences": "num_return_sequences",
        "pad_id": "preprocessing.OUT_PAD_ID",
        "presence_penalty": "presence_penalty",
        "prompt_embedding_table": "prompt_embedding_table",
        "prompt_table_extra_ids": "preprocessing.OUT_PROMPT_TABLE_EXTRA_IDS",
        "prompt_vocab_size": "prompt_vocab_size",
        "repetition_penalty": "repetition_penalty",
        "request_output_len": "preprocessing.REQUEST_OUTPUT_LEN",
        "return_context_logits": "return_context_logits",
        "return_generation_logits": "return_generation_logits",
        "return_log_probs": "return_log_probs",
        "return_num_input_tokens": "return_num_input_tokens",
        "return_num_output_tokens": "return_num_output_tokens",
        "return_perf_metrics": "return_perf_metrics",
        "runtime_top_k": "top_k",
        "runtime_top_p": "top_p",
        "seed": "seed",
        "stop_words_list": "preprocessing.STOP_WORDS_IDS",
        "streaming": "stream",
        "temperature": "temperature",
    },
    "postprocessing": {
        "SEQUENCE_LENGTH": "tensorrt_llm.sequence_length",
        "TOKENS_BATCH": "tensorrt_llm.output_ids",
    },
}

ENSEMBLE_OUTPUTS_FROM = {
    "acceptance_rate": "tensorrt_llm.acceptance_rate",
    "arrival_time_ns": "tensorrt_llm.arrival_time_ns",
    "batch_index": "tensorrt_llm.batch_index",
    "context_logits": "tensorrt_llm.context_logits",
    "cum_log_probs": "tensorrt_llm.cum_log_probs",
    "first_scheduled_time_ns": "tensorrt_llm.first_scheduled_time_ns",
    "first_token_time_ns": "tensorrt_llm.first_token_time_ns",
    "generation_logits": "tensorrt_llm.generation_logits",
    "kv_cache_alloc_new_blocks": "tensorrt_llm.kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks": "tensorrt_llm.kv_cache_alloc_total_blocks",
    "kv_cache_reused_blocks": "tensorrt_llm.kv_cache_reused_blocks",
    "last_token_time_ns": "tensorrt_llm.last_token_time_ns",
    "num_input_tokens": "tensorrt_llm.num_input_tokens",
    "num_output_tokens": "tensorrt_llm.num_output_tokens",
    "output_log_probs": "tensorrt_llm.output_log_probs",
    "sequence_index": "tensorrt_llm.sequence_index",
    "total_accepted_draft_tokens": "tensorrt_llm.total_accepted_draft_tokens",
    "total_draft_tokens": "tensorrt_llm.total_draft_tokens",
    "text_output": "postprocessing.OUTPUT",
}
