"""postprocessing (Triton Python backend): token ids -> text, per the 1.2.1 tensor contract.

Written by pipeline.stages.package; self-contained (numpy + transformers). TOKENS_BATCH [batch, beams, len] (or
[batch, len] for one beam) and SEQUENCE_LENGTH [batch, beams] -> OUTPUT: a 1-D string tensor holding one text per
(batch row, beam), row-major, as upstream's postprocessing returns it (a client reads `OUTPUT[0]`).
`tokenizer_dir` is resolved against this model's directory unless absolute.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

TRUE = ("true", "1", "t", "y", "yes")


def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return default if value == "" or value.startswith("${") else value


def _required(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"{name} is required")
    return tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        tok_dir = _param(config, "tokenizer_dir", "tokenizer")
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], tok_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.skip_special = _param(config, "skip_special_tokens", "true").strip().lower() in TRUE

    def _texts(self, request):
        tokens = _required(request, "TOKENS_BATCH")
        if tokens.ndim == 2:  # [batch, len]: one beam
            tokens = tokens[:, None, :]
        if tokens.ndim != 3:
            raise ValueError(f"TOKENS_BATCH must be [batch, beams, len], got shape {list(tokens.shape)}")
        lengths = _required(request, "SEQUENCE_LENGTH").reshape(tokens.shape[0], -1)
        if lengths.shape[1] != tokens.shape[1]:
            raise ValueError(f"SEQUENCE_LENGTH {list(lengths.shape)} does not match TOKENS_BATCH "
                             f"{list(tokens.shape)}")
        seqs = [tokens[b, k, : max(0, int(lengths[b, k]))].tolist()
                for b in range(tokens.shape[0]) for k in range(tokens.shape[1])]
        texts = self.tokenizer.batch_decode(seqs, skip_special_tokens=self.skip_special)
        return np.array([t.encode("utf-8") for t in texts], dtype=np.object_)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                out = pb_utils.Tensor("OUTPUT", self._texts(request))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")))
        return responses
