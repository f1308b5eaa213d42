"""Bench traffic from a file: JSONL prompts with optional output lengths, or ShareGPT conversations as published.

A file is either JSONL (one JSON object a line; blank lines skipped) or one JSON array of such objects (ShareGPT as
published, ~670 MB: read as a stream with `ijson`, never held whole). An object is `{"prompt": "...",
"output_len": N}` (`output_len` optional) or the ShareGPT layout `{"conversations": [{"from": "human", "value":
"..."}, {"from": "gpt", "value": "..."}, ...]}`: the first human turn with text is the prompt, the token length of
the reply that follows it the output length (with the build's tokenizer; without one the reply sets none).
Conversations without such a turn are left out. The file must be a regular file (`pipeline.core.untrusted`). A record
over `MAX_RECORD_BYTES` (a JSONL line, or the bytes read while an array's record is built) or with a prompt over
`MAX_PROMPT_CHARS`, a JSONL line nested too deeply or with an over-long integer, and a malformed record, are refused
with its line or record number.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pipeline.core.errors import BenchError
from pipeline.core.untrusted import open_regular, parse_json

MAX_RECORD_BYTES = 64 * 1024 * 1024  # one JSONL line
MAX_PROMPT_CHARS = 4 * 1024 * 1024  # one prompt (either layout)
MAX_OUTPUT_LEN = 1_048_576
MAX_DEPTH = 1000  # JSON nesting of one array record (a ShareGPT record is 4 deep)
_CHUNK = 4096
_HUMAN = ("human", "user")
_REPLY = ("gpt", "assistant", "chatgpt", "bard", "model")
_EXAMPLE = '{"prompt": "...", "output_len": 128}'


@dataclass(frozen=True)
class DatasetRequest:
    """One request of the dataset: its prompt and, when the file gives one, the output tokens to ask for."""

    prompt: str
    output_len: int | None = None


@dataclass(frozen=True)
class _Record:
    """A parsed record before its reply is tokenized (only sampled records are)."""

    prompt: str
    output_len: int | None = None
    reply: str | None = None


def _output_len(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_LEN:
        raise BenchError(f"{where}: output_len={value!r}: expected an integer within 1..{MAX_OUTPUT_LEN}")
    return value


def _prompt(value: object, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise BenchError(f"{where}: {what} is not a string")
    if len(value) > MAX_PROMPT_CHARS:
        raise BenchError(f"{where}: a prompt of {len(value):,} characters is over the {MAX_PROMPT_CHARS:,}-character "
                         "cap; drop that record")
    return _text(value, where, what)


def _text(value: str, where: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON allows a lone surrogate escape (\ud800); no tokenizer or server does
        raise BenchError(f"{where}: {what} holds a lone surrogate (character {exc.start}), not text; drop that "
                         "record") from None
    return value


def _sharegpt(turns: object, where: str) -> _Record | None:
    """The first human turn with text and the reply after it; None when the conversation has none."""
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise BenchError(f"{where}: 'conversations' must be a list of {{\"from\": ..., \"value\": ...}} objects")
    for i, turn in enumerate(turns):
        if turn.get("from") not in _HUMAN:
            continue
        prompt = _prompt(turn.get("value"), where, "a human turn's 'value'")
        if not prompt:
            continue
        nxt = turns[i + 1] if i + 1 < len(turns) else {}
        reply = nxt.get("value") if nxt.get("from") in _REPLY and isinstance(nxt.get("value"), str) else None
        reply = _text(reply, where, "the reply") if reply else None
        return _Record(prompt, reply=reply or None)
    return None


def _record(obj: object, where: str) -> _Record | None:
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "conversations" in obj:
        return _sharegpt(obj["conversations"], where)
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BenchError(f"{where}: no 'prompt' string (or 'conversations' list, the ShareGPT layout)")
    out = obj.get("output_len")
    return _Record(_prompt(prompt, where, "'prompt'"), None if out is None else _output_len(out, where))


def _jsonl(f: IO[bytes], name: str) -> Iterator[_Record | None]:
    number = 0
    while line := f.readline(MAX_RECORD_BYTES + 1):
        number += 1
        where = f"--dataset {name} line {number}"
        if len(line) > MAX_RECORD_BYTES:
            raise BenchError(f"{where}: over the {MAX_RECORD_BYTES:,}-byte cap of one record; drop that line")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BenchError(f"{where}: not UTF-8 text (byte {exc.start})") from None
        if not text.strip():
            continue
        try:
            obj = parse_json(text, what=where, fix="drop that line", error=BenchError)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{where}: not JSON ({exc.msg}); each line must be one object like {_EXAMPLE}") from None
        yield _record(obj, where)


class _RecordBudget:
    """A file whose reads since `start()` may not pass `MAX_RECORD_BYTES` nor open brackets `MAX_DEPTH` deeper than
    they close (a record ijson is still building; its cost grows with the square of the nesting). Reads are at most
    `_CHUNK` bytes, so the depth is checked that often; brackets inside strings count too, a bound not a parse."""

    def __init__(self, f: IO[bytes], name: str):
        self.f, self.name = f, name
        self.start(1)

    def start(self, number: int) -> None:
        self.used, self.depth, self.number = 0, 0, number

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(_CHUNK if n < 0 else min(n, _CHUNK))
        self.used += len(data)
        self.depth += data.count(b"[") + data.count(b"{") - data.count(b"]") - data.count(b"}")
        where = f"--dataset {self.name} record {self.number}"
        if self.used > MAX_RECORD_BYTES:
            raise BenchError(f"{where}: over the {MAX_RECORD_BYTES:,}-byte cap of one record; drop that record")
        if self.depth > MAX_DEPTH:
            raise BenchError(f"{where}: nested over {MAX_DEPTH:,} levels deep; drop that record")
        return data


def _array(f: IO[bytes], name: str) -> Iterator[_Record | None]:
    import ijson

    number = 0
    budget = _RecordBudget(f, name)
    try:
        for number, obj in enumerate(ijson.items(budget, "item", use_float=True), 1):
            budget.start(number + 1)
            yield _record(obj, f"--dataset {name} record {number}")
    except ijson.JSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BenchError(f"--dataset {name}: not a JSON array of objects after record {number} ({reason}); pass "
                         f"JSONL or one JSON array like [{_EXAMPLE}]") from None


def _records(f: IO[bytes], name: str) -> Iterator[_Record]:
    """The file's records, JSONL or one JSON array (told by its first non-blank byte)."""
    head = f.read(4096).lstrip(b" \t\r\n")
    while not head:
        chunk = f.read(4096)
        if not chunk:
            return
        head = chunk.lstrip(b" \t\r\n")
    f.seek(0)
    for r in _array(f, name) if head[:1] == b"[" else _jsonl(f, name):
        if r is not None:
            yield r


def load_dataset(path: str | Path, *, tokenizer=None, sample: int | None = None, seed: int = 0
                 ) -> list[DatasetRequest]:
    """The requests of a dataset file, streamed: all of them, or a seeded sample of `sample` (reservoir sampling:
    the same file and seed give the same sample), in file order. Only sampled replies are tokenized.

    Raises:
        BenchError: the file is missing or unreadable, not UTF-8, has a malformed or oversized record (named by
            line or record number) or no request.
    """
    p = Path(path)
    rng = random.Random(seed)
    kept: list[tuple[int, _Record]] = []
    try:
        with open_regular(p, what=f"--dataset {p}", fix="pass a .jsonl or .json file", error=BenchError) as f:
            for i, rec in enumerate(_records(f, str(p))):
                if sample is None or len(kept) < sample:
                    kept.append((i, rec))
                elif (j := rng.randrange(i + 1)) < sample:
                    kept[j] = (i, rec)
    except FileNotFoundError:
        raise BenchError(f"--dataset {p}: no such file") from None
    except OSError as exc:
        raise BenchError(f"--dataset {p}: cannot be read ({exc.strerror or exc}); pass a readable file") from None
    if not kept:
        raise BenchError(f"--dataset {p}: no requests (JSONL or a JSON array of objects with a 'prompt' or "
                         "'conversations')")
    return [_request(rec, tokenizer) for _, rec in sorted(kept, key=lambda x: x[0])]


def _request(rec: _Record, tokenizer) -> DatasetRequest:
    if rec.reply is None or tokenizer is None:
        return DatasetRequest(rec.prompt, rec.output_len)
    return DatasetRequest(rec.prompt, max(1, len(tokenizer.encode(rec.reply, add_special_tokens=False).ids)))
