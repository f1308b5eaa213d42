"""Calibration and held-out text: loading, tokenization, seeded deterministic sample selection, fingerprint."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import CalibrationError, IntegrityError
from pipeline.core.tokenizer import load_tokenizer_json
from pipeline.core.untrusted import parse_json, read_bytes
from pipeline.stages.download.tinymodel import corpus_split

MAX_CALIB_BYTES = 256 << 20  # read whole; a calibration set of 512 x 2048 tokens is ~4 MB of text


@dataclass(frozen=True)
class TokenSet:
    """Token samples (lists of ids) and the sha256 fingerprint of exactly these samples."""

    samples: list[list[int]]
    source: str
    fingerprint: str

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.samples)


def _bundled() -> tuple[list[str], list[str]]:
    return corpus_split()


def load_texts(path: str | Path | None) -> tuple[list[str], str]:
    """Calibration texts and a description of their source.

    None: the bundled corpus' calibration split. `*.jsonl`: one JSON object with a string "text" per line.
    Anything else: plain text, paragraphs separated by blank lines (one per line when there are none).

    Raises:
        CalibrationError: the file is missing, not a regular file, over `MAX_CALIB_BYTES`, unreadable, malformed or
            holds no text (`invoke check` runs this before any download).
    """
    if path is None:
        return _bundled()[0], "bundled-corpus"
    p = Path(path).expanduser()
    try:
        data = read_bytes(p, cap=MAX_CALIB_BYTES, what=f"calibration file {p}",
                          fix="pass a .jsonl or text file to --calib-data", error=CalibrationError)
        raw = data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it; a BOM is fine
    except FileNotFoundError:
        raise CalibrationError(f"calibration file {p} does not exist; pass an existing .jsonl or text file to "
                               "--calib-data") from None
    except UnicodeDecodeError:
        raise CalibrationError(f"calibration file {p} is not UTF-8 text; convert it or pass a .jsonl file") from None
    except OSError as exc:
        raise CalibrationError(f"calibration file {p} cannot be read ({exc.strerror}); fix its permissions") from None
    texts: list[str] = []
    if p.suffix.lower() == ".jsonl":
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = parse_json(line, what=f"{p}:{n}", fix="fix that line", error=CalibrationError)
            except json.JSONDecodeError:
                raise CalibrationError(f'{p}:{n}: not valid JSON; each line must be {{"text": "..."}}') from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise CalibrationError(f'{p}:{n}: expected an object with a string "text" field; fix that line')
            if obj["text"].strip():
                texts.append(obj["text"])
    else:
        blocks = [b.strip() for b in raw.split("\n\n")]
        texts = (
            [b for b in blocks if b]
            if len([b for b in blocks if b]) > 1
            else [ln.strip() for ln in raw.splitlines() if ln.strip()]
        )
    if not texts:
        raise CalibrationError(f"calibration file {p} holds no text; add samples or drop --calib-data")
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return texts, f"{p.name}@{digest}"


def heldout_texts(exclude: list[str]) -> list[str]:
    """The bundled corpus' held-out split, minus any text also used for calibration (disjoint by construction)."""
    used = set(exclude)
    return [t for t in _bundled()[1] if t not in used]


def tokenizer_fn(model_dir: Path, *, fix: str = "replace the model's tokenizer files") -> Callable[[str], list[int]]:
    """A text -> ids function from a HF model dir (fast `tokenizers` when tokenizer.json exists).

    Raises:
        IntegrityError: the tokenizer files cannot be loaded (garbage, truncated); the line ends with `fix`.
    """
    tok_json = Path(model_dir) / "tokenizer.json"
    if tok_json.is_file():
        tok = load_tokenizer_json(tok_json, fix=fix, error=IntegrityError)
        return lambda text: tok.encode(text).ids
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # tokenizers/transformers raise plain Exception, ValueError, OSError...
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # a real I/O failure (exit 5 at the CLI)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise IntegrityError(f"the tokenizer in {model_dir} cannot be loaded ({reason}); {fix}",
                             path=model_dir) from None
    return lambda text: auto(text)["input_ids"]


def pack(
    texts: list[str], encode: Callable[[str], list[int]], *, size: int, seq_len: int, seed: int, source: str
) -> TokenSet:
    """Shuffle texts with `seed`, tokenize, pack into up to `size` samples of exactly `seq_len` tokens.

    When the texts hold fewer than `seq_len` tokens in all, the single (shorter) sample is used.

    Raises:
        CalibrationError: the texts tokenize to nothing.
    """
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    stream: list[int] = []
    need = size * seq_len
    for i in order:
        stream.extend(encode(texts[i]))
        if len(stream) >= need:
            break
    if not stream:
        raise CalibrationError(f"calibration data {source} tokenizes to zero tokens; provide real text")
    samples = [stream[i : i + seq_len] for i in range(0, min(len(stream), need), seq_len)]
    if len(samples) > 1 and len(samples[-1]) < seq_len:
        samples.pop()
    blob = json.dumps({"seq_len": seq_len, "samples": samples}, separators=(",", ":")).encode()
    return TokenSet(samples, source, hashlib.sha256(blob).hexdigest())
