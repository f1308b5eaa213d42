"""preprocessing (Triton Python backend): text -> token ids for `tensorrt_llm`, per the 1.2.1 tensor contract.

Written by pipeline.stages.package; self-contained (numpy + transformers). Per request (any batch size):
- QUERY -> INPUT_ID [batch, longest prompt] (right-padded with the pad id) and REQUEST_INPUT_LEN [batch, 1];
- DECODER_INPUT_ID [batch, 1] = pad id and REQUEST_DECODER_INPUT_LEN [batch, 1] = 1, the placeholders a
  decoder-only model gets (DECODER_QUERY, for encoder-decoder models, is refused);
- BAD_WORDS_DICT / STOP_WORDS_DICT -> BAD_WORDS_IDS / STOP_WORDS_IDS in TensorRT-LLM's word-list format
  [batch, 2, n] (flat token ids, then cumulative end offsets padded with -1); no words -> [batch, 2, 0];
- EMBEDDING_BIAS_WORDS + EMBEDDING_BIAS_WEIGHTS -> EMBEDDING_BIAS [batch, vocab] FP32 (each word's weight added to
  every token of the word); without them [batch, 0] (no bias);
- REQUEST_OUTPUT_LEN passed through; OUT_END_ID / OUT_PAD_ID from END_ID / PAD_ID, else the tokenizer's
  eos / pad token (pad falls back to eos);
- PROMPT_TABLE_EXTRA_ID -> OUT_PROMPT_TABLE_EXTRA_IDS shaped like INPUT_ID: 0 for every token of a text prompt
  (only prompt-table tokens, which a text-only build never produces, carry the extra id).
Bounded work per request: a text input (prompt, stop/bad words, bias words) longer than the byte cap is refused
before it is tokenized, then a prompt over `max_input_len` tokens. The cap is `max_input_len` x BYTES_PER_TOKEN
(generous: text averages about 4 bytes per token), DEFAULT_MAX_INPUT_BYTES without `max_input_len`.
Embedding-bias weights must be finite (at most one per vocabulary token) and a stop/bad word list may hold at most
`max_input_len` token ids (request_limits.py, the ceilings shared with tensorrt_llm and the BLS).
Image/video inputs need a multimodal build and are refused per request; the vision outputs are never produced.
`tokenizer_dir` is resolved against this model's directory unless absolute; unset (`${...}`) parameters count as
empty.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from request_limits import Limits, RequestError, check_bias, check_word_tokens

MULTIMODAL_INPUTS = ("IMAGE_BYTES", "IMAGE_URL", "IMAGES", "VIDEO_BYTES")
TRUE = ("true", "1", "t", "y", "yes")
BYTES_PER_TOKEN = 32
DEFAULT_MAX_INPUT_BYTES = 4 << 20


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if value == "" or value.startswith("${") else value


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _nbytes(value):
    return len(value) if isinstance(value, bytes) else len(str(value).encode("utf-8"))


def _rows(arr, batch):
    """[batch, ...] -> one flat list per batch row (a tensor without the batch dim is shared by every row)."""
    if arr.ndim == 0 or arr.shape[0] != batch:
        return [arr.reshape(-1).tolist()] * batch
    return [arr[b].reshape(-1).tolist() for b in range(batch)]


def _ids(request, name, batch, default):
    """END_ID / PAD_ID as [batch, 1] int32 (the tokenizer's id when absent)."""
    arr = _input(request, name)
    if arr is None:
        return np.full((batch, 1), default, dtype=np.int32)
    if arr.size == 1:
        return np.full((batch, 1), int(arr.reshape(-1)[0]), dtype=np.int32)
    if arr.size != batch:
        raise RequestError(f"{name} must hold one value per batch row ({batch}), got shape {list(arr.shape)}")
    return arr.astype(np.int32).reshape(batch, 1)


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        if _param(config, "multimodal_model_path"):
            raise pb_utils.TritonModelException(
                "preprocessing: multimodal_model_path is set but this preprocessing serves text-only models; "
                "leave it empty")
        tok_dir = _param(config, "tokenizer_dir", "tokenizer")
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], tok_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.add_special_tokens = _param(config, "add_special_tokens", "true").strip().lower() in TRUE
        self.end_id = self._token_id(self.tokenizer.eos_token, 0)
        self.pad_id = self._token_id(self.tokenizer.pad_token, self.end_id)
        self.vocab_size = len(self.tokenizer.get_vocab())
        limit = _param(config, "max_input_len", "0")
        try:
            self.max_input_len = int(limit)
        except ValueError:
            raise pb_utils.TritonModelException(f"preprocessing: max_input_len must be an integer, got {limit!r}") \
                from None
        self.max_input_bytes = self.max_input_len * BYTES_PER_TOKEN if self.max_input_len > 0 \
            else DEFAULT_MAX_INPUT_BYTES
        self.limits = Limits(max_batch_size=config.get("max_batch_size"), vocab_size=self.vocab_size,
                             max_input_len=self.max_input_len if self.max_input_len > 0 else None)

    def _check_bytes(self, arr, name):
        """Refuse a text input whose rows hold more bytes than the cap (before anything tokenizes them)."""
        if arr is None:
            return
        batch = arr.shape[0] if arr.ndim else 1
        for b, row in enumerate(_rows(arr, batch)):
            size = sum(_nbytes(v) for v in row)
            if size > self.max_input_bytes:
                basis = (f"max_input_len {self.max_input_len} x {BYTES_PER_TOKEN} bytes per token"
                         if self.max_input_len > 0 else "the default cap")
                raise RequestError(f"{name} of batch row {b} is {size} bytes, over the limit of "
                                   f"{self.max_input_bytes} bytes ({basis}); shorten it")

    def _token_id(self, token, default):
        if token is None:
            return default
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        return default if token_id is None else int(token_id)

    # ------------------------------------------------------------------------------------------ tensors
    def _prompts(self, query, pad_id):
        """QUERY [batch, 1] -> (INPUT_ID [batch, longest], REQUEST_INPUT_LEN [batch, 1])."""
        batch = query.shape[0]
        encoded = [self.tokenizer.encode(_text(q), add_special_tokens=self.add_special_tokens)
                   for q in query.reshape(batch, -1)[:, 0]]
        empty = [b for b, ids in enumerate(encoded) if not ids]
        if empty:
            raise RequestError(f"text_input of batch row {empty[0]} is empty after tokenization; send a prompt")
        longest = max(range(batch), key=lambda b: len(encoded[b]))
        if self.max_input_len > 0 and len(encoded[longest]) > self.max_input_len:
            raise RequestError(f"prompt length ({len(encoded[longest])}) of batch row {longest} exceeds maximum "
                               f"input length ({self.max_input_len}); shorten the prompt")
        width = max(len(ids) for ids in encoded)
        ids = np.empty((batch, width), dtype=np.int32)
        for b, row in enumerate(encoded):
            ids[b, : len(row)] = row
            ids[b, len(row):] = pad_id[b, 0]
        return ids, np.array([[len(row)] for row in encoded], dtype=np.int32)

    def _word_list(self, arr, batch, name):
        """Word strings [batch, n] -> [batch, 2, width]: flat token ids (0-padded) and end offsets (-1-padded)."""
        if arr is None:
            return np.empty((batch, 2, 0), dtype=np.int32)
        rows = []
        for words in _rows(arr, batch):
            flat, offsets = [], []
            for word in words:
                ids = self.tokenizer.encode(_text(word), add_special_tokens=False)
                if ids:
                    flat += ids
                    offsets.append(len(flat))
            check_word_tokens(name, len(flat), self.limits)
            rows.append((flat, offsets))
        width = max([1] + [len(flat) for flat, _ in rows])
        out = np.zeros((batch, 2, width), dtype=np.int32)
        out[:, 1, :] = -1
        for b, (flat, offsets) in enumerate(rows):
            out[b, 0, : len(flat)] = flat
            out[b, 1, : len(offsets)] = offsets
        return out

    def _embedding_bias(self, words, weights, batch):
        """Words [batch, n] + weights [batch, n] -> [batch, vocab] FP32; neither -> [batch, 0]."""
        if words is None and weights is None:
            return np.empty((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            raise RequestError("embedding_bias_words and embedding_bias_weights must be sent together")
        bias = np.zeros((batch, self.vocab_size), dtype=np.float32)
        for b, (row_words, row_weights) in enumerate(zip(_rows(words, batch), _rows(weights, batch))):
            if len(row_words) != len(row_weights):
                raise RequestError(f"embedding_bias_words ({len(row_words)}) and embedding_bias_weights "
                                   f"({len(row_weights)}) must have the same length")
            check_bias("embedding_bias_weights", row_weights, self.limits)
            for word, weight in zip(row_words, row_weights):
                for token in self.tokenizer.encode(_text(word), add_special_tokens=False):
                    bias[b, token] += float(weight)
        return bias

    def _outputs(self, request):
        query = _input(request, "QUERY")
        if query is None:
            raise RequestError("QUERY (the ensemble's text_input) is required")
        out_len = _input(request, "REQUEST_OUTPUT_LEN")
        if out_len is None:
            raise RequestError("REQUEST_OUTPUT_LEN (the ensemble's max_tokens) is required")
        if _input(request, "DECODER_QUERY") is not None:
            raise RequestError("decoder_text_input is for encoder-decoder models; this build is decoder-only")
        sent = [name for name in MULTIMODAL_INPUTS if _input(request, name) is not None]
        if sent:
            raise RequestError(f"{', '.join(sent)} need a multimodal build; this repository serves a text-only model")
        for name, arr in (("text_input", query), ("bad_words", _input(request, "BAD_WORDS_DICT")),
                          ("stop_words", _input(request, "STOP_WORDS_DICT")),
                          ("embedding_bias_words", _input(request, "EMBEDDING_BIAS_WORDS"))):
            self._check_bytes(arr, name)
        batch = query.shape[0]
        end_id = _ids(request, "END_ID", batch, self.end_id)
        pad_id = _ids(request, "PAD_ID", batch, self.pad_id)
        input_id, input_len = self._prompts(query, pad_id)
        tensors = {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": input_len,
            "DECODER_INPUT_ID": pad_id.copy(),
            "REQUEST_DECODER_INPUT_LEN": np.ones((batch, 1), dtype=np.int32),
            "BAD_WORDS_IDS": self._word_list(_input(request, "BAD_WORDS_DICT"), batch, "bad_words"),
            "STOP_WORDS_IDS": self._word_list(_input(request, "STOP_WORDS_DICT"), batch, "stop_words"),
            "EMBEDDING_BIAS": self._embedding_bias(_input(request, "EMBEDDING_BIAS_WORDS"),
                                                   _input(request, "EMBEDDING_BIAS_WEIGHTS"), batch),
            "REQUEST_OUTPUT_LEN": out_len.astype(np.int32).reshape(batch, -1),
            "OUT_END_ID": end_id,
            "OUT_PAD_ID": pad_id,
        }
        if _input(request, "PROMPT_TABLE_EXTRA_ID") is not None:
            tensors["OUT_PROMPT_TABLE_EXTRA_IDS"] = np.zeros(input_id.shape, dtype=np.uint64)
        return [pb_utils.Tensor(name, value) for name, value in tensors.items()]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._outputs(request)))
            except RequestError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                message = f"preprocessing: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses
