"""The one plain-text table formatter of every human-readable report (plan, compare, bench, resources, ...)."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[str]], *, header: bool = False, right: bool = False) -> str:
    """Rows of cells in columns padded to their widest cell, two spaces apart, trailing blanks removed.

    Args:
        header: rule the first row off with dashes
        right: right-align the cells (numbers); default left
    """
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(map(len, rows)))]
    pad = str.rjust if right else str.ljust
    lines = ["  ".join(pad(cell, w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
