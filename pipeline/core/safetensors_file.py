"""Safetensors files checked before a library parses them: a `.safetensors` file is an 8-byte little-endian header
length, that many bytes of JSON (name -> dtype, shape, data_offsets), then the tensor data. A truncated file, a
header length past the end of the file or above `MAX_HEADER_BYTES`, or offsets past the data are refused with one
line (exit 3) instead of a native error or an allocation of the declared size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import IntegrityError

if TYPE_CHECKING:  # pragma: no cover
    import torch

MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit on the JSON header


def check_safetensors(path: str | Path, *, fix: str) -> None:
    """Refuse `path` unless its header length, header JSON and tensor offsets fit the file.

    Args:
        fix: what the user should do about a corrupt file (the end of the error line).

    Raises:
        IntegrityError: the file is truncated, oversized in its declared header, or not safetensors (exit 3).
    """
    path = Path(path)
    size = path.stat().st_size

    def bad(why: str) -> IntegrityError:
        return IntegrityError(f"{path} is corrupt ({why}); {fix}", path=path)

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise bad(f"header length {n} bytes in a {size}-byte file")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("the header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise bad(f"tensor {name!r} has no valid data_offsets")
        if offsets[1] > data:
            raise bad(f"tensor {name!r} ends at byte {offsets[1]} of {data} data bytes: truncated")


def check_safetensors_dir(directory: str | Path, *, fix: str) -> None:
    """`check_safetensors` on every `*.safetensors` file directly in `directory`."""
    for p in sorted(Path(directory).glob("*.safetensors")):
        check_safetensors(p, fix=fix)


def load_safetensors(path: str | Path, *, fix: str) -> dict[str, torch.Tensor]:
    """`safetensors.torch.load_file` of a file that passed `check_safetensors`."""
    from safetensors.torch import load_file

    check_safetensors(path, fix=fix)
    return load_file(str(path))
