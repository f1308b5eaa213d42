"""One tokenizer identity: where a build's tokenizer is, and when two tokenizers are the same (same token ids)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import PipelineError
from pipeline.core.manifests import TokenizerIdentity
from pipeline.core.untrusted import read_bytes, read_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_DIR = "tokenizer"
# tokenizer.json sections that decide token ids (chat templates and other tokenizer_config.json fields do not).
ID_SECTIONS = ("model", "added_tokens", "normalizer", "pre_tokenizer")
MAX_TOKENIZER_BYTES = 64 << 20  # tokenizer.json of a 256k-token vocabulary is ~20 MB


def find_tokenizer(*candidates: Path | None, error: type[PipelineError] = PipelineError) -> Path:
    """The first of `candidates` (or its `tokenizer/`) that holds tokenizer.json or tokenizer.model.

    Raises:
        error: none does.
    """
    for c in candidates:
        if c is None:
            continue
        for d in (Path(c) / TOKENIZER_DIR, Path(c)):
            if (d / "tokenizer.json").is_file() or (d / "tokenizer.model").is_file():
                return d
    names = ", ".join(str(c) for c in candidates if c) or "(nothing given)"
    raise error(f"no tokenizer (tokenizer.json or tokenizer.model) in {names} or their {TOKENIZER_DIR}/; "
                        "pass --tokenizer-dir", path=names)


def identity(tokenizer_dir: Path) -> TokenizerIdentity:
    """The identity of the tokenizer in `tokenizer_dir` (see `TokenizerIdentity`).

    Raises:
        PipelineError: no tokenizer there, or tokenizer.json is not a JSON object of at most `MAX_TOKENIZER_BYTES`.
    """
    d = Path(tokenizer_dir)
    tj, sp = d / "tokenizer.json", d / "tokenizer.model"
    if tj.is_file():
        data = read_json(tj, what=str(tj), fix="re-export the tokenizer", cap=MAX_TOKENIZER_BYTES)
        if not isinstance(data, dict):
            raise PipelineError(f"{tj} is not a tokenizer.json object; re-export the tokenizer", path=tj)
        blob = json.dumps({k: data.get(k) for k in ID_SECTIONS}, sort_keys=True, default=str).encode()
        return TokenizerIdentity(file="tokenizer.json", sha256=hashlib.sha256(blob).hexdigest())
    if sp.is_file():
        raw = read_bytes(sp, cap=MAX_TOKENIZER_BYTES, what=str(sp), fix="re-export the tokenizer")
        return TokenizerIdentity(file="tokenizer.model", sha256=hashlib.sha256(raw).hexdigest())
    raise PipelineError(f"{d} has no tokenizer.json or tokenizer.model; re-run `invoke calibrate`, which exports the "
                        "tokenizer with the checkpoint", path=d)


def mismatch(target: TokenizerIdentity, draft: TokenizerIdentity) -> str | None:
    """None when draft and target tokenize alike, else the reason (for a one-line error)."""
    if draft == target:
        return None
    return (f"{draft.file} {draft.sha256[:12]} vs {target.file} {target.sha256[:12]}; draft-target speculation "
            "needs one shared tokenizer: choose a draft of the same family")


def load_tokenizer_json(path: Path, *, fix: str, error: type[PipelineError] = PipelineError) -> Tokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json read through `pipeline.core.untrusted` (a regular file of at
    most `MAX_TOKENIZER_BYTES`).

    Raises:
        error: not such a file, or `tokenizers` cannot load it (the line names the file and ends with `fix`).
        OSError: it cannot be opened or read (missing, permission): the caller words that.
    """
    from tokenizers import Tokenizer

    raw = read_bytes(path, cap=MAX_TOKENIZER_BYTES, what=str(path), fix=fix, error=error)
    try:
        return Tokenizer.from_str(raw.decode("utf-8-sig"))
    except Exception as exc:  # tokenizers raises plain Exception for a malformed file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise error(f"the tokenizer {path} cannot be loaded ({reason}); {fix}", path=path) from None


def token_count(tokenizer_dir: Path) -> int:
    """How many token ids the tokenizer in `tokenizer_dir` produces: `len(tokenizer)` in transformers (the base
    vocabulary plus added tokens), read from tokenizer.json (size-capped), else by loading it with transformers.

    Raises:
        PipelineError: no tokenizer there, or it cannot be read.
    """
    d = Path(tokenizer_dir)
    tj = d / "tokenizer.json"
    fix = "re-fetch the model"
    try:
        if tj.is_file():
            size: int = load_tokenizer_json(tj, fix=fix).get_vocab_size(with_added_tokens=True)
            return size
        if (d / "tokenizer.model").is_file():
            from transformers import AutoTokenizer

            return len(AutoTokenizer.from_pretrained(str(d)))
    except PipelineError:
        raise
    except Exception as exc:  # sentencepiece raises its own types for a malformed file
        raise PipelineError(f"the tokenizer in {d} cannot be read ({type(exc).__name__}); {fix}", path=d) from None
    raise PipelineError(f"{d} has no tokenizer.json or tokenizer.model", path=d)
