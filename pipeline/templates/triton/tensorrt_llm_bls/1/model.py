"""tensorrt_llm_bls (Triton Python backend, BLS): draft-target speculative decoding.

Per request (batch 1): preprocessing -> loop { the draft model proposes K tokens greedily (non-streaming); the
target model gets `draft_input_ids` with request_output_len = K + 1 and returns the longest prefix of the draft it
agrees with plus one token of its own } until max_tokens, end_id or a stop word -> postprocessing. With greedy
settings the output is exactly the target's own greedy output; only the number of target calls changes.
Without `num_draft_tokens` (and no default) it is a plain non-streaming pipeline through the target.

Outputs `acceptance_rate`, `total_accepted_draft_tokens`, `total_draft_tokens` for the whole request. Every call
sends `streaming=false` and `exclude_input_in_output=true` explicitly, and uses `exec(decoupled=True)`, which works
whether or not the target is decoupled (the ensemble route may keep a streaming target). Upstream limits kept:
batch 1, no streaming on this route, no draft logits (`use_draft_logits` is rejected).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value == "" else value


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request, name, default=None):
    arr = _input(request, name)
    return default if arr is None or arr.size == 0 else arr.reshape(-1)[0].item()


# Request inputs forwarded to the LLM models: BLS/ensemble name -> tensorrt_llm name, dtype.
_SAMPLING = {
    "top_k": ("runtime_top_k", np.int32),
    "top_p": ("runtime_top_p", np.float32),
    "temperature": ("temperature", np.float32),
    "length_penalty": ("len_penalty", np.float32),
    "repetition_penalty": ("repetition_penalty", np.float32),
    "presence_penalty": ("presence_penalty", np.float32),
    "frequency_penalty": ("frequency_penalty", np.float32),
    "seed": ("seed", np.uint64),
}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.target = _param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft = _param(config, "tensorrt_llm_draft_model_name", "")
        self.default_k = int(_param(config, "default_num_draft_tokens", "0"))

    # ------------------------------------------------------------------------------------------- model calls
    def _call(self, model, tensors, outputs):
        request = pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=outputs)
        result = {}
        for response in request.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
            for tensor in response.output_tensors():
                result[tensor.name()] = tensor.as_numpy()
        return result

    def _llm(self, model, ids, out_len, pre, sampling, draft=None, min_tokens=None):
        tensors = [
            pb_utils.Tensor("input_ids", np.array([ids], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("request_output_len", np.array([[out_len]], dtype=np.int32)),
            pb_utils.Tensor("end_id", pre["OUT_END_ID"].astype(np.int32).reshape(1, 1)),
            pb_utils.Tensor("pad_id", pre["OUT_PAD_ID"].astype(np.int32).reshape(1, 1)),
            pb_utils.Tensor("stop_words_list", pre["STOP_WORDS_IDS"].astype(np.int32)),
            pb_utils.Tensor("bad_words_list", pre["BAD_WORDS_IDS"].astype(np.int32)),
            pb_utils.Tensor("streaming", np.array([[False]])),
            pb_utils.Tensor("exclude_input_in_output", np.array([[True]])),
            pb_utils.Tensor("return_perf_metrics", np.array([[True]])),
        ]
        tensors += [pb_utils.Tensor(name, value) for name, value in sampling.items()]
        if draft:
            tensors.append(pb_utils.Tensor("draft_input_ids", np.array([draft], dtype=np.int32)))
        if min_tokens:
            tensors.append(pb_utils.Tensor("min_tokens", np.array([[min_tokens]], dtype=np.int32)))
        res = self._call(model, tensors, ["output_ids", "sequence_length", "kv_cache_reused_blocks"])
        n = int(res["sequence_length"].reshape(-1)[0])
        return [int(t) for t in res["output_ids"].reshape(-1)[:n]], res

    # ------------------------------------------------------------------------------------------- decoding
    def _decode(self, request):
        text = _input(request, "text_input")
        if text is None or text.shape[0] != 1:
            raise ValueError("tensorrt_llm_bls serves batch size 1 only (speculative decoding limit)")
        if _scalar(request, "stream", False):
            raise ValueError("streaming is not supported on the draft-target route; use the ensemble")
        if _scalar(request, "use_draft_logits", False):
            raise ValueError("use_draft_logits is not supported; token-level draft acceptance only")
        max_tokens = int(_scalar(request, "max_tokens", 0))
        if max_tokens <= 0:
            raise ValueError("max_tokens must be a single value > 0")
        k = int(_scalar(request, "num_draft_tokens", self.default_k) or 0)
        if k > 0 and not self.draft:
            raise ValueError("num_draft_tokens given but this repository has no draft model")
        pre_inputs = [pb_utils.Tensor("QUERY", text.reshape(1, 1)),
                      pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.array([[max_tokens]], dtype=np.int32))]
        for src, dst in (("bad_words", "BAD_WORDS_DICT"), ("stop_words", "STOP_WORDS_DICT"),
                         ("end_id", "END_ID"), ("pad_id", "PAD_ID")):
            arr = _input(request, src)
            if arr is not None:
                pre_inputs.append(pb_utils.Tensor(dst, arr))
        pre = self._call("preprocessing", pre_inputs,
                         ["INPUT_ID", "REQUEST_INPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS", "OUT_END_ID",
                          "OUT_PAD_ID"])
        prompt = [int(t) for t in pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])]]
        sampling = {}
        for src, (dst, dtype) in _SAMPLING.items():
            arr = _input(request, src)
            if arr is not None:
                sampling[dst] = arr.astype(dtype).reshape(1, 1)
        end_id = int(pre["OUT_END_ID"].reshape(-1)[0])
        stop_words = self._words(pre["STOP_WORDS_IDS"])
        generated, proposed, accepted, target_calls = [], 0, 0, 0
        while len(generated) < max_tokens:
            ctx = prompt + generated
            n_draft = min(k, max_tokens - len(generated) - 1)
            draft = []
            if n_draft > 0:
                draft, _ = self._llm(self.draft, ctx, n_draft, pre, {}, min_tokens=n_draft)
            new, _ = self._llm(self.target, ctx, len(draft) + 1, pre, sampling, draft=draft)
            target_calls += 1
            proposed += len(draft)
            agree = 0
            while agree < min(len(draft), len(new)) and new[agree] == draft[agree]:
                agree += 1
            accepted += agree
            ended = len(new) <= agree  # the target gave no token of its own: it produced end_id
            if end_id in new:
                new, ended = new[: new.index(end_id)], True
            generated += new[: max_tokens - len(generated)]
            if ended or any(generated[-len(w):] == w for w in stop_words if len(w) <= len(generated)):
                break
        post = self._call(
            "postprocessing",
            [pb_utils.Tensor("TOKENS_BATCH", np.array([[generated]], dtype=np.int32).reshape(1, 1, -1)),
             pb_utils.Tensor("SEQUENCE_LENGTH", np.array([[len(generated)]], dtype=np.int32))],
            ["OUTPUT"],
        )
        rate = accepted / proposed if proposed else 0.0
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", post["OUTPUT"].reshape(1, -1)),
            pb_utils.Tensor("acceptance_rate", np.array([[rate]], dtype=np.float32)),
            pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], dtype=np.int32)),
            pb_utils.Tensor("total_draft_tokens", np.array([[proposed]], dtype=np.int32)),
            pb_utils.Tensor("batch_index", np.zeros((1, 1), dtype=np.int32)),
            pb_utils.Tensor("sequence_index", np.zeros((1, 1), dtype=np.int32)),
        ])

    @staticmethod
    def _words(arr):
        arr = arr.reshape(-1, 2, arr.shape[-1])[0]
        ids, offsets = arr[0].tolist(), [o for o in arr[1].tolist() if o >= 0]
        words, start = [], 0
        for end in offsets:
            if end > start:
                words.append(ids[start:end])
            start = end
        return words

    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        responses = []
        for request in requests:
            try:
                response = self._decode(request)
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {exc}"))
            if self.decoupled:
                request.get_response_sender().send(response, flags=final)
            else:
                responses.append(response)
        return None if self.decoupled else responses
