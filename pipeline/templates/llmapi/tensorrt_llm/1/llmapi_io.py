"""Request parsing and response building of the LLM-API `tensorrt_llm` model (shared by the GPU and the CPU
reference model.py): the tensor contract of the 1.2-line `llmapi/tensorrt_llm/config.pbtxt`.

A request carries one prompt (`text_input`, first element), optional `streaming`, `sampling_param_*` (SamplingParams
fields of the same name; `best_of` defaults to 1, `exclude_input_from_output` and `return_perf_metrics` to false,
`stop` is a list of strings), `return_finish_reason` / `return_stop_reason` / `return_cumulative_logprob` (which
optional outputs to send) and `stop` (cancel the request with the same request id). A response carries
`text_output`, the outputs asked for, and with `return_perf_metrics` the KV-cache, timing and speculative-decoding
metrics of the request.

Bounded work per request: a prompt (or its stop strings) over the byte cap (`prompt_byte_limit`: the LLM's
max_input_len, else max_seq_len, x BYTES_PER_TOKEN) is refused before anything decodes or tokenizes it; sampling
values that are not finite (NaN/inf), outside the bounds of TensorRT-LLM's SamplingParams / executor SamplingConfig,
or over the build's ceiling (`best_of` <= max_batch_size, `max_tokens` <= max_seq_len: `request_ceilings`) are
refused (`check_sampling`).
"""

import math
import os

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

SAMPLING_FIELDS = ("best_of", "temperature", "top_k", "top_p", "frequency_penalty", "presence_penalty",
                   "max_tokens", "seed", "exclude_input_from_output", "return_perf_metrics")
SAMPLING_DEFAULTS = {"best_of": 1, "exclude_input_from_output": False, "return_perf_metrics": False}
OUTPUT_FLAGS = {"return_finish_reason": "finish_reason", "return_stop_reason": "stop_reason",
                "return_cumulative_logprob": "cumulative_logprob"}
# Perf outputs: name -> (numpy dtype, key of the metrics dict the model reports).
PERF_OUTPUTS = {
    "kv_cache_reused_block": (np.int32, "reused_blocks"),
    "kv_cache_missed_block": (np.int32, "missed_blocks"),
    "kv_cache_alloc_new_blocks": (np.int32, "alloc_new_blocks"),
    "kv_cache_alloc_total_blocks": (np.int32, "alloc_total_blocks"),
    "kv_cache_hit_rate": (np.float32, "kv_cache_hit_rate"),
    "arrival_time_ns": (np.int64, "arrival_time_ns"),
    "first_scheduled_time_ns": (np.int64, "first_scheduled_time_ns"),
    "first_token_time_ns": (np.int64, "first_token_time_ns"),
    "last_token_time_ns": (np.int64, "last_token_time_ns"),
    "acceptance_rate": (np.float32, "acceptance_rate"),
    "total_accepted_draft_tokens": (np.int32, "total_accepted_draft_tokens"),
    "total_draft_tokens": (np.int32, "total_draft_tokens"),
}
CONFIG_FILE = "model.yaml"
BYTES_PER_TOKEN = 32  # generous: text averages about 4 bytes per token
DEFAULT_MAX_PROMPT_BYTES = 4 << 20
# SamplingParams field -> (lowest, lowest allowed, highest or None, human bound), as TensorRT-LLM 1.2 checks them
# (executor SamplingConfig: temperature >= 0, top_k >= 0, 0 < top_p <= 1; best_of >= n = 1; max_tokens >= 1).
SAMPLING_BOUNDS = {
    "temperature": (0.0, True, None, ">= 0"),
    "top_k": (0, True, None, ">= 0"),
    "top_p": (0.0, False, 1.0, "in (0, 1]"),
    "max_tokens": (1, True, None, ">= 1"),
    "best_of": (1, True, None, ">= 1"),
    "frequency_penalty": (None, True, None, "finite"),
    "presence_penalty": (None, True, None, "finite"),
}
# SamplingParams field -> the LLM argument that is its ceiling (best_of sequences take batch slots; max_tokens fits
# in max_seq_len).
SAMPLING_CEILINGS = {"best_of": "max_batch_size", "max_tokens": "max_seq_len"}


class BadRequest(Exception):
    """A request this model refuses (sent back as the request's error response)."""


def read_model_yaml(model_dir: str) -> dict:
    """`model.yaml` next to model.py (or $LLM_CONFIG_PATH, relative to it), parsed safely; must be a mapping."""
    path = os.path.join(model_dir, os.environ.get("LLM_CONFIG_PATH", CONFIG_FILE))
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise pb_utils.TritonModelException(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or "model" not in data or not isinstance(data.get("triton_config"), dict):
        raise pb_utils.TritonModelException(f"{path} needs `model` and a `triton_config` mapping")
    return data


def apply_triton_config(auto_complete_model_config, model_dir: str):
    """Transaction policy and max batch size from model.yaml's `triton_config` (as upstream's model.py does)."""
    tc = read_model_yaml(model_dir)["triton_config"]
    auto_complete_model_config.set_model_transaction_policy({"decoupled": bool(tc["decoupled"])})
    auto_complete_model_config.set_max_batch_size(int(tc["max_batch_size"]))
    return auto_complete_model_config


def prompt_byte_limit(llm_args: dict) -> int:
    """The byte cap of one prompt: max_input_len (else max_seq_len) tokens x BYTES_PER_TOKEN."""
    tokens = llm_args.get("max_input_len") or llm_args.get("max_seq_len")
    return int(tokens) * BYTES_PER_TOKEN if tokens else DEFAULT_MAX_PROMPT_BYTES


def request_ceilings(llm_args: dict) -> dict:
    """SAMPLING_CEILINGS resolved from the LLM arguments (model.yaml): field -> ceiling; unknown ones left out."""
    out = {}
    for field, arg in SAMPLING_CEILINGS.items():
        value = llm_args.get(arg)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[field] = value
    return out


def check_sampling(sampling: dict, ceilings: dict | None = None) -> None:
    """Raise BadRequest for the first sampling value that is not finite, outside SAMPLING_BOUNDS or over its
    ceiling (`ceilings`: field -> the build's highest value, from `request_ceilings`)."""
    ceilings = ceilings or {}
    for name, (low, inclusive, high, bound) in SAMPLING_BOUNDS.items():
        value = sampling.get(name)
        if value is None:
            continue
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise BadRequest(f"sampling_param_{name} must be a number, got {value!r}; send a number") from None
        if not math.isfinite(value):
            raise BadRequest(f"sampling_param_{name} must be finite, got {value}; send a finite number")
        if low is not None and (value < low or (value == low and not inclusive) or (high is not None and value > high)):
            raise BadRequest(f"sampling_param_{name} must be {bound}, got {value:g}; send a value {bound}")
        ceiling = ceilings.get(name)
        if ceiling is not None and value > ceiling:
            raise BadRequest(f"sampling_param_{name} {value:g} is over the build's {SAMPLING_CEILINGS[name]} "
                             f"{ceiling}; send sampling_param_{name} <= {ceiling}")


def _nbytes(value) -> int:
    return len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8"))


def _array(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request, name):
    arr = _array(request, name)
    if arr is None:
        return None
    if arr.size != 1:
        raise BadRequest(f"{name} must hold exactly one value (got shape {list(arr.shape)})")
    value = arr.reshape(-1)[0]
    return value.item() if hasattr(value, "item") else value


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def is_stop_request(request) -> bool:
    return bool(_scalar(request, "stop"))


def parse_request(request, max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES, ceilings: dict | None = None) -> dict:
    """One request -> {"prompt", "sampling" (SamplingParams kwargs), "streaming", "outputs" (flags)}; raises
    BadRequest for a prompt or stop strings over `max_prompt_bytes` and for sampling values out of bounds or over
    `ceilings` (`request_ceilings`)."""
    text = _array(request, "text_input")
    if text is None or text.size == 0:
        raise BadRequest("text_input is missing from the request")
    if text.ndim > 1 and text.shape[0] != 1:
        raise BadRequest("text_input must be one prompt (a 1-D tensor)")
    stop = _array(request, "sampling_param_stop")
    for name, arr in (("text_input", text), ("sampling_param_stop", stop)):
        size = 0 if arr is None else sum(_nbytes(v) for v in arr.reshape(-1))
        if size > max_prompt_bytes:
            raise BadRequest(f"{name} is {size} bytes, over the limit of {max_prompt_bytes} bytes "
                             f"(the model's input length x {BYTES_PER_TOKEN} bytes per token); shorten it")
    sampling = {}
    for field in SAMPLING_FIELDS:
        value = _scalar(request, f"sampling_param_{field}")
        if value is None:
            value = SAMPLING_DEFAULTS.get(field)
        if value is not None:
            sampling[field] = value
    check_sampling(sampling, ceilings)
    sampling["stop"] = [_text(s) for s in stop.reshape(-1)] if stop is not None and stop.size else None
    outputs = {flag: bool(_scalar(request, flag) or False) for flag in OUTPUT_FLAGS}
    return {"prompt": _text(text.reshape(-1)[0]), "sampling": sampling,
            "streaming": bool(_scalar(request, "streaming") or False), "outputs": outputs}


def build_response(text: str, *, outputs: dict, finish_reason=None, stop_reason=None, cumulative_logprob=None,
                   perf: dict | None = None):
    """An InferenceResponse: text_output, the optional outputs the request asked for, and `perf` metrics if given."""
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    if outputs.get("return_finish_reason"):
        tensors.append(pb_utils.Tensor("finish_reason", np.array([str(finish_reason).encode()], dtype=np.object_)))
    if outputs.get("return_stop_reason"):
        tensors.append(pb_utils.Tensor("stop_reason", np.array([str(stop_reason).encode()], dtype=np.object_)))
    if outputs.get("return_cumulative_logprob"):
        value = float("nan") if cumulative_logprob is None else float(cumulative_logprob)
        tensors.append(pb_utils.Tensor("cumulative_logprob", np.array([value], dtype=np.float32)))
    if perf is not None:
        for name, (dtype, key) in PERF_OUTPUTS.items():
            tensors.append(pb_utils.Tensor(name, np.array([perf.get(key, 0)], dtype=dtype)))
    return pb_utils.InferenceResponse(output_tensors=tensors)


def error_response(message: str, *, cancelled: bool = False):
    code = pb_utils.TritonError.CANCELLED if cancelled else pb_utils.TritonError.UNKNOWN
    try:
        error = pb_utils.TritonError(message, code)
    except TypeError:  # older python backends: no error codes
        error = pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)
