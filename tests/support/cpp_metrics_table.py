"""The metric families the C++ tensorrtllm backend exports on Triton's metrics endpoint (TensorRT-LLM 1.2.1,
triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc: the families
`CustomMetricsReporter::InitializeReporter` creates and each one's category label and values; inflight-batching
models), transcribed as data for checking the reference backend against it. Every family also carries `model` and
`version`. Histograms are matched through their `_count` series."""

CPP_FAMILIES = (
    ("nv_trt_llm_request_metrics", "request_type", ("active", "max", "scheduled", "context", "waiting")),
    ("nv_trt_llm_runtime_memory_metrics", "memory_type", ("cpu", "gpu", "pinned")),
    ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type",
     ("max", "free", "used", "tokens_per", "reused", "fraction")),
    ("nv_trt_llm_disaggregated_serving_metrics", "disaggregated_serving_type",
     ("kv_cache_transfer_ms", "request_count")),
    ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric",
     ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests")),
    ("nv_trt_llm_general_metrics", "general_type", ("timestamp", "iteration_counter")),
    ("nv_llm_output_token_len_count", "response_metric_type", ("total_output_tokens",)),
    ("nv_llm_input_token_len_count", "response_metric_type", ("total_input_tokens",)),
)
