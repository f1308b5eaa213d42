"""Triton `config.pbtxt` through protobuf (`tritonclient`'s `model_config_pb2`): parse strictly, edit fields, write
back atomically. Every edit of a generated config goes through here, never through regular expressions."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pipeline.core.errors import PackageError


def parse(text: str, *, name: str = "config.pbtxt"):
    """Parse a config text into a `ModelConfig`; PackageError naming `name` and the parser's message on failure."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise PackageError(f"{name}: not a valid Triton model config ({exc}); fix the template or its values") from None


def dump(cfg) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def read(path: Path):
    path = Path(path)
    return parse(path.read_text(), name=str(path))


def write(path: Path, cfg) -> None:
    """Write `cfg` to `path` atomically (temp file + rename in the same directory)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(dump(cfg))
    os.replace(tmp, path)


def parameter(cfg, key: str, default: str = "") -> str:
    return cfg.parameters[key].string_value if key in cfg.parameters else default


def with_parameters(text: str, values: Mapping[str, object], *, name: str = "config.pbtxt") -> str:
    """`text` plus the string parameters `values` (protobuf-serialized, appended so the rendered text and its
    comments stay as they are); the result is parsed to prove it valid, and a key already in `text` is refused."""
    from tritonclient.grpc import model_config_pb2

    present = parse(text, name=name).parameters
    clash = sorted(set(values) & set(present))
    if clash:
        raise PackageError(f"{name}: parameter(s) {', '.join(clash)} already set; remove them from the template")
    block = model_config_pb2.ModelConfig()
    set_parameters(block, values)
    out = text.rstrip("\n") + "\n" + dump(block)
    parse(out, name=name)
    return out


def set_parameters(cfg, values: Mapping[str, object]) -> None:
    """Set string parameters (added when absent)."""
    for key, value in values.items():
        cfg.parameters[key].string_value = str(value)
