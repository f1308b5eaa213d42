"""preprocessing (Triton Python backend): QUERY text -> INPUT_ID tokens with the build's tokenizer.

Written by pipeline.triton; self-contained (numpy + transformers). `tokenizer_dir` is resolved relative to this
model's directory unless absolute, so the repository can move.
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value == "" else value


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on", "t")


def _scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        import json

        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        tok_dir = _param(config, "tokenizer_dir", "tokenizer")
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], tok_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.add_special_tokens = _truthy(_param(config, "add_special_tokens", "true"))
        tok = self.tokenizer
        self.end_id = tok.eos_token_id if tok.eos_token_id is not None else 0
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.end_id

    def _words(self, request, name, batch):
        """Word lists in the TRT-LLM [batch, 2, n] format: flat token ids, then end offsets padded with -1."""
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        rows = []
        for b in range(batch):
            words = []
            if tensor is not None:
                arr = tensor.as_numpy()
                for w in arr[b].reshape(-1) if arr.ndim > 1 else arr.reshape(-1):
                    w = w.decode() if isinstance(w, bytes) else str(w)
                    if w:
                        words.append(self.tokenizer.encode(w, add_special_tokens=False))
            ids, offsets = [], []
            for w in words:
                ids.extend(w)
                offsets.append(len(ids))
            rows.append((ids, offsets))
        width = max([1] + [len(ids) for ids, _ in rows])
        out = np.zeros((batch, 2, width), dtype=np.int32)
        out[:, 1, :] = -1
        for b, (ids, offsets) in enumerate(rows):
            out[b, 0, : len(ids)] = ids
            out[b, 1, : len(offsets)] = offsets
        return out

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
                batch = query.shape[0]
                texts = [q.decode() if isinstance(q, bytes) else str(q) for q in query.reshape(batch, -1)[:, 0]]
                encoded = [self.tokenizer.encode(t, add_special_tokens=self.add_special_tokens) for t in texts]
                if any(len(e) == 0 for e in encoded):
                    raise ValueError("empty prompt after tokenization")
                end_id = int(_scalar(request, "END_ID", self.end_id))
                pad_id = int(_scalar(request, "PAD_ID", self.pad_id))
                width = max(len(e) for e in encoded)
                ids = np.full((batch, width), pad_id, dtype=np.int32)
                for b, e in enumerate(encoded):
                    ids[b, : len(e)] = e
                lengths = np.array([[len(e)] for e in encoded], dtype=np.int32)
                out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
                tensors = [
                    pb_utils.Tensor("INPUT_ID", ids),
                    pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                    pb_utils.Tensor("BAD_WORDS_IDS", self._words(request, "BAD_WORDS_DICT", batch)),
                    pb_utils.Tensor("STOP_WORDS_IDS", self._words(request, "STOP_WORDS_DICT", batch)),
                    pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len.astype(np.int32).reshape(batch, -1)),
                    pb_utils.Tensor("OUT_END_ID", np.full((batch, 1), end_id, dtype=np.int32)),
                    pb_utils.Tensor("OUT_PAD_ID", np.full((batch, 1), pad_id, dtype=np.int32)),
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
        return responses
