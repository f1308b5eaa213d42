"""Per-request ceilings and finite-value checks of the Triton family's Python models (preprocessing, the reference
tensorrt_llm, tensorrt_llm_bls): the one place a request field that multiplies work or memory gets its ceiling.

`pipeline.stages.package` copies this file beside each Python model's model.py; the models import it as a sibling
module (the Python backend puts the model's version directory on sys.path). Pure Python: no Triton, no numpy, so
it is unit-tested on its own.

Ceilings come from the build (`Limits`, read from the model's config parameters): `num_return_sequences` <= the
max batch size (each sequence takes a batch slot; with beam search, <= beam_width); `beam_width` <= max_beam_width;
`request_output_len` (`max_tokens`) <= max_seq_len - prompt length; `min_tokens` <= max_seq_len; stop/bad word
lists <= max_input_len tokens (else max_seq_len); an embedding bias holds exactly one finite value per vocabulary
token; bias weights <= vocab size values, each finite; generation or context logits <= MAX_LOGITS_BYTES per request.
Every float sampling value must be finite and inside the tensorrtllm backend's bounds (SAMPLING_BOUNDS). A
violation raises RequestError with one line naming the field, its value, the ceiling and what to send.
"""

import math

# Per-request size of returned logits (sequences x tokens x vocab x 4 bytes) above which a request is refused.
MAX_LOGITS_BYTES = 1 << 30

# The tensorrtllm backend's sampling bounds (executor SamplingConfig checks; runtime_top_p <= 0 counts as unset):
# input -> (lowest, lowest allowed, highest or None, human bound). Every value must also be finite.
SAMPLING_BOUNDS = {
    "beam_width": (1, True, None, ">= 1"),
    "temperature": (0.0, True, None, ">= 0"),
    "runtime_top_k": (0, True, None, ">= 0"),
    "runtime_top_p": (0.0, False, 1.0, "in (0, 1]"),
    "runtime_top_p_min": (0.0, True, 1.0, "in [0, 1]"),
    "runtime_top_p_decay": (0.0, False, 1.0, "in (0, 1]"),
    "runtime_top_p_reset_ids": (0, True, None, ">= 0"),
    "repetition_penalty": (0.0, False, None, "> 0"),
    "presence_penalty": (None, True, None, "finite"),
    "frequency_penalty": (None, True, None, "finite"),
    "min_tokens": (0, True, None, ">= 0"),
    "len_penalty": (0.0, True, None, ">= 0"),
    "beam_search_diversity_rate": (0.0, True, None, ">= 0"),
    "num_return_sequences": (1, True, None, ">= 1"),
}


class RequestError(ValueError):
    """A request the model refuses (answered with an error response; the model keeps serving)."""


class Limits:
    """The build's ceilings (None: unknown, not checked)."""

    __slots__ = ("max_batch_size", "max_beam_width", "vocab_size", "max_seq_len", "max_input_len")

    def __init__(self, *, max_batch_size=None, max_beam_width=None, vocab_size=None, max_seq_len=None,
                 max_input_len=None):
        self.max_batch_size = max(1, int(max_batch_size)) if max_batch_size else None
        self.max_beam_width = max(1, int(max_beam_width)) if max_beam_width else None
        self.vocab_size = int(vocab_size) if vocab_size else None
        self.max_seq_len = int(max_seq_len) if max_seq_len else None
        self.max_input_len = int(max_input_len) if max_input_len else None

    @classmethod
    def from_config(cls, config, **known):
        """Limits from a model config (Triton's parsed JSON): `max_batch_size` and the string parameters
        max_beam_width, max_seq_len, max_input_len, vocab_size; `known` values (e.g. the model's vocab) win."""
        params = config.get("parameters", {})
        values = {"max_batch_size": config.get("max_batch_size") or None}
        for key in ("max_beam_width", "max_seq_len", "max_input_len", "vocab_size"):
            text = str(params.get(key, {}).get("string_value", "")).strip()
            values[key] = int(text) if text.isdigit() else None
        values.update({k: v for k, v in known.items() if v is not None})
        return cls(**values)

    def word_tokens(self):
        """The most token ids a stop or bad word list may hold."""
        return self.max_input_len or self.max_seq_len


def _number(name, value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{name} must be a number, got {value!r}; send a number") from None
    if not math.isfinite(number):
        raise RequestError(f"{name} must be finite, got {number}; send a finite number")
    return number


def check_sampling(values):
    """Raise RequestError for the first sampling value (name -> value or None) that is not finite or is outside its
    SAMPLING_BOUNDS."""
    for name, value in values.items():
        if value is None:
            continue
        number = _number(name, value)
        if name == "runtime_top_p" and number <= 0:
            continue
        low, inclusive, high, bound = SAMPLING_BOUNDS[name]
        if low is None:
            continue
        if number < low or (number == low and not inclusive) or (high is not None and number > high):
            raise RequestError(f"{name} must be {bound}, got {number:g}; send a value {bound}")


def check_ceilings(limits, *, beam_width=None, num_return_sequences=None, request_output_len=None, input_len=None,
                   min_tokens=None, logits=False):
    """Raise RequestError when a count that multiplies work or memory is over the build's ceiling.

    Args:
        limits: the build's Limits.
        beam_width, num_return_sequences, request_output_len, min_tokens: the request's values (None: not sent).
        input_len: the prompt's token count, when known (request_output_len must fit beside it).
        logits: whether the request asks for generation or context logits.
    """
    beam = int(beam_width or 1)
    if limits.max_beam_width is not None and beam > limits.max_beam_width:
        raise RequestError(f"beam_width {beam} is not supported: over the build's max_beam_width "
                           f"{limits.max_beam_width}; "
                           f"send beam_width <= {limits.max_beam_width}")
    n = int(num_return_sequences or 1)
    ceiling = beam if beam > 1 else limits.max_batch_size
    if ceiling is not None and n > ceiling:
        basis = f"beam_width {beam}" if beam > 1 else f"the build's max batch size {ceiling}"
        raise RequestError(f"num_return_sequences {n} is over {basis}; send num_return_sequences <= {ceiling}")
    out_len = None if request_output_len is None else int(request_output_len)
    if out_len is not None:
        if out_len <= 0:
            raise RequestError(f"request_output_len must be > 0, got {out_len}; ask for at least one token")
        if limits.max_seq_len is not None:
            room = limits.max_seq_len - (input_len or 0)
            if out_len > room:
                basis = (f"max_seq_len {limits.max_seq_len} - prompt length {input_len}" if input_len
                         else f"max_seq_len {limits.max_seq_len}")
                raise RequestError(f"request_output_len {out_len} is over {basis}; send request_output_len <= "
                                   f"{max(room, 0)}")
    if min_tokens is not None and limits.max_seq_len is not None and int(min_tokens) > limits.max_seq_len:
        raise RequestError(f"min_tokens {int(min_tokens)} is over max_seq_len {limits.max_seq_len}; send "
                           f"min_tokens <= request_output_len")
    if logits and limits.vocab_size and out_len:
        size = max(n, beam) * max(out_len, input_len or 0) * limits.vocab_size * 4
        if size > MAX_LOGITS_BYTES:
            raise RequestError(f"the logits asked for would be {size} bytes, over the limit of {MAX_LOGITS_BYTES} "
                               "bytes; ask for fewer tokens or sequences, or no logits")


def check_word_tokens(name, count, limits):
    """Raise RequestError when a stop or bad word list holds more token ids than the build allows."""
    ceiling = limits.word_tokens()
    if ceiling is not None and count > ceiling:
        raise RequestError(f"{name} holds {count} token ids, over the limit of {ceiling} (the build's input "
                           "length); send fewer or shorter words")


def check_bias(name, values, limits, *, exact=False):
    """Raise RequestError for a bias vector that is not one finite value per allowed slot: at most vocab_size
    values (exactly vocab_size when `exact`), each finite."""
    values = list(values)
    vocab = limits.vocab_size
    if vocab is not None and (len(values) != vocab if exact else len(values) > vocab):
        need = f"one per vocabulary token ({vocab})" if exact else f"at most one per vocabulary token ({vocab})"
        raise RequestError(f"{name} has {len(values)} values; it needs {need}")
    for value in values:
        _number(name, value)
    return values
