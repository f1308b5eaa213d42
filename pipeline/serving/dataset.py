"""Bench traffic from a file: JSONL prompts with optional output lengths, or ShareGPT-style conversations.

Each line is one JSON object, either `{"prompt": "...", "output_len": N}` (`output_len` optional) or the ShareGPT
layout `{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}`: the first
human turn is the prompt, the token length of the reply that follows it the output length (with the build's
tokenizer; without one the reply sets none). Blank lines are skipped. The file is read up to `MAX_DATASET_BYTES`;
a malformed line is refused with its line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import BenchError

MAX_DATASET_BYTES = 256 * 1024 * 1024  # the whole file
MAX_OUTPUT_LEN = 1_048_576
_HUMAN = ("human", "user")
_REPLY = ("gpt", "assistant", "chatgpt", "bard", "model")


@dataclass(frozen=True)
class DatasetRequest:
    """One request of the dataset: its prompt and, when the file gives one, the output tokens to ask for."""

    prompt: str
    output_len: int | None = None


def _output_len(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_LEN:
        raise BenchError(f"{where}: output_len={value!r}: expected an integer within 1..{MAX_OUTPUT_LEN}")
    return value


def _sharegpt(turns: object, where: str, tokenizer) -> DatasetRequest | None:
    """The first human turn and the length of the reply after it; None when the conversation has no human turn."""
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise BenchError(f"{where}: 'conversations' must be a list of {{\"from\": ..., \"value\": ...}} objects")
    for i, turn in enumerate(turns):
        if turn.get("from") not in _HUMAN:
            continue
        prompt = turn.get("value")
        if not isinstance(prompt, str) or not prompt:
            raise BenchError(f"{where}: the first human turn has no text 'value'")
        reply = turns[i + 1].get("value") if i + 1 < len(turns) and turns[i + 1].get("from") in _REPLY else None
        n = len(tokenizer.encode(reply, add_special_tokens=False).ids) if reply and tokenizer is not None else None
        return DatasetRequest(prompt, max(1, n) if n is not None else None)
    return None


def _parse_line(line: str, where: str, tokenizer) -> DatasetRequest | None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BenchError(f"{where}: not JSON ({exc.msg}); each line must be one object like "
                         '{"prompt": "...", "output_len": 128}') from None
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "conversations" in obj:
        return _sharegpt(obj["conversations"], where, tokenizer)
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BenchError(f"{where}: no 'prompt' string (or 'conversations' list, the ShareGPT layout)")
    out = obj.get("output_len")
    return DatasetRequest(prompt, None if out is None else _output_len(out, where))


def load_dataset(path: str | Path, *, tokenizer=None) -> list[DatasetRequest]:
    """The requests of a JSONL dataset, in file order (conversations without a human turn are left out).

    Raises:
        BenchError: the file is missing, too large, not UTF-8, has a malformed line (named by number) or no request.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_DATASET_BYTES:
            raise BenchError(f"--dataset {p}: {size:,} bytes is over the {MAX_DATASET_BYTES:,}-byte cap; pass a "
                             "sample of it")
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise BenchError(f"--dataset {p}: no such file") from None
    except IsADirectoryError:
        raise BenchError(f"--dataset {p}: is a directory; pass a .jsonl file") from None
    except UnicodeDecodeError as exc:
        raise BenchError(f"--dataset {p}: not UTF-8 text (byte {exc.start})") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and (req := _parse_line(line, f"--dataset {p} line {number}", tokenizer)) is not None:
            out.append(req)
    if not out:
        raise BenchError(f"--dataset {p}: no requests (one JSON object per line: a 'prompt' or 'conversations')")
    return out
