"""postprocessing (Triton Python backend): TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH -> OUTPUT text.

Written by pipeline.triton; self-contained. `tokenizer_dir` is resolved relative to this model's directory.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value == "" else value


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        tok_dir = _param(config, "tokenizer_dir", "tokenizer")
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], tok_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.skip_special = _param(config, "skip_special_tokens", "true").lower() in ("1", "true", "yes", "t")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                if tokens.ndim == 2:  # [batch, len] -> one beam
                    tokens = tokens[:, None, :]
                lengths = lengths.reshape(tokens.shape[0], -1)
                texts = []
                for b in range(tokens.shape[0]):
                    for beam in range(tokens.shape[1]):
                        ids = tokens[b, beam, : int(lengths[b, beam])].tolist()
                        texts.append(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special).encode())
                out = np.array(texts, dtype=object).reshape(tokens.shape[0], tokens.shape[1])
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")))
        return responses
