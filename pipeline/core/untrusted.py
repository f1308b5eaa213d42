"""The one way a file the pipeline did not write is read: a spec, a models file, a dataset, a bench report, a
precision-search record, a build ref, calibration text, a Hub `config.json`.

`open_regular` opens without blocking (`O_NONBLOCK`) and checks the opened descriptor, so a FIFO, a device, a
directory or a socket is refused before a byte is read; `read_bytes` reads at most `cap + 1` bytes, so the cap holds
whatever the file's size claims. `parse_json` refuses integers over `MAX_INT_DIGITS` digits and nesting deeper than
Python's recursion limit; `load_yaml_mapping` loads safely (libyaml refuses nesting over 1,000 levels), refusing
duplicate keys, complex (non-scalar) keys and integers over `MAX_INT_DIGITS` digits. Each problem is one line of the
caller's error class (exit 2 unless the class says otherwise).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from collections.abc import Hashable
from typing import IO, TYPE_CHECKING, Any

import yaml

from pipeline.core.errors import PipelineError, RegistryError

MAX_INT_DIGITS = 100  # no count, size or id the pipeline reads comes near this
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | Path, *, what: str, fix: str, error: type[PipelineError] = PipelineError) -> IO[bytes]:
    """`path` opened for binary reading, once the opened file is a regular file (symlinks followed).

    Args:
        what: names the file in the message (e.g. "--bench-report report.json").
        fix: what the user should do, ending the message.
        error: the class raised.

    Raises:
        error: the path is not a regular file (directory, FIFO, device, socket).
        OSError: it cannot be opened (missing, permission): the caller words that.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket
            raise error(f"{what} is not a regular file; {fix}", path=path) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise error(f"{what} is {kind}, not a regular file; {fix}", path=path)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | Path, *, cap: int, what: str, fix: str,
               error: type[PipelineError] = PipelineError) -> bytes:
    """The whole of a regular file of at most `cap` bytes (the cap is checked on what is read, not on `st_size`).

    Raises:
        error: not a regular file, or over `cap` bytes.
        OSError: it cannot be opened or read (missing, permission): the caller words that.
    """
    with open_regular(path, what=what, fix=fix, error=error) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise error(f"{what} is over the {cap:,}-byte limit; {fix}", path=path)
    return data


class _LongInt(ValueError):
    pass


def _int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS + 1:  # + 1: a sign
        raise _LongInt
    return int(text)


def parse_json(raw: bytes | str, *, what: str, fix: str, error: type[PipelineError] = PipelineError) -> Any:
    """`json.loads(raw)`, refusing an integer over `MAX_INT_DIGITS` digits and nesting deeper than Python's
    recursion limit (about 1,000 levels).

    Raises:
        error: too deep, or too long an integer.
        json.JSONDecodeError, UnicodeDecodeError: not JSON (the caller words that).
    """
    try:
        return json.loads(raw, parse_int=_int)
    except RecursionError:
        raise error(f"{what} is JSON nested too deeply (over about 1,000 levels); {fix}") from None
    except _LongInt:
        raise error(f"{what} holds an integer of more than {MAX_INT_DIGITS} digits; {fix}") from None


MAX_JSON_BYTES = 16 << 20  # a config.json, manifest or record; a checkpoint's index.json is ~100 KB


def read_json(path: str | Path, *, what: str, fix: str, error: type[PipelineError] = PipelineError,
              cap: int = MAX_JSON_BYTES) -> Any:
    """The JSON document of a regular file of at most `cap` bytes, within `parse_json`'s limits.

    Raises:
        error: not a regular file, over `cap`, not UTF-8 JSON, too deep or too long an integer (one line naming
            `what` and ending with `fix`).
        OSError: it cannot be opened or read (missing, permission): the caller words that.
    """
    raw = read_bytes(path, cap=cap, what=what, fix=fix, error=error)
    try:
        return parse_json(raw.decode("utf-8-sig"), what=what, fix=fix, error=error)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise error(f"{what} is not JSON; {fix}", path=path) from None


if TYPE_CHECKING:
    _BaseLoader = yaml.SafeLoader
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _SafeLoader(_BaseLoader):
    """SafeLoader (libyaml's parser where PyYAML has it) that refuses a mapping with the same key twice (PyYAML keeps
    the last one silently), a complex key (a list or mapping as a key) and an over-long integer."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(None, None, "complex key (a list or mapping as a key)",
                                                        key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_DIGITS + 1:
            raise yaml.constructor.ConstructorError(None, None, f"integer of more than {MAX_INT_DIGITS} digits",
                                                    node.start_mark)
        return super().construct_yaml_int(node)


_SafeLoader.add_constructor("tag:yaml.org,2002:int", _SafeLoader.construct_yaml_int)
_SHOWN = ("duplicate key", "complex key", "digits")


def load_yaml_mapping(path: str | Path, *, what: str, flag: str, cap: int, error: type[PipelineError] = RegistryError,
                      shape: str = "") -> dict[str, Any]:
    """The top-level mapping of a YAML file of at most `cap` bytes; `error` with one line (naming `what` and `flag`)
    for anything else.

    `shape` completes the "must be a YAML mapping" message (e.g. " with a top-level 'models:' mapping").
    """
    p = Path(path)
    try:
        raw = read_bytes(p, cap=cap, what=f"{what} {p}", fix=f"pass a YAML file to {flag}", error=error)
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist; pass an existing YAML file to {flag}", path=p) from None
    except OSError as exc:
        raise error(f"{what} {p} cannot be read ({exc.strerror}); pass a readable YAML file to {flag}",
                    path=p) from None
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise error(f"{what} {p} is not UTF-8 text (a binary file?); pass a YAML file to {flag}", path=p) from None
    try:
        data = yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML without libyaml composes recursively
        raise error(f"{what} {p} is nested too deeply; fix it", path=p) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(exc, "problem", None)
        detail = f": {problem}" if problem and any(s in problem for s in _SHOWN) else ""
        raise error(f"{what} {p} is not valid YAML{where}{detail}; fix it", path=p) from None
    if not isinstance(data, dict):
        raise error(f"{what} {p} must be a YAML mapping{shape}", path=p)
    return data
