"""Reference `tensorrt_llm` model (Triton Python backend, CPU): the tensorrtllm backend's tensor contract served by
PyTorch from the exported TensorRT-LLM checkpoint (dequantized by `pipeline.checkpoint.load_checkpoint_as_hf`).

Only used for `--target reference` (CPU tests, CI, debugging); a GPU build uses backend "tensorrtllm" instead.
Semantics follow TensorRT-LLM: greedy unless top_k > 1 or top_p > 0 (temperature scales logits, `seed` makes
sampling reproducible); generation stops at `end_id` (not included in the output), at a stop word (included) or
after `request_output_len` tokens; `streaming` (decoupled) sends every token as it is produced;
`exclude_input_in_output` drops the prompt from non-streaming output; `draft_input_ids` (draft-target
speculation) are verified in one forward pass: the longest prefix the target agrees with, plus one target token.
Beam search and logits outputs are not implemented (error / absent).
"""

import json
import math
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value == "" or value.startswith("${") else value


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on", "t")


def _get(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy()


def _scalar(request, name, default=None):
    arr = _get(request, name)
    return default if arr is None or arr.size == 0 else arr.reshape(-1)[0].item()


def _word_list(arr):
    """TRT-LLM [1, 2, n] word list (flat ids, end offsets padded with -1) -> list of token sequences."""
    if arr is None or arr.size == 0:
        return []
    arr = arr.reshape(-1, 2, arr.shape[-1])[0]
    ids, offsets = arr[0].tolist(), [o for o in arr[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        if end > start:
            words.append(ids[start:end])
        start = end
    return words


def load_model(path, dtype_name):
    """HF-format dir (config.json with `architectures`) or an exported TRT-LLM checkpoint dir."""
    import torch

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if "architectures" in cfg:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    else:
        from pipeline.checkpoint import load_checkpoint_as_hf

        model = load_checkpoint_as_hf(path)
    return model.to(getattr(torch, dtype_name)).eval()


class TritonPythonModel:
    def initialize(self, args):
        import torch

        # Target and draft stubs share the host's cores with tritonserver and the other python models: half the
        # usable cores each (1 on a 2-core host), one inter-op thread. Oversubscribed, they starve the stubs'
        # 300 ms health thread, and Triton 2.51 fails a request with "Stub process '<model>' is not healthy" when a
        # stub misses its ~1 s health window while the server waits for its response (python_backend r24.10,
        # StubLauncher::ReceiveMessageFromStub; the window is hard-coded).
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, min(4, cores // 2)))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process (parallel work has started)
            pass
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        path = _param(config, "gpt_model_path")
        if not path:
            raise pb_utils.TritonModelException(f"{self.name}: parameter gpt_model_path is empty")
        if not os.path.isabs(path):
            path = os.path.normpath(os.path.join(args["model_repository"], path))
        self.model = load_model(path, _param(config, "reference_dtype", "float64"))
        self.exclude_input = _truthy(_param(config, "exclude_input_in_output", "false"))
        self.tokens_per_block = int(_param(config, "tokens_per_block", "32"))
        self.max_beam_width = int(_param(config, "max_beam_width", "1"))

    # ---------------------------------------------------------------------------------------------- sampling
    def _pick(self, logits, history, out, p, gen):
        """Choose the next token from 1-D `logits`; returns (token, logprob)."""
        import torch

        logits = logits.double().clone()
        if p["repetition_penalty"] != 1.0 or p["presence_penalty"] or p["frequency_penalty"]:
            seen = torch.tensor(history + out, dtype=torch.long)
            counts = torch.bincount(seen, minlength=logits.numel()).to(logits.dtype)[: logits.numel()]
            mask = counts > 0
            if p["repetition_penalty"] != 1.0:
                rp = p["repetition_penalty"]
                logits[mask] = torch.where(logits[mask] > 0, logits[mask] / rp, logits[mask] * rp)
            logits -= p["presence_penalty"] * mask.to(logits.dtype) + p["frequency_penalty"] * counts
        for word in p["bad_words"]:
            if len(word) == 1 or (out and (history + out)[-(len(word) - 1):] == word[:-1]):
                logits[word[-1]] = -math.inf
        if len(out) < p["min_tokens"] and 0 <= p["end_id"] < logits.numel():
            logits[p["end_id"]] = -math.inf
        logprobs = torch.log_softmax(logits, dim=-1)
        top_k, top_p = p["top_k"], p["top_p"]
        if top_k <= 1 and top_p <= 0.0:
            token = int(torch.argmax(logits))
            return token, float(logprobs[token])
        scaled = logits / max(p["temperature"], 1e-6)
        if top_k > 1:
            kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
            scaled[scaled < kth] = -math.inf
        if 0.0 < top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p
            scaled[order[drop]] = -math.inf
        probs = torch.softmax(scaled, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=gen))
        return token, float(logprobs[token])

    def _params(self, request):
        top_k = int(_scalar(request, "runtime_top_k", 0) or 0)
        top_p = float(_scalar(request, "runtime_top_p", 0.0) or 0.0)
        end_id = _scalar(request, "end_id", None)
        return {
            "top_k": top_k,
            "top_p": top_p,
            "temperature": float(_scalar(request, "temperature", 1.0) or 1.0),
            "seed": int(_scalar(request, "seed", 0) or 0),
            "end_id": -1 if end_id is None else int(end_id),
            "min_tokens": int(_scalar(request, "min_tokens", 0) or 0),
            "repetition_penalty": float(_scalar(request, "repetition_penalty", 1.0) or 1.0),
            "presence_penalty": float(_scalar(request, "presence_penalty", 0.0) or 0.0),
            "frequency_penalty": float(_scalar(request, "frequency_penalty", 0.0) or 0.0),
            "stop_words": _word_list(_get(request, "stop_words_list")),
            "bad_words": _word_list(_get(request, "bad_words_list")),
        }

    # ---------------------------------------------------------------------------------------------- generation
    def _generate(self, prompt, max_new, p, draft):
        """Yield (token, logprob) pairs; with `draft`, verify it in one forward pass (accepted prefix + 1)."""
        import torch

        gen = torch.Generator().manual_seed(p["seed"])
        out = []
        with torch.no_grad():
            if draft:
                seq = torch.tensor([prompt + draft], dtype=torch.long)
                logits = self.model(input_ids=seq).logits[0, len(prompt) - 1:]
                for i in range(min(len(draft) + 1, max_new)):
                    token, lp = self._pick(logits[i], prompt, out, p, gen)
                    out.append(token)
                    yield token, lp
                    if token == p["end_id"] or i >= len(draft) or token != draft[i] or self._stopped(prompt, out, p):
                        return
                return
            past, step = None, torch.tensor([prompt], dtype=torch.long)
            for _ in range(max_new):
                res = self.model(input_ids=step, past_key_values=past, use_cache=True)
                past = res.past_key_values
                token, lp = self._pick(res.logits[0, -1], prompt, out, p, gen)
                out.append(token)
                yield token, lp
                if token == p["end_id"] or self._stopped(prompt, out, p):
                    return
                step = torch.tensor([[token]], dtype=torch.long)

    @staticmethod
    def _stopped(prompt, out, p):
        return any(len(w) <= len(out) and out[-len(w):] == w for w in p["stop_words"])

    # ---------------------------------------------------------------------------------------------- responses
    def _response(self, tokens, logprobs, *, prompt_len, metrics, perf, with_logprobs):
        ids = np.array(tokens, dtype=np.int32).reshape(1, 1, -1)
        tensors = [
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
            pb_utils.Tensor("batch_index", np.zeros((1, 1), dtype=np.int32)),
            pb_utils.Tensor("sequence_index", np.zeros((1, 1), dtype=np.int32)),
        ]
        if with_logprobs:
            lp = np.array(logprobs, dtype=np.float32).reshape(1, 1, -1)
            tensors.append(pb_utils.Tensor("output_log_probs", lp))
            tensors.append(pb_utils.Tensor("cum_log_probs", np.array([[lp.sum()]], dtype=np.float32)))
        if perf:
            for name, value in metrics.items():
                dtype = np.int64 if name.endswith("_ns") else np.float32 if name == "acceptance_rate" else np.int32
                tensors.append(pb_utils.Tensor(name, np.array([[value]], dtype=dtype)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _serve(self, request, send):
        """Run one request; `send(response, final)` delivers responses (streamed or whole)."""
        arrival = time.time_ns()
        if _scalar(request, "stop", False):
            send(self._response([], [], prompt_len=0, metrics={}, perf=False, with_logprobs=False), True)
            return
        ids = _get(request, "input_ids")
        if ids is None:
            raise ValueError("input_ids is required")
        ids = ids.reshape(-1)
        length = int(_scalar(request, "input_lengths", ids.size))
        prompt = [int(t) for t in ids[:length]]
        max_new = int(_scalar(request, "request_output_len", 0))
        if not prompt or max_new <= 0:
            raise ValueError("input_ids must be non-empty and request_output_len > 0")
        beam = int(_scalar(request, "beam_width", 1) or 1)
        if beam != 1 or int(_scalar(request, "num_return_sequences", 1) or 1) != 1:
            raise ValueError("the reference backend supports beam_width 1 and num_return_sequences 1 only")
        draft_arr = _get(request, "draft_input_ids")
        draft = [int(t) for t in draft_arr.reshape(-1)] if draft_arr is not None else []
        streaming = bool(_scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise ValueError(f"streaming needs a decoupled model; {self.name} is not decoupled")
        exclude = _scalar(request, "exclude_input_in_output", None)
        exclude = self.exclude_input if exclude is None else bool(exclude)
        perf = bool(_scalar(request, "return_perf_metrics", False))
        with_lp = bool(_scalar(request, "return_log_probs", False))
        p = self._params(request)
        scheduled = first = last = time.time_ns()
        tokens, logprobs = [], []
        for token, lp in self._generate(prompt, max_new, p, draft):
            last = time.time_ns()
            if not tokens:
                first = last
            if token == p["end_id"]:
                break
            if streaming and tokens:  # one token behind, so the last token travels with the final flag
                send(self._response(tokens[-1:], logprobs[-1:], prompt_len=len(prompt), metrics={}, perf=False,
                                    with_logprobs=with_lp), False)
            tokens.append(token)
            logprobs.append(lp)
        accepted = 0
        while accepted < min(len(draft), len(tokens)) and tokens[accepted] == draft[accepted]:
            accepted += 1
        total_blocks = -(-(len(prompt) + len(tokens)) // self.tokens_per_block)
        metrics = {
            "kv_cache_alloc_new_blocks": total_blocks,
            "kv_cache_reused_blocks": 0,  # no prefix cache in the reference backend
            "kv_cache_alloc_total_blocks": total_blocks,
            "arrival_time_ns": arrival,
            "first_scheduled_time_ns": scheduled,
            "first_token_time_ns": first,
            "last_token_time_ns": last,
            "acceptance_rate": accepted / len(draft) if draft else 0.0,
            "total_accepted_draft_tokens": accepted,
            "total_draft_tokens": len(draft),
        }
        if streaming:
            send(self._response(tokens[-1:], logprobs[-1:], prompt_len=len(prompt), metrics=metrics, perf=perf,
                                with_logprobs=with_lp), True)
            return
        full = tokens if exclude else prompt + tokens
        full_lp = logprobs if exclude else [0.0] * len(prompt) + logprobs
        send(self._response(full, full_lp, prompt_len=len(prompt), metrics=metrics, perf=perf,
                            with_logprobs=with_lp), True)

    def execute(self, requests):
        final_flag = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                try:
                    self._serve(request, lambda r, final, s=sender: s.send(r, flags=final_flag if final else 0))
                except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                    err = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.name}: {exc}"))
                    sender.send(err, flags=final_flag)
            return None
        responses = []
        for request in requests:
            box = []
            try:
                self._serve(request, lambda r, final, b=box: b.append(r))
                responses.append(box[-1])
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.name}: {exc}")))
        return responses
