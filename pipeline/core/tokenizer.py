"""One tokenizer identity: where a build's tokenizer is, and when two tokenizers are the same (same token ids)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.manifests import TokenizerIdentity

TOKENIZER_DIR = "tokenizer"
# tokenizer.json sections that decide token ids (chat templates and other tokenizer_config.json fields do not).
ID_SECTIONS = ("model", "added_tokens", "normalizer", "pre_tokenizer")


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
        PipelineError: no tokenizer there, or tokenizer.json is not JSON.
    """
    d = Path(tokenizer_dir)
    tj, sp = d / "tokenizer.json", d / "tokenizer.model"
    if tj.is_file():
        try:
            data = json.loads(tj.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise PipelineError(f"{tj} is not valid JSON; re-export the tokenizer", path=tj) from None
        if not isinstance(data, dict):
            raise PipelineError(f"{tj} is not a tokenizer.json object; re-export the tokenizer", path=tj)
        blob = json.dumps({k: data.get(k) for k in ID_SECTIONS}, sort_keys=True, default=str).encode()
        return TokenizerIdentity(file="tokenizer.json", sha256=hashlib.sha256(blob).hexdigest())
    if sp.is_file():
        return TokenizerIdentity(file="tokenizer.model", sha256=hashlib.sha256(sp.read_bytes()).hexdigest())
    raise PipelineError(f"{d} has no tokenizer.json or tokenizer.model; re-run `invoke calibrate`, which exports the "
                        "tokenizer with the checkpoint", path=d)


def mismatch(target: TokenizerIdentity, draft: TokenizerIdentity) -> str | None:
    """None when draft and target tokenize alike, else the reason (for a one-line error)."""
    if draft == target:
        return None
    return (f"{draft.file} {draft.sha256[:12]} vs {target.file} {target.sha256[:12]}; draft-target speculation "
            "needs one shared tokenizer: choose a draft of the same family")


MAX_TOKENIZER_BYTES = 64 << 20  # tokenizer.json of a 256k-token vocabulary is ~20 MB


def token_count(tokenizer_dir: Path) -> int:
    """How many token ids the tokenizer in `tokenizer_dir` produces: `len(tokenizer)` in transformers (the base
    vocabulary plus added tokens), read from tokenizer.json (size-capped), else by loading it with transformers.

    Raises:
        PipelineError: no tokenizer there, or it cannot be read.
    """
    d = Path(tokenizer_dir)
    tj = d / "tokenizer.json"
    try:
        if tj.is_file():
            if tj.stat().st_size > MAX_TOKENIZER_BYTES:
                raise PipelineError(f"{tj} is over {MAX_TOKENIZER_BYTES >> 20} MiB; not a tokenizer", path=tj)
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(tj)).get_vocab_size(with_added_tokens=True)
        if (d / "tokenizer.model").is_file():
            from transformers import AutoTokenizer

            return len(AutoTokenizer.from_pretrained(str(d)))
    except PipelineError:
        raise
    except Exception as exc:  # tokenizers / sentencepiece raise their own types for a malformed file
        raise PipelineError(f"the tokenizer in {d} cannot be read ({type(exc).__name__}); re-fetch the model",
                            path=d) from None
    raise PipelineError(f"{d} has no tokenizer.json or tokenizer.model", path=d)
