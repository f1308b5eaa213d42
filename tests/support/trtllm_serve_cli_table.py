"""The `trtllm-serve` (`serve` click command) options, written from NVIDIA's `tensorrt_llm/commands/serve.py` read at
the stored version @ 00209af149e7774406881a37283dce303571eb11 (the code index holds no tagged 1.2.1 copy; this one is
of the 1.2 era or just after: it has the `--config` alias). The flags the pipeline emits are older than 1.2: the
0.18.2 rendered docs list --tokenizer, --backend, --host, --port, --max_batch_size, --max_num_tokens, --max_seq_len,
--tp_size, --pp_size, and NVIDIA's 0.20.0 examples pass --extra_llm_api_options.

One row per option: every name the option answers to, then `flag` (a switch) or the value kind (`choice:` lists the
accepted values, aliases after `=`). Kept as data, independent of pipeline/stages/package/serve_plan.py, so a test comparing
the plan's argv with it can fail. The positional argument is MODEL ("model name | HF checkpoint path | TensorRT engine
path"). Later versions add --served_model_name and --grpc; they are not listed (1.2.1 does not take them)."""

from __future__ import annotations

OPTIONS = """
--tokenizer str
--custom_tokenizer str
--host str
--port int
--backend choice:pytorch,tensorrt,_autodeploy,trt=tensorrt
--custom_module_dirs path
--log_level str
--max_beam_width int
--max_batch_size int
--max_num_tokens int
--max_seq_len int
--tensor_parallel_size --tp_size int
--pipeline_parallel_size --pp_size int
--context_parallel_size --cp_size int
--moe_expert_parallel_size --ep_size int
--moe_cluster_parallel_size --cluster_size int
--gpus_per_node int
--free_gpu_memory_fraction --kv_cache_free_gpu_memory_fraction float
--num_postprocess_workers int
--trust_remote_code flag
--revision str
--config --extra_llm_api_options str
--reasoning_parser str
--tool_parser str
--metadata_server_config_file str
--server_role str
--fail_fast_on_attention_window_too_large flag
--otlp_traces_endpoint str
--disagg_cluster_uri str
--enable_chunked_prefill flag
--media_io_kwargs str
--chat_template str
"""


def options() -> dict[str, str]:
    """Every option name -> its kind (`flag`, `int`, `float`, `str`, `path`, `choice:...`)."""
    table: dict[str, str] = {}
    for row in OPTIONS.split("\n"):
        if not row.strip():
            continue
        *names, kind = row.split()
        for name in names:
            table[name] = kind
    return table


def backend_choices() -> dict[str, str]:
    """--backend value -> the backend it selects (aliases resolved)."""
    kind = options()["--backend"]
    out = {}
    for choice in kind.removeprefix("choice:").split(","):
        alias, _, target = choice.partition("=")
        out[alias] = target or alias
    return out
