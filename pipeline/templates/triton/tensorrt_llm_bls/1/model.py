"""tensorrt_llm_bls (Triton Python backend, BLS): text in, text out through preprocessing -> tensorrt_llm
(+ tensorrt_llm_draft) -> postprocessing, per the 1.2.1 tensor contract. Batch 1 per request.

Routes:
- Draft-target speculation when `num_draft_tokens` > 0 (default: the `default_num_draft_tokens` parameter when a
  draft model is configured): loop { the draft proposes K tokens greedily; the target verifies them with
  `draft_input_ids` and `request_output_len` K + 1 and returns the longest prefix it agrees with plus one token of
  its own } until max_tokens, end_id or a stop word. With greedy settings the text equals the target's own greedy
  text. Outputs `acceptance_rate`, `total_accepted_draft_tokens`, `total_draft_tokens` for the whole request (zeros
  on the other routes); log probs, generation logits, token counts and perf metrics when asked (perf block counts
  summed over the target calls). Not with streaming, context logits, num_return_sequences > 1, beam search or draft
  logits.
- Otherwise one target call with every option forwarded: streamed (one response per target response, the new tokens'
  text, or all text so far with `accumulate_tokens`) when `stream` is true — this model and the target must then
  be decoupled — else one response; `num_return_sequences` sequences come back as that many texts (one response
  per sequence when this model is decoupled, else one response holding them all).
Models whose config says they are not decoupled (preprocessing, postprocessing, the draft, a unary target) are
called with a unary `exec()`; a decoupled target with `exec(decoupled=True)`, read to its final response. Empty
word lists ([1, 2, 0]) and an empty embedding bias ([1, 0]) from preprocessing count as absent. The target's
limits (max_input_len, max_seq_len, max_beam_width, max batch size) are checked up front with request_limits.py
(the ceilings shared with preprocessing and tensorrt_llm: finite sampling values, num_return_sequences, beam_width,
max_tokens, embedding_bias_weights); before anything is tokenized, a text_input over
max_input_len x BYTES_PER_TOKEN bytes (DEFAULT_MAX_INPUT_BYTES when the limit is unknown) is refused. Inputs that
need another build (images, video, decoder text, prompt tables, LoRA, guided decoding) get a per-request error, as do requests without text_input or a positive
max_tokens. A streamed request the client cancels stops the target (a `stop` request with the same id) and ends with
an error response.

Concurrency and the speculation gate: `execute()` hands each request to a thread pool and returns; every response
goes through the request's response sender (one final response when this model is not decoupled), so several
requests are in flight at once. A draft-target request (num_draft_tokens > 0) takes the draft path only while the
number of in-flight draft-target requests, itself included, is <= `max_batch_for_speculation` (empty: no cap);
above it, it is served target-only from the start (one target call; greedy output identical), answering
`total_draft_tokens` 0. The decision is made once, when the request starts. Triton's metrics endpoint shows
`nv_trt_llm_speculation_requests` (counter, `speculation_decision` = speculative | target_only),
`nv_trt_llm_speculation_draft_tokens` (counter, `draft_token_type` = proposed | accepted) and
`nv_trt_llm_speculation_state` (gauge, `speculation_state_type` = in_flight | max_batch_for_speculation), each
with `model` and `version` labels.
"""

import json
import os
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from request_limits import Limits, RequestError, check_bias, check_ceilings, check_sampling

# Every exchange with the server (BLS exec and its responses, response senders, custom metrics) goes through this
# lock: Triton 2.51's Python backend crashes the server (boost::interprocess::lock_exception in libtriton_python.so)
# when pool threads of one non-decoupled model do them concurrently (reproduced: 16 concurrent BLS requests).
_IPC = threading.RLock()

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

# BLS inputs that need a build feature this repository does not have: input -> feature.
UNSUPPORTED = {
    "decoder_text_input": "an encoder-decoder build",
    "image_input": "a multimodal build", "image_bytes_input": "a multimodal build",
    "image_url_input": "a multimodal build", "video_bytes_input": "a multimodal build",
    "prompt_embedding_table": "prompt tuning", "prompt_vocab_size": "prompt tuning",
    "lora_task_id": "LoRA", "lora_weights": "LoRA", "lora_config": "LoRA",
    "guided_decoding_guide_type": "guided decoding", "guided_decoding_guide": "guided decoding",
}

BYTES_PER_TOKEN = 32  # generous: text averages about 4 bytes per token
DEFAULT_MAX_INPUT_BYTES = 4 << 20

# Request inputs forwarded to tensorrt_llm: BLS name -> (tensorrt_llm name, dtype). min_tokens, stream and
# exclude_input_in_output are set per call.
FORWARDED = {
    "top_k": ("runtime_top_k", np.int32),
    "top_p": ("runtime_top_p", np.float32),
    "temperature": ("temperature", np.float32),
    "length_penalty": ("len_penalty", np.float32),
    "repetition_penalty": ("repetition_penalty", np.float32),
    "presence_penalty": ("presence_penalty", np.float32),
    "frequency_penalty": ("frequency_penalty", np.float32),
    "seed": ("seed", np.uint64),
    "beam_width": ("beam_width", np.int32),
    "num_return_sequences": ("num_return_sequences", np.int32),
    "return_log_probs": ("return_log_probs", np.bool_),
    "return_context_logits": ("return_context_logits", np.bool_),
    "return_generation_logits": ("return_generation_logits", np.bool_),
    "return_perf_metrics": ("return_perf_metrics", np.bool_),
    "return_num_input_tokens": ("return_num_input_tokens", np.bool_),
    "return_num_output_tokens": ("return_num_output_tokens", np.bool_),
}

# Preprocessing inputs: BLS name -> preprocessing name.
PREPROCESSING_INPUTS = {
    "text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT", "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS", "end_id": "END_ID", "pad_id": "PAD_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
}
PREPROCESSING_OUTPUTS = ["INPUT_ID", "REQUEST_INPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS", "EMBEDDING_BIAS",
                         "OUT_END_ID", "OUT_PAD_ID", "OUT_PROMPT_TABLE_EXTRA_IDS"]

# tensorrt_llm outputs this model passes on unchanged (text_output is made from output_ids).
PASSED_ON = ["cum_log_probs", "output_log_probs", "context_logits", "generation_logits", "batch_index",
             "sequence_index", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
             "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
             "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_input_tokens",
             "num_output_tokens"]
LLM_OUTPUTS = ["output_ids", "sequence_length"] + PASSED_ON
BLOCK_COUNTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")


class Cancelled(Exception):
    """The client cancelled the request."""


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if value == "" or value.startswith("${") else value


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _present(arr):
    """A non-empty tensor; all-empty strings count as absent."""
    if arr is None or arr.size == 0:
        return False
    if arr.dtype == np.object_:
        return any(len(v) for v in arr.reshape(-1))
    return True


def _scalar(arr, default=None):
    return default if arr is None or arr.size == 0 else arr.reshape(-1)[0].item()


_END = object()


def _locked(start):
    """Start a decoupled BLS call and read its responses, each step under `_IPC`."""
    with _IPC:
        responses = iter(start())
    while True:
        with _IPC:
            item = next(responses, _END)
        if item is _END:
            return
        yield item


def _column(value, dtype):
    """A per-request scalar as the [1, 1] tensor tensorrt_llm expects."""
    return np.array(value, dtype=dtype).reshape(1, 1)


def word_list(arr):
    """TensorRT-LLM word list [1, 2, n] (flat ids; end offsets padded with -1) -> token sequences; n = 0 -> []."""
    if arr is None or arr.size == 0:
        return []
    arr = arr.reshape(2, -1)
    ids, offsets = arr[0].tolist(), [int(o) for o in arr[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


def _config_text(repo_dir, model):
    try:
        with open(os.path.join(repo_dir, model, "config.pbtxt")) as f:
            return f.read()
    except OSError:
        return None


def is_decoupled(repo_dir, model):
    """Whether `model` of this repository is decoupled (True when its config cannot be read: a decoupled call
    works with both kinds)."""
    found = re.search(r"model_transaction_policy\s*\{\s*decoupled\s*:\s*(\w+)", _config_text(repo_dir, model) or "")
    return True if found is None else found.group(1).lower() == "true"


def target_limits(repo_dir, model):
    """The build's Limits of `model`: the reference backend's parameters (max_input_len, max_seq_len,
    max_beam_width) and max_batch_size, else its engine's config.json (`build_config`, the vocab of
    `pretrained_config`); every limit None when neither is readable."""
    text = _config_text(repo_dir, model)
    if text is None:
        return Limits()
    params = dict(re.findall(r'key:\s*"(\w+)"\s*value\s*:?\s*\{\s*string_value:\s*"([^"]*)"', text))
    batch = re.search(r"^\s*max_batch_size\s*:\s*(\d+)", text, re.MULTILINE)
    known = {key: int(params[key]) for key in ("max_input_len", "max_seq_len", "max_beam_width")
             if params.get(key, "").isdigit()}
    known["max_batch_size"] = int(batch.group(1)) if batch else None
    if "max_input_len" in known and "max_seq_len" in known:
        return Limits(**known)
    try:
        with open(os.path.join(repo_dir, model, params.get("gpt_model_path", ""), "config.json")) as f:
            engine = json.load(f)
        build = engine["build_config"]
        return Limits(max_input_len=int(build["max_input_len"]), max_seq_len=int(build["max_seq_len"]),
                      max_batch_size=int(build.get("max_batch_size") or 0) or known["max_batch_size"],
                      max_beam_width=int(build.get("max_beam_width") or 1),
                      vocab_size=int(engine.get("pretrained_config", {}).get("vocab_size") or 0) or None)
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return Limits(max_batch_size=known["max_batch_size"], max_beam_width=known.get("max_beam_width"))


def stop_position(tokens, start, stop_words):
    """Length of `tokens` up to the first stop word that ends at index >= `start`, else None."""
    for end in range(start + 1, len(tokens) + 1):
        if any(len(w) <= end and tokens[end - len(w):end] == w for w in stop_words):
            return end
    return None


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.accumulate = _param(config, "accumulate_tokens", "false").strip().lower() in ("true", "1", "t", "yes")
        self.target = _param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft = _param(config, "tensorrt_llm_draft_model_name", "")
        default_k = _param(config, "default_num_draft_tokens", "0")
        try:
            self.default_k = int(default_k) if self.draft else 0
        except ValueError:
            raise pb_utils.TritonModelException(
                f"tensorrt_llm_bls: default_num_draft_tokens must be an integer, got {default_k!r}") from None
        repo_dir = os.path.dirname(args["model_repository"])
        self.limits = target_limits(repo_dir, self.target)
        self.max_input_len, self.max_seq_len = self.limits.max_input_len, self.limits.max_seq_len
        self.decoupled_models = {m: is_decoupled(repo_dir, m) for m in (self.target, self.draft) if m}
        cap = _param(config, "max_batch_for_speculation", "")
        try:
            self.spec_cap = int(cap) if cap else None
        except ValueError:
            raise pb_utils.TritonModelException(
                f"tensorrt_llm_bls: max_batch_for_speculation must be an integer, got {cap!r}") from None
        if self.spec_cap is not None and self.spec_cap < 0:
            raise pb_utils.TritonModelException(
                f"tensorrt_llm_bls: max_batch_for_speculation must be >= 0, got {self.spec_cap}")
        self.spec_lock = threading.Lock()
        self.spec_in_flight = 0
        self.metrics = SpeculationMetrics(config["name"], args.get("model_version", "1"), self.spec_cap)
        workers = max(8, 2 * int(config.get("max_batch_size", 0) or 0))
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bls")

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.metrics.close()

    # ------------------------------------------------------------------------------------------ model calls
    @staticmethod
    def _unary(model, tensors, outputs):
        with _IPC:
            response = pb_utils.InferenceRequest(model_name=model, inputs=tensors,
                                                 requested_output_names=outputs).exec()
        if response.has_error():
            raise RequestError(f"{model}: {response.error().message()}")
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _stream(self, model, tensors, request_id, parent=None):
        """Yield each response of `model` as a dict: one unary call when `model` is not decoupled, else
        exec(decoupled=True) read to the final response.

        When the client cancels `parent` during a decoupled call, a `stop` request with the same id ends the
        generation early; the remaining responses are drained, then Cancelled is raised.
        """
        request = pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=LLM_OUTPUTS,
                                            request_id=request_id)
        if not self.decoupled_models.get(model, True):
            with _IPC:
                response = request.exec()
            if response.has_error():
                raise RequestError(f"{model}: {response.error().message()}")
            outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if "output_ids" in outputs:
                yield outputs
            return
        cancelled = False
        error = None
        for response in _locked(lambda: request.exec(decoupled=True)):
            if response.has_error():
                error = error or f"{model}: {response.error().message()}"
                continue
            if not cancelled and parent is not None and parent.is_cancelled():
                cancelled = True
                self._stop(model, request_id)
            outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if error is None and not cancelled and "output_ids" in outputs:
                yield outputs
        if error is not None:
            raise RequestError(error)
        if cancelled:
            raise Cancelled()

    @staticmethod
    def _stop(model, request_id):
        """Ask `model` to stop the generation of `request_id` (the tensorrtllm backend's `stop` input)."""
        tensors = [pb_utils.Tensor("input_ids", np.zeros((1, 1), dtype=np.int32)),
                   pb_utils.Tensor("input_lengths", np.ones((1, 1), dtype=np.int32)),
                   pb_utils.Tensor("request_output_len", np.ones((1, 1), dtype=np.int32)),
                   pb_utils.Tensor("stop", np.ones((1, 1), dtype=np.bool_))]
        stop = pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=[],
                                         request_id=request_id)
        for _ in _locked(lambda: stop.exec(decoupled=True)):
            pass

    def _generate(self, model, ids, out_len, base, request_id, parent, **options):
        """One tensorrt_llm call on prompt `ids`; yields response dicts."""
        tensors = dict(base)
        tensors["input_ids"] = np.array([ids], dtype=np.int32)
        tensors["input_lengths"] = _column(len(ids), np.int32)
        tensors["request_output_len"] = _column(out_len, np.int32)
        for name, value in options.items():
            if value is not None:
                tensors[name] = value
        return self._stream(model, [pb_utils.Tensor(k, v) for k, v in tensors.items()], request_id, parent)

    def _postprocess(self, tokens, lengths):
        out = self._unary("postprocessing",
                          [pb_utils.Tensor("TOKENS_BATCH", tokens.astype(np.int32)),
                           pb_utils.Tensor("SEQUENCE_LENGTH", lengths.astype(np.int32))], ["OUTPUT"])
        return out["OUTPUT"].reshape(-1)

    # ------------------------------------------------------------------------------------------ request parsing
    def _parse(self, request):
        text = _input(request, "text_input")
        if text is None or text.size == 0:
            raise RequestError("text_input is required")
        if text.shape[0] != 1:
            raise RequestError(f"tensorrt_llm_bls serves batch size 1 per request, got {text.shape[0]}; "
                               "send one request per prompt")
        self._check_bytes(text)
        max_tokens = _scalar(_input(request, "max_tokens"))
        if max_tokens is None or int(max_tokens) <= 0:
            raise RequestError("max_tokens is required and must be a single value > 0")
        for name, feature in UNSUPPORTED.items():
            if _present(_input(request, name)):
                raise RequestError(f"{name} needs {feature}; this repository serves a text-only model without it")
        if _scalar(_input(request, "use_draft_logits"), False):
            raise RequestError("use_draft_logits is not supported: draft tokens are accepted by token match; "
                               "send use_draft_logits false")
        sent_k = _scalar(_input(request, "num_draft_tokens"))
        k = self.default_k if sent_k is None else int(sent_k)
        if k > 0 and not self.draft:
            raise RequestError("num_draft_tokens > 0 needs a draft model; this repository has none (send 0)")
        opts = {
            "max_tokens": int(max_tokens),
            "k": max(0, k),
            "stream": bool(_scalar(_input(request, "stream"), False)),
            "exclude": bool(_scalar(_input(request, "exclude_input_in_output"), False)),
            "min_tokens": int(_scalar(_input(request, "min_tokens"), 0) or 0),
            "sampling": {dst: _column(_scalar(_input(request, src)), dtype)
                         for src, (dst, dtype) in FORWARDED.items() if _input(request, src) is not None},
        }
        flags = {name: bool(_scalar(_input(request, name), False)) for name in FORWARDED if name.startswith("return_")}
        opts.update(flags)
        check_sampling({dst: _scalar(_input(request, src)) for src, (dst, dtype) in FORWARDED.items()
                        if dtype is np.float32 or dst in ("beam_width", "num_return_sequences", "runtime_top_k")})
        check_sampling({"min_tokens": opts["min_tokens"]})
        weights = _input(request, "embedding_bias_weights")
        if weights is not None:
            check_bias("embedding_bias_weights", weights.reshape(-1).tolist(), self.limits)
        opts["n"] = int(_scalar(_input(request, "num_return_sequences"), 1) or 1)
        opts["beam"] = int(_scalar(_input(request, "beam_width"), 1) or 1)
        check_ceilings(self.limits, beam_width=opts["beam"], num_return_sequences=opts["n"],
                       request_output_len=opts["max_tokens"], min_tokens=opts["min_tokens"],
                       logits=opts["return_generation_logits"] or opts["return_context_logits"])
        self._check_route(opts)
        return opts

    def _check_bytes(self, text):
        cap = self.max_input_len * BYTES_PER_TOKEN if self.max_input_len else DEFAULT_MAX_INPUT_BYTES
        size = sum(len(v) if isinstance(v, bytes) else len(str(v).encode("utf-8")) for v in text.reshape(-1))
        if size > cap:
            basis = (f"max_input_len {self.max_input_len} x {BYTES_PER_TOKEN} bytes per token" if self.max_input_len
                     else "the default cap")
            raise RequestError(f"text_input is {size} bytes, over the limit of {cap} bytes ({basis}); shorten it")

    def _check_route(self, opts):
        if opts["k"] > 0:
            if opts["stream"]:
                raise RequestError("streaming is not supported on the draft-target route (num_draft_tokens > 0); "
                                   "send num_draft_tokens 0 to a decoupled BLS, or stream through the ensemble")
            unsupported = [name for name, bad in (("return_context_logits", opts["return_context_logits"]),
                                                  ("num_return_sequences > 1", opts["n"] > 1),
                                                  ("beam_width > 1", opts["beam"] > 1)) if bad]
            if unsupported:
                raise RequestError(f"{', '.join(unsupported)} is not supported with draft-target speculation; "
                                   "send num_draft_tokens 0")
        elif opts["stream"] and not self.decoupled:
            raise RequestError("stream=true needs a decoupled tensorrt_llm_bls and tensorrt_llm; this BLS is not "
                               "decoupled: send stream false, or stream through the ensemble")

    def _preprocess(self, request):
        tensors = []
        for src, dst in PREPROCESSING_INPUTS.items():
            arr = _input(request, src)
            if arr is not None:
                tensors.append(pb_utils.Tensor(dst, arr.reshape(1, -1) if src == "max_tokens" else arr))
        pre = self._unary("preprocessing", tensors, PREPROCESSING_OUTPUTS)
        prompt = [int(t) for t in pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])]]
        base = {"end_id": pre["OUT_END_ID"].astype(np.int32).reshape(1, 1),
                "pad_id": pre["OUT_PAD_ID"].astype(np.int32).reshape(1, 1)}
        for src, dst in (("BAD_WORDS_IDS", "bad_words_list"), ("STOP_WORDS_IDS", "stop_words_list")):
            if pre.get(src) is not None and pre[src].size:
                base[dst] = pre[src].astype(np.int32).reshape(1, 2, -1)
        if pre.get("EMBEDDING_BIAS") is not None and pre["EMBEDDING_BIAS"].size:
            base["embedding_bias"] = pre["EMBEDDING_BIAS"].astype(np.float32).reshape(1, -1)
        if pre.get("OUT_PROMPT_TABLE_EXTRA_IDS") is not None and pre["OUT_PROMPT_TABLE_EXTRA_IDS"].size:
            base["prompt_table_extra_ids"] = pre["OUT_PROMPT_TABLE_EXTRA_IDS"].astype(np.uint64).reshape(1, -1)
        stop_words = word_list(pre.get("STOP_WORDS_IDS"))
        return prompt, base, stop_words

    # ------------------------------------------------------------------------------------------ routes
    def _respond(self, outputs, text):
        outputs = dict(outputs)
        for name, dtype in (("acceptance_rate", np.float32), ("total_accepted_draft_tokens", np.int32),
                            ("total_draft_tokens", np.int32)):  # a request without draft tokens: zeros
            if outputs.get(name) is None:
                outputs[name] = np.zeros((1, 1), dtype=dtype)
        tensors = [pb_utils.Tensor("text_output", text)]
        tensors += [pb_utils.Tensor(name, outputs[name]) for name in PASSED_ON if outputs.get(name) is not None]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _text(self, outputs):
        tokens = outputs["output_ids"]
        tokens = tokens.reshape(1, -1, tokens.shape[-1]) if tokens.ndim < 3 else tokens
        return self._postprocess(tokens, outputs["sequence_length"].reshape(1, tokens.shape[1]))

    def _direct(self, request, opts, prompt, base, send):
        """One target call with every option; streams when asked (decoupled only)."""
        options = {"streaming": _column(opts["stream"], np.bool_),
                   "exclude_input_in_output": _column(opts["exclude"], np.bool_),
                   "min_tokens": _column(opts["min_tokens"], np.int32) if opts["min_tokens"] else None}
        options.update(opts["sampling"])
        responses = self._generate(self.target, prompt, opts["max_tokens"], base, uuid.uuid4().hex, request,
                                   **options)
        if opts["stream"] or self.decoupled:
            self._send_each(responses, opts, send)
            return
        send(self._respond(*self._merge(list(responses))), True)

    def _send_each(self, responses, opts, send):
        """One BLS response per target response (stream chunks, or one per returned sequence)."""
        seen = {}
        pending = None
        for outputs in responses:
            if pending is not None:
                send(pending, False)
            if opts["stream"] and self.accumulate:
                seq = int(_scalar(outputs.get("sequence_index"), 0))
                length = int(_scalar(outputs["sequence_length"], 0))
                new = outputs["output_ids"].reshape(-1)[:length]
                seen[seq] = np.concatenate([seen.get(seq, np.empty(0, np.int32)), new])
                outputs = dict(outputs, output_ids=seen[seq].reshape(1, 1, -1),
                               sequence_length=np.array([[seen[seq].size]], dtype=np.int32))
            pending = self._respond(outputs, self._text(outputs))
        if pending is None:
            raise RequestError(f"{self.target} returned no output")
        send(pending, True)

    def _merge(self, responses):
        """Several target responses (one per returned sequence) -> one: sequences side by side on the beam axis."""
        if not responses:
            raise RequestError(f"{self.target} returned no output")
        if len(responses) == 1:
            return responses[0], self._text(responses[0])
        responses.sort(key=lambda r: int(_scalar(r.get("sequence_index"), 0)))
        merged = dict(responses[0])
        merged["output_ids"] = _stack([r["output_ids"].reshape(1, -1, r["output_ids"].shape[-1]) for r in responses])
        merged["sequence_length"] = np.concatenate([r["sequence_length"].reshape(1, -1) for r in responses], axis=1)
        for name, ndim in (("cum_log_probs", 2), ("output_log_probs", 3), ("generation_logits", 4)):
            if all(r.get(name) is not None for r in responses):
                merged[name] = _stack([r[name].reshape((1, -1) + r[name].shape[2:] if ndim > 2 else (1, -1))
                                       for r in responses])
        if "num_output_tokens" in merged:
            merged["num_output_tokens"] = np.array([[sum(int(_scalar(r.get("num_output_tokens"), 0))
                                                         for r in responses)]], dtype=np.int32)
        merged["sequence_index"] = np.zeros((1, 1), dtype=np.int32)
        return merged, self._text(merged)

    def _speculate(self, request, opts, prompt, base, stop_words, send):
        """Draft-target loop; one response for the whole request."""
        arrival = time.time_ns()
        request_id = uuid.uuid4().hex
        end_id = int(base["end_id"].reshape(-1)[0])
        generated, logprobs, gen_logits, calls = [], [], [], []
        proposed = accepted = 0
        max_tokens, k = opts["max_tokens"], opts["k"]
        while len(generated) < max_tokens:
            if request.is_cancelled():
                raise Cancelled()
            ctx = prompt + generated
            n_draft = min(k, max_tokens - len(generated) - 1)
            draft = []
            if n_draft > 0:
                d = _last(self._generate(self.draft, ctx, n_draft, base, request_id + "-d", request,
                                         streaming=_column(False, np.bool_),
                                         exclude_input_in_output=_column(True, np.bool_),
                                         min_tokens=_column(n_draft, np.int32)), self.draft)
                draft = [int(t) for t in d["output_ids"].reshape(-1)[: int(_scalar(d["sequence_length"], 0))]]
            options = {"streaming": _column(False, np.bool_), "exclude_input_in_output": _column(True, np.bool_),
                       "draft_input_ids": np.array([draft], dtype=np.int32) if draft else None}
            left = opts["min_tokens"] - len(generated)
            if left > 0:
                options["min_tokens"] = _column(min(left, len(draft) + 1), np.int32)
            options.update({name: value for name, value in opts["sampling"].items()
                            if name not in ("num_return_sequences", "beam_width", "return_context_logits")})
            t = _last(self._generate(self.target, ctx, len(draft) + 1, base, request_id, request, **options),
                      self.target)
            calls.append(t)
            new = [int(x) for x in t["output_ids"].reshape(-1)[: int(_scalar(t["sequence_length"], 0))]]
            agree = 0
            while agree < min(len(draft), len(new)) and new[agree] == draft[agree]:
                agree += 1
            proposed, accepted = proposed + len(draft), accepted + agree
            ended = len(new) <= agree  # the target ended (end_id or a stop word) before a token of its own
            if end_id in new:
                new, ended = new[: new.index(end_id)], True
            keep = min(len(new), max_tokens - len(generated))
            stop = stop_position(generated + new[:keep], len(generated), stop_words)
            if stop is not None:
                keep, ended = stop - len(generated), True
            if opts["return_log_probs"] and t.get("output_log_probs") is not None:
                logprobs += t["output_log_probs"].reshape(-1)[:keep].tolist()
            if opts["return_generation_logits"] and t.get("generation_logits") is not None:
                logits = t["generation_logits"]
                gen_logits.append(logits.reshape(-1, logits.shape[-1])[:keep])
            generated += new[:keep]
            if ended:
                break
        tokens = generated if opts["exclude"] else prompt + generated
        text = self._postprocess(np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
                                 np.array([[len(tokens)]], dtype=np.int32))
        outputs = {
            "batch_index": np.zeros((1, 1), dtype=np.int32),
            "sequence_index": np.zeros((1, 1), dtype=np.int32),
            "acceptance_rate": np.array([[accepted / proposed if proposed else 0.0]], dtype=np.float32),
            "total_accepted_draft_tokens": np.array([[accepted]], dtype=np.int32),
            "total_draft_tokens": np.array([[proposed]], dtype=np.int32),
        }
        if opts["return_log_probs"]:
            outputs["output_log_probs"] = np.array(logprobs, dtype=np.float32).reshape(1, 1, -1)
            outputs["cum_log_probs"] = np.array([[sum(logprobs)]], dtype=np.float32)
        if opts["return_generation_logits"] and gen_logits:
            outputs["generation_logits"] = np.concatenate(gen_logits)[None, None].astype(np.float32)
        if opts["return_num_input_tokens"]:
            outputs["num_input_tokens"] = np.array([[len(prompt)]], dtype=np.int32)
        if opts["return_num_output_tokens"]:
            outputs["num_output_tokens"] = np.array([[len(generated)]], dtype=np.int32)
        if opts["return_perf_metrics"]:
            outputs.update(_perf(calls, arrival))
        self.metrics.draft_tokens(proposed, accepted)
        send(self._respond(outputs, text), True)

    # ------------------------------------------------------------------------------------------ execute
    def _check_limits(self, prompt, max_tokens):
        """The target's limits, checked up front (a draft-target loop only reaches them token by token)."""
        if self.max_input_len is not None and len(prompt) > self.max_input_len:
            raise RequestError(f"prompt length ({len(prompt)}) exceeds maximum input length ({self.max_input_len})")
        if self.max_seq_len is not None and len(prompt) + max_tokens > self.max_seq_len:
            raise RequestError(f"prompt length + max_tokens ({len(prompt)} + {max_tokens}) exceeds maximum "
                               f"sequence length ({self.max_seq_len})")

    def _serve(self, request, send):
        opts = self._parse(request)
        prompt, base, stop_words = self._preprocess(request)
        self._check_limits(prompt, opts["max_tokens"])
        if opts["k"] <= 0:
            self._direct(request, opts, prompt, base, send)
            return
        with self.spec_lock:
            self.spec_in_flight += 1
            speculate = self.spec_cap is None or self.spec_in_flight <= self.spec_cap
            self.metrics.in_flight(self.spec_in_flight)
        self.metrics.decision(speculate)
        try:
            if speculate:
                self._speculate(request, opts, prompt, base, stop_words, send)
            else:  # over the cap: target-only (the route's checks already passed: unary, one sequence, beam 1)
                self._direct(request, opts, prompt, base, send)
        finally:
            with self.spec_lock:
                self.spec_in_flight -= 1
                self.metrics.in_flight(self.spec_in_flight)

    def execute(self, requests):
        """Hand each request to the thread pool; its responses go through its response sender."""
        for request in requests:
            self.pool.submit(self._run, request, request.get_response_sender())
        return None

    def _run(self, request, sender):
        """Serve one request on a pool thread: its responses, or one error response, end with the final flag."""
        done = []

        def send(response, final):
            if done:
                return
            if final:
                done.append(True)
            elif not self.decoupled:  # a unary model sends exactly one response: the final one
                return
            with _IPC:
                sender.send(response, flags=FINAL if final else 0)

        try:
            self._serve(request, send)
        except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
            message = "request cancelled by the client" if isinstance(exc, Cancelled) else str(exc)
            if not isinstance(exc, (RequestError, Cancelled)):
                message = f"{type(exc).__name__}: {exc}"
            message = " ".join(message.split())  # one line
            try:
                send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {message}")), True)
            except Exception as send_exc:  # noqa: BLE001 (a cancelled client rejects late responses)
                pb_utils.Logger.log_warn(f"tensorrt_llm_bls: error response not delivered ({send_exc})")


class SpeculationMetrics:
    """The speculation gate on Triton's metrics endpoint (custom metrics of the Python backend); a no-op where
    the backend cannot create metric families."""

    def __init__(self, model, version, cap):
        labels = {"model": model, "version": str(version)}
        self.families = []
        try:
            requests = pb_utils.MetricFamily(name="nv_trt_llm_speculation_requests",
                                             description="draft-target requests by the speculation gate's decision",
                                             kind=pb_utils.MetricFamily.COUNTER)
            tokens = pb_utils.MetricFamily(name="nv_trt_llm_speculation_draft_tokens",
                                           description="draft tokens proposed and accepted by the target",
                                           kind=pb_utils.MetricFamily.COUNTER)
            state = pb_utils.MetricFamily(name="nv_trt_llm_speculation_state",
                                          description="in-flight draft-target requests and the speculation cap",
                                          kind=pb_utils.MetricFamily.GAUGE)
        except Exception as exc:  # noqa: BLE001 (metrics disabled or unsupported: serve without them)
            pb_utils.Logger.log_warn(f"tensorrt_llm_bls: no speculation metrics ({exc})")
            self.requests = self.tokens = self.state = None
            return
        self.families = [requests, tokens, state]
        self.requests = {d: requests.Metric(labels=dict(labels, speculation_decision=d))
                         for d in ("speculative", "target_only")}
        self.tokens = {t: tokens.Metric(labels=dict(labels, draft_token_type=t)) for t in ("proposed", "accepted")}
        self.state = {s: state.Metric(labels=dict(labels, speculation_state_type=s))
                      for s in ("in_flight", "max_batch_for_speculation")}
        self.state["max_batch_for_speculation"].set(-1 if cap is None else cap)

    def close(self):
        """Drop the metrics before their families (the backend's required order)."""
        self.requests = self.tokens = self.state = None
        self.families = []

    def decision(self, speculative):
        if self.requests:
            with _IPC:
                self.requests["speculative" if speculative else "target_only"].increment(1)

    def draft_tokens(self, proposed, accepted):
        if self.tokens:
            with _IPC:
                self.tokens["proposed"].increment(proposed)
                self.tokens["accepted"].increment(accepted)

    def in_flight(self, count):
        if self.state:
            with _IPC:
                self.state["in_flight"].set(count)


def _last(responses, model):
    """The last response of a non-streaming call."""
    last = None
    for last in responses:
        pass
    if last is None:
        raise RequestError(f"{model} returned no output")
    return last


def _stack(arrays):
    """Concatenate [1, k, len, ...] arrays on axis 1, zero-padding axis 2 to the longest."""
    if arrays[0].ndim < 3:
        return np.concatenate(arrays, axis=1)
    width = max(a.shape[2] for a in arrays)
    padded = [np.pad(a, [(0, 0), (0, 0), (0, width - a.shape[2])] + [(0, 0)] * (a.ndim - 3)) for a in arrays]
    return np.concatenate(padded, axis=1)


def _perf(calls, arrival):
    """Perf outputs of a draft-target request from its target calls (block counts summed)."""
    first, last = calls[0], calls[-1]
    out = {"arrival_time_ns": np.array([[arrival]], dtype=np.int64)}
    for name, source in (("first_scheduled_time_ns", first), ("first_token_time_ns", first),
                         ("last_token_time_ns", last)):
        if source.get(name) is not None:
            out[name] = source[name].astype(np.int64).reshape(1, 1)
    for name in BLOCK_COUNTS:
        values = [int(_scalar(c.get(name), 0)) for c in calls if c.get(name) is not None]
        if values:
            out[name] = np.array([[sum(values)]], dtype=np.int32)
    return out
