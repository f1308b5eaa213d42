"""LLM-API `tensorrt_llm` model (Triton Python backend, GPU): serves the exported Hugging Face checkpoint with
`tensorrt_llm.LLM` (TensorRT-LLM 1.2.1, PyTorch backend) behind the 1.2 `llmapi` tensor contract (llmapi_io).

`model.yaml`: every key but `triton_config` is passed to `LLM(**kwargs)` (through TensorRT-LLM's own
`update_llm_args_with_extra_dict`, as `trtllm-serve --extra_llm_api_options` does); `triton_config` sets
`decoupled` and `max_batch_size` (0: one prompt per request; the LLM batches requests in flight). Run it in the
TensorRT-LLM 1.2.1 Triton image (`nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3`); with TP/PP > 1 the LLM
spawns its own MPI workers on the GPUs this process sees (single node).

Each request runs as a task on one asyncio loop (own thread): `generate_async(prompt, SamplingParams(...),
streaming)`; streamed responses carry `CompletionOutput.text` (the text so far), the last one final. Client
cancellation is polled every 50 ms; a `stop` request aborts the requests with the same request id.
"""

import asyncio
import os
import threading

import triton_python_backend_utils as pb_utils
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

HERE = os.path.dirname(os.path.abspath(__file__))
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_POLL_S = 0.05
_IPC = threading.RLock()


def _perf(output) -> dict | None:
    """Per-request metrics of a CompletionOutput (`request_perf_metrics`), as llmapi_io's perf keys."""
    m = getattr(output, "request_perf_metrics", None)
    if not m:
        return None
    kv, t, spec = m.kv_cache_metrics, m.timing_metrics, m.speculative_decoding

    def ns(value):  # datetime.timedelta since the executor's steady-clock epoch
        return int(value.total_seconds() * 1e9) if hasattr(value, "total_seconds") else int(value)

    return {"reused_blocks": kv.num_reused_blocks, "missed_blocks": kv.num_missed_blocks,
            "alloc_new_blocks": kv.num_new_allocated_blocks, "alloc_total_blocks": kv.num_total_allocated_blocks,
            "kv_cache_hit_rate": kv.kv_cache_hit_rate, "arrival_time_ns": ns(t.arrival_time),
            "first_scheduled_time_ns": ns(t.first_scheduled_time), "first_token_time_ns": ns(t.first_token_time),
            "last_token_time_ns": ns(t.last_token_time), "acceptance_rate": spec.acceptance_rate,
            "total_accepted_draft_tokens": spec.total_accepted_draft_tokens,
            "total_draft_tokens": spec.total_draft_tokens}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return apply_triton_config(auto_complete_model_config, HERE)

    def initialize(self, args):
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

        self.SamplingParams = SamplingParams
        data = read_model_yaml(HERE)
        self.decoupled = bool(data["triton_config"]["decoupled"])
        self.max_prompt_bytes = prompt_byte_limit(data)
        self.ceilings = request_ceilings(data)
        kwargs = update_llm_args_with_extra_dict({}, {k: v for k, v in data.items() if k != "triton_config"})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.llm = LLM(**kwargs)
        self.by_id = {}  # request id -> set of running generate_async results
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
        return None

    def _send(self, sender, response, final):
        with _IPC:
            sender.send(response, flags=FINAL if final else 0)

    def _stop(self, request, sender):
        rid = request.request_id()
        if not rid:
            self._send(sender, error_response("A request id must be provided for request cancellation"), True)
            return
        with self.lock:
            for result in self.by_id.pop(rid, set()):
                result.abort()
        self._send(sender, error_response("Request cancelled by client", cancelled=True), True)

    async def _serve(self, request):
        sender = request.get_response_sender()
        rid = request.request_id()
        result = None
        try:
            if is_stop_request(request):
                self._stop(request, sender)
                return
            parsed = parse_request(request, self.max_prompt_bytes, self.ceilings)
            if parsed["streaming"] and not self.decoupled:
                raise BadRequest("Streaming is only supported in decoupled mode.")
            params = self.SamplingParams(**parsed["sampling"])
            result = self.llm.generate_async(parsed["prompt"], params, streaming=parsed["streaming"])
            if rid:
                with self.lock:
                    self.by_id.setdefault(rid, set()).add(result)
            watcher = asyncio.ensure_future(self._watch(request, result))
            output = None
            async for output in result:
                if parsed["streaming"] and not output.finished:
                    self._send(sender, self._response(output, parsed), False)
            watcher.cancel()
            if getattr(result, "aborted", False):
                self._send(sender, error_response("Request cancelled by client", cancelled=True), True)
            else:
                self._send(sender, self._response(output, parsed), True)
        except BadRequest as exc:
            self._send(sender, error_response(str(exc)), True)
        except Exception as exc:  # noqa: BLE001 - every request gets a final response
            self._send(sender, error_response(f"Error generating request: {exc}"), True)
        finally:
            if rid and result is not None:
                with self.lock:
                    self.by_id.get(rid, set()).discard(result)

    async def _watch(self, request, result):
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            with _IPC:
                cancelled = request.is_cancelled()
            if cancelled:
                result.abort()
                return

    def _response(self, output, parsed):
        out = output.outputs[0]
        perf = _perf(out) if parsed["sampling"].get("return_perf_metrics") else None
        return build_response(out.text, outputs=parsed["outputs"], finish_reason=out.finish_reason,
                              stop_reason=out.stop_reason, cumulative_logprob=out.cumulative_logprob, perf=perf)

    def finalize(self):
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
