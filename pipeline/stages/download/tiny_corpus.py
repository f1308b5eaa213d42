"""The tiny models' shared inputs: the generator's version and the bundled corpus (`pipeline/data/corpus.txt`),
split deterministically into training and held-out texts, dialogues rendered in the chat template's format. Used by
the tiny-model generator (`tinymodel`) and the tiny EAGLE-3 head's (`tiny_eagle3`)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

GENERATOR_VERSION = "1"
HELDOUT_EVERY = 10  # every 10th corpus paragraph is held out for evaluation


def corpus_path() -> Path:
    """The bundled, license-clean text corpus (paragraphs separated by blank lines)."""
    return Path(__file__).parents[2] / "data" / "corpus.txt"


@lru_cache(maxsize=1)
def _paragraphs() -> tuple[str, ...]:
    text = corpus_path().read_text(encoding="utf-8")
    return tuple(dict.fromkeys(p.strip() for p in text.split("\n\n") if p.strip()))  # unique, in order


def corpus_split() -> tuple[list[str], list[str]]:
    """Deterministic, disjoint (calibration/training texts, held-out evaluation texts) from the bundled corpus."""
    paras = _paragraphs()
    calib = [p for i, p in enumerate(paras) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    heldout = [p for i, p in enumerate(paras) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    return calib, heldout


def corpus_sha() -> str:
    return hashlib.sha256(corpus_path().read_bytes()).hexdigest()


def as_chat(paragraph: str) -> str:
    """Render corpus dialogues ("User: .. Assistant: ..") in the chat-template format so chat prompts work."""
    if not paragraph.startswith("User: "):
        return paragraph
    out = paragraph
    for role in ("User", "Assistant"):
        out = out.replace(f"{role}: ", f"<|end|><|{role.lower()}|>")
    out = out.replace(" <|end|>", "<|end|>")
    return out.removeprefix("<|end|>") + "<|end|>"

