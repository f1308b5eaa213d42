"""Reference LLM-API `tensorrt_llm` model (Triton Python backend, CPU): the tensor contract of TensorRT-LLM 1.2's
`llmapi/tensorrt_llm` model served by transformers from the exported Hugging Face checkpoint that `model.yaml`
names (`model`, and `speculative_config.speculative_model_dir` for the draft model or EAGLE-3 head). Only for
`--target reference`.

model.yaml is read as the GPU model reads it: `triton_config` (`decoupled`, `max_batch_size`) for Triton, the rest
as LLM arguments, of which this model honours `model`, `tokenizer`, `max_batch_size`, `max_seq_len`,
`kv_cache_config.enable_block_reuse` and `speculative_config` (`decoding_type` DraftTarget, NGram or Eagle;
`max_draft_len`, `speculative_model_dir` (alias `speculative_model`), `max_concurrency`, NGram's
`max_matching_ngram_size`, Eagle's `eagle3_layers_to_capture` and `eagle3_one_model`, which changes no token);
the others (parallelism, memory fractions, KV dtype) only matter on a GPU. A relative path is taken relative to
this directory (the installed repository holds absolute ones). config.pbtxt parameters
`reference_dtype` (float32 | float64) and `tokens_per_block` (prefix-cache block size) are read too.

Requests (see llmapi_io): one prompt each; `streaming` needs a decoupled model and sends one response per step
with the text generated so far (as the LLM API's `CompletionOutput.text`), the last one final; otherwise one
response at the end. `text_output` is the generated text only. `sampling_param_best_of` > 1 is refused. A request
is cancelled by the client (polled every 50 ms) or by a `stop` request with the same request id.
"""

import json
import os
import threading
import time

import torch
import triton_python_backend_utils as pb_utils
from hf_reference import Engine, EngineSettings, Sequence, load_eagle3, load_model
from llmapi_io import (
    BadRequest,
    apply_triton_config,
    build_response,
    error_response,
    is_stop_request,
    parse_request,
    prompt_byte_limit,
    read_model_yaml,
    request_ceilings,
)
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_POLL_S = 0.05
# One lock around every exchange with the server from this model's threads (tritonserver 2.51's Python backend
# can crash when threads of one model send responses or poll cancellation concurrently).
_IPC = threading.RLock()
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value or default


def _path(value):
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(HERE, value))


class _Handle:
    """What the engine needs to answer one Triton request."""

    def __init__(self, request, parsed):
        self.request, self.sender = request, request.get_response_sender()
        self.request_id = request.request_id()
        self.streaming, self.outputs = parsed["streaming"], parsed["outputs"]
        self.perf = bool(parsed["sampling"].get("return_perf_metrics"))
        self.last_poll = 0.0


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return apply_triton_config(auto_complete_model_config, HERE)

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        llm = read_model_yaml(HERE)
        self.max_prompt_bytes = prompt_byte_limit(llm)
        self.ceilings = request_ceilings(llm)
        dtype = _DTYPES.get(_param(config, "reference_dtype", "float32"))
        if dtype is None:
            raise pb_utils.TritonModelException("reference_dtype must be float32 or float64")
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 2) // 2)))
        model_dir = _path(str(llm["model"]))
        self.tokenizer = AutoTokenizer.from_pretrained(_path(str(llm.get("tokenizer") or model_dir)))
        spec = llm.get("speculative_config") or {}
        mode = spec.get("decoding_type")
        if spec and mode not in ("DraftTarget", "NGram", "Eagle"):
            raise pb_utils.TritonModelException(f"speculative_config.decoding_type {mode!r}: the reference backend "
                                                "serves DraftTarget, NGram and Eagle (EAGLE-3)")
        ngram = mode == "NGram"
        draft_dir = spec.get("speculative_model") or spec.get("speculative_model_dir")
        draft = load_model(_path(str(draft_dir)), dtype) if mode == "DraftTarget" else None
        target = load_model(model_dir, dtype)
        try:
            eagle = load_eagle3(spec, target, dtype, resolve=_path) if mode == "Eagle" else None
        except ValueError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        kv = llm.get("kv_cache_config") or {}
        self.lock = threading.Lock()
        self.by_id = {}  # request id -> sequences
        settings = EngineSettings(
            max_batch_size=int(llm.get("max_batch_size") or 2048),
            max_seq_len=int(llm.get("max_seq_len") or self.tokenizer.model_max_length),
            tokens_per_block=int(_param(config, "tokens_per_block", "32")),
            block_reuse=bool(kv.get("enable_block_reuse", True)),
            max_draft_len=int(spec.get("max_draft_len") or 0), max_concurrency=spec.get("max_concurrency"),
            max_matching_ngram_size=int(spec.get("max_matching_ngram_size") or 0) if ngram else 0)
        self.engine = Engine(target, self.tokenizer, settings, draft=draft, eagle=eagle, on_step=self._on_step)

    def execute(self, requests):
        for request in requests:
            try:
                self._accept(request)
            except BadRequest as exc:
                with _IPC:
                    request.get_response_sender().send(error_response(str(exc)), flags=FINAL)
        return None

    def _accept(self, request):
        if is_stop_request(request):
            self._stop(request)
            return
        parsed = parse_request(request, self.max_prompt_bytes, self.ceilings)
        if parsed["streaming"] and not self.decoupled:
            raise BadRequest("Streaming is only supported in decoupled mode.")
        if int(parsed["sampling"].get("best_of", 1)) != 1:
            raise BadRequest("sampling_param_best_of > 1 is not supported by the reference backend")
        ids = self.tokenizer(parsed["prompt"])["input_ids"]
        seq = Sequence(_Handle(request, parsed), ids, parsed["sampling"], self.tokenizer.eos_token_id)
        try:
            self.engine.submit(seq)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if seq.handle.request_id:
            with self.lock:
                self.by_id.setdefault(seq.handle.request_id, []).append(seq)

    def _stop(self, request):
        rid = request.request_id()
        with _IPC:
            sender = request.get_response_sender()
            if not rid:
                sender.send(error_response("A request id must be provided for request cancellation"), flags=FINAL)
                return
        with self.lock:
            for seq in self.by_id.pop(rid, []):
                seq.cancelled = True
        with _IPC:
            sender.send(error_response("Request cancelled by client", cancelled=True), flags=FINAL)

    def _on_step(self, seq, final):
        """Engine callback after each step: poll cancellation; send a streamed or the final response."""
        h = seq.handle
        now = time.monotonic()
        if not final and now - h.last_poll >= CANCEL_POLL_S:
            h.last_poll = now
            with _IPC:
                seq.cancelled = seq.cancelled or h.request.is_cancelled()
        if not (final or h.streaming):
            return
        if final:
            with self.lock:
                same = self.by_id.get(h.request_id, [])
                if seq in same:
                    same.remove(seq)
                if not same:
                    self.by_id.pop(h.request_id, None)
        if seq.finish_reason == "error":
            response = error_response(f"Error generating request: {seq.stop_reason}")
        elif seq.finish_reason == "cancelled":
            response = error_response("Request cancelled by client", cancelled=True)
        else:
            response = build_response(self.engine.text(seq), outputs=h.outputs, finish_reason=seq.finish_reason,
                                      stop_reason=seq.stop_reason, cumulative_logprob=seq.logprob,
                                      perf=seq.perf if h.perf else None)
        with _IPC:
            h.sender.send(response, flags=FINAL if final else 0)

    def finalize(self):
        self.engine.shutdown()
