"""A gRPC client for the Triton LLM-API (`llmapi`) model: request tensors by the 1.2 contract (one prompt per
request, no batch dimension: Triton max_batch_size 0) and one request over a stream, collecting what it answers.

`sampling` keys are SamplingParams names (`top_k`, `temperature`, `return_perf_metrics`, ...), sent as
`sampling_param_<name>`; `return_finish_reason` etc. go by their own names. Streamed responses carry the text so far.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import ServeError

MODEL = "tensorrt_llm"
# Input -> Triton datatype, from the llmapi config.pbtxt.
INPUT_TYPES = {
    "text_input": "BYTES", "streaming": "BOOL", "sampling_param_best_of": "INT32",
    "sampling_param_temperature": "FP32", "sampling_param_top_k": "INT32", "sampling_param_top_p": "FP32",
    "sampling_param_frequency_penalty": "FP32", "sampling_param_presence_penalty": "FP32",
    "sampling_param_max_tokens": "INT32", "sampling_param_stop": "BYTES", "sampling_param_seed": "UINT64",
    "sampling_param_exclude_input_from_output": "BOOL", "sampling_param_return_perf_metrics": "BOOL",
    "return_finish_reason": "BOOL", "return_stop_reason": "BOOL", "return_cumulative_logprob": "BOOL",
    "stop": "BOOL",
}
_NUMPY = {"BOOL": "bool", "INT32": "int32", "FP32": "float32", "UINT64": "uint64", "BYTES": "object"}
METRICS = ("kv_cache_reused_block", "kv_cache_missed_block", "kv_cache_alloc_new_blocks",
           "kv_cache_alloc_total_blocks", "kv_cache_hit_rate", "arrival_time_ns", "first_scheduled_time_ns",
           "first_token_time_ns", "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens",
           "total_draft_tokens", "finish_reason", "stop_reason", "cumulative_logprob")


def is_llmapi(inputs) -> bool:
    """Whether a model with these input names is the LLM-API model (rather than the tensorrtllm contract)."""
    return "sampling_param_max_tokens" in set(inputs)


def input_name(key: str) -> str:
    name = key if key in INPUT_TYPES else f"sampling_param_{key}"
    if name not in INPUT_TYPES:
        raise ServeError(f"{key!r} is not an input of the llmapi model; valid: {', '.join(sorted(INPUT_TYPES))}")
    return name


def request_inputs(prompt: str, max_tokens: int, *, streaming: bool, **sampling: Any) -> list:
    """The tritonclient gRPC inputs of one request."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    values = {"text_input": prompt, "streaming": streaming, "sampling_param_max_tokens": max_tokens}
    values.update({input_name(k): v for k, v in sampling.items() if v is not None})
    inputs = []
    for name, value in values.items():
        dtype = INPUT_TYPES[name]
        items = value if isinstance(value, list) else [value]
        arr = np.array([v.encode() if isinstance(v, str) else v for v in items], dtype=_NUMPY[dtype])
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def scalar(result, name: str) -> Any:
    """The first value of output `name` of a response (decoded text for strings), None when absent."""
    try:
        arr = result.as_numpy(name)
    except Exception:  # noqa: BLE001 - tritonclient raises for outputs a response lacks
        return None
    if arr is None or arr.size == 0:
        return None
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v


@dataclass
class StreamAnswer:
    """What one request received: the text of each response (the last is the full text), timings, metrics."""

    texts: list[str] = field(default_factory=list)
    ttft_s: float | None = None
    total_s: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.texts[-1] if self.texts else ""


def _collect(responses: queue.Queue, answer: StreamAnswer, t0: float, timeout_s: float) -> StreamAnswer:
    while True:
        try:
            t, result, error = responses.get(timeout=timeout_s)
        except queue.Empty:
            raise ServeError(f"llmapi stream: no response within {timeout_s:.0f} s") from None
        if error is not None:
            raise ServeError(f"llmapi request failed: {error}")
        response = result.get_response()
        if response.outputs:
            text = scalar(result, "text_output")
            if text is not None:
                answer.ttft_s = t - t0 if answer.ttft_s is None else answer.ttft_s
                answer.texts.append(text)
            answer.metrics.update({m: v for m in METRICS if (v := scalar(result, m)) is not None})
        final = response.parameters.get("triton_final_response")
        if final is None or final.bool_param:
            answer.total_s = t - t0
            return answer


def send(grpc_url: str, prompt: str, max_tokens: int, *, streaming: bool = True, request_id: str = "",
         timeout_s: float = 300.0, **sampling: Any) -> StreamAnswer:
    """One request to the llmapi model over a gRPC stream (works for decoupled and unary models)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url=grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
        inputs = request_inputs(prompt, max_tokens, streaming=streaming, **sampling)
        t0 = time.perf_counter()
        client.async_stream_infer(MODEL, inputs, request_id=request_id, enable_empty_final_response=True)
        return _collect(responses, StreamAnswer(), t0, timeout_s)
    finally:
        client.stop_stream()
        client.close()
