"""Strict `${name}` templating for the packaged Triton templates: every placeholder must be filled, every value
must be used, nothing `${...}`-like may survive. (Never `string.Template.safe_substitute`.)"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pipeline.core.errors import PackageError

TEMPLATE_VERSION = 1  # bump when rendering changes without a template file changing
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LEFTOVER = re.compile(r"\$\{|\$[A-Za-z_]")


def templates_root(layout: str = "triton") -> Path:
    """A packaged template tree: pipeline/templates/triton/<model>/{config.pbtxt,1/model.py} (engine runtime), or
    pipeline/templates/llmapi/tensorrt_llm/ (`layout="llmapi"`, PyTorch runtime)."""
    return Path(str(resources.files("pipeline").joinpath("templates").joinpath(layout)))


def templates_hash(layout: str = "triton") -> str:
    """sha256 over a template tree and TEMPLATE_VERSION (a package key factor)."""
    root = templates_root(layout)
    h = hashlib.sha256(str(TEMPLATE_VERSION).encode())
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def format_value(value: Any) -> str:
    """Booleans render as true/false (pbtxt and the backends' string parameters), None as an empty string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


def render(text: str, values: Mapping[str, Any], *, name: str = "template") -> str:
    """Fill every `${key}` of `text` from `values`.

    Raises:
        PackageError: a placeholder has no value, a value matches no placeholder, or `${`/`$name` remains.
    """
    wanted = placeholders(text)
    missing = sorted(wanted - set(values))
    if missing:
        raise PackageError(f"{name}: no value for placeholder(s) {', '.join(missing)}; add them to the values")
    unknown = sorted(set(values) - wanted)
    if unknown:
        raise PackageError(f"{name}: unknown key(s) {', '.join(unknown)} (not in the template); remove them")
    for key, value in values.items():
        if "${" in format_value(value):
            raise PackageError(f"{name}: value of {key} contains '${{'; values must be literal")
    out = PLACEHOLDER.sub(lambda m: format_value(values[m.group(1)]), text)
    check_no_placeholders(out, name=name)
    return out


def check_no_placeholders(text: str, *, name: str) -> None:
    """Raise PackageError naming the first line that still holds a `${...}` (or `$name`) placeholder."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if _LEFTOVER.search(line):
            raise PackageError(f"{name}:{lineno}: unfilled placeholder in {line.strip()!r}; fill it or remove it")
