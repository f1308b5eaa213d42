"""The 1.2-line `llmapi` Triton model contract, written from NVIDIA's files (TensorRT-LLM
`triton_backend/all_models/llmapi/tensorrt_llm/{config.pbtxt, 1/model.yaml, 1/model.py, 1/helpers.py}`, read at
the stored version @ c8c6df08bd0ead54cd47f7973e1e425c28a174cd, the 1.2-era file set: later versions add the
`image_url`, `lora_*` and `sampling_param_logits_post_processor_name` inputs, which 1.2.1 does not read).

One row per tensor: `name TYPE [dims] [optional]`. Kept as data independent of pipeline/templates so the test can
fail."""

from __future__ import annotations

INPUTS = """
text_input STRING [-1]
streaming BOOL [1] optional
sampling_param_best_of INT32 [1] optional
sampling_param_temperature FP32 [1] optional
sampling_param_top_k INT32 [1] optional
sampling_param_top_p FP32 [1] optional
sampling_param_frequency_penalty FP32 [1] optional
sampling_param_presence_penalty FP32 [1] optional
sampling_param_max_tokens INT32 [1] optional
sampling_param_stop STRING [-1] optional
sampling_param_seed UINT64 [1] optional
sampling_param_exclude_input_from_output BOOL [1] optional
sampling_param_return_perf_metrics BOOL [1] optional
return_finish_reason BOOL [1] optional
return_stop_reason BOOL [1] optional
return_cumulative_logprob BOOL [1] optional
stop BOOL [1] optional
"""

OUTPUTS = """
text_output STRING [-1]
finish_reason STRING [-1]
stop_reason STRING [-1]
cumulative_logprob FP32 [-1]
kv_cache_reused_block INT32 [-1]
kv_cache_missed_block INT32 [-1]
kv_cache_alloc_new_blocks INT32 [-1]
kv_cache_alloc_total_blocks INT32 [-1]
kv_cache_hit_rate FP32 [-1]
arrival_time_ns INT64 [1]
first_scheduled_time_ns INT64 [1]
first_token_time_ns INT64 [1]
last_token_time_ns INT64 [1]
acceptance_rate FP32 [1]
total_accepted_draft_tokens INT32 [1]
total_draft_tokens INT32 [1]
"""

MODEL_NAME = "tensorrt_llm"
BACKEND = "python"
INSTANCE_KIND = "KIND_CPU"  # instance_group [{count: 1, kind: KIND_CPU}]: the LLM owns the GPUs itself

# model.yaml: `model` (LLM's first argument) and `triton_config.{max_batch_size, decoupled}` are required
# (model.py reads triton_config["decoupled"] / ["max_batch_size"]); every other key is an LLM(**kwargs) argument;
# the shipped file sets backend "pytorch" and max_batch_size 0 ("does not support batching").
MODEL_YAML_REQUIRED = ("model", "triton_config")
TRITON_CONFIG_KEYS = frozenset({"max_batch_size", "decoupled"})
TRITON_CONFIG_OPTIONAL = frozenset({"cancellation_check_period_ms"})
BACKEND_VALUE = "pytorch"
TRITON_MAX_BATCH_SIZE = 0

# Request inputs the 1.2 helpers map to SamplingParams(**kwargs) field names, and their defaults there.
SAMPLING_FIELDS = ("best_of", "temperature", "top_k", "top_p", "frequency_penalty", "presence_penalty",
                   "max_tokens", "seed", "exclude_input_from_output", "return_perf_metrics")
SAMPLING_DEFAULTS = {"best_of": 1, "exclude_input_from_output": False, "return_perf_metrics": False}


def rows(table: str) -> dict[str, dict]:
    """name -> {"type", "dims", "optional"} for a table above."""
    out = {}
    for line in table.strip().splitlines():
        name, dtype, dims, *flags = line.split()
        out[name] = {"type": "TYPE_" + dtype, "dims": [int(d) for d in dims.strip("[]").split(",")],
                     "optional": "optional" in flags}
    return out
