"""A stage's library output goes to its log file; the console keeps the pipeline's own lines and progress.

`stage_log(path)` routes, while it is active, what libraries write — Python warnings, records of the
modelopt/transformers/accelerate/torch/huggingface_hub loggers, prints to `sys.stdout`/`sys.stderr`, and writes of
native code to file descriptors 1 and 2 — into `path`. `progress()` and `console()` write to the stderr saved on
entry: a tqdm bar when it is a terminal, otherwise one plain line every `PERIOD_S` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO, TypeVar

LIBRARY_LOGGERS = ("modelopt", "transformers", "accelerate", "torch", "huggingface_hub", "datasets", "tokenizers")
PERIOD_S = 15.0  # seconds between progress lines when stderr is not a terminal

T = TypeVar("T")
_consoles: list[TextIO] = []


def console() -> TextIO:
    """The stream for the pipeline's own lines: the stderr saved by the innermost active `stage_log`, else stderr."""
    return _consoles[-1] if _consoles else sys.stderr


@contextlib.contextmanager
def stage_log(path: str | Path, *, title: str = "") -> Iterator[Path]:
    """Send library output to `path` (created, or truncated, with its parent directories) until the block exits."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with open(path, "w", encoding="utf-8", errors="replace", buffering=1) as log:
        if title:
            log.write(f"# {title} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, pid {os.getpid()})\n")
        with contextlib.ExitStack() as stack:
            _consoles.append(stack.enter_context(_redirect_fds(log)))
            stack.callback(_consoles.pop)
            stack.enter_context(_library_logging_to(log))
            stack.enter_context(contextlib.redirect_stdout(log))
            stack.enter_context(contextlib.redirect_stderr(log))
            stack.enter_context(warnings.catch_warnings())

            def show_in_log(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                            file: TextIO | None = None, line: str | None = None) -> None:
                log.write(warnings.formatwarning(message, category, filename, lineno, line))

            warnings.showwarning = show_in_log
            yield path


@contextlib.contextmanager
def _redirect_fds(log: TextIO) -> Iterator[TextIO]:
    """Point fds 1 and 2 at `log`; yield the console: an enclosing stage_log's, else the entry stderr (a dup of fd 2
    when stderr was fd 2)."""
    entry_err = console()
    try:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
    except OSError:  # no fd 1/2 (a daemon): Python-level routing only
        yield entry_err
        return
    try:
        on_fd2 = _fileno(entry_err) == 2
        con = os.fdopen(os.dup(saved[2]), "w", buffering=1, encoding="utf-8", errors="replace") if on_fd2 \
            else entry_err
        try:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            yield con
        finally:
            with contextlib.suppress(Exception):
                con.flush()
            log.flush()
            for fd in (1, 2):
                os.dup2(saved[fd], fd)
            if con is not entry_err:
                con.close()
    finally:
        for fd in saved.values():
            os.close(fd)


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


@contextlib.contextmanager
def _library_logging_to(log: TextIO) -> Iterator[None]:
    """Point the console handlers of the library loggers (and the root logger) at `log`; afterwards restore them
    and point any handler created meanwhile on `log` (a library imported inside the block) at the entry stderr."""
    entry_err = sys.stderr
    swapped: list[tuple[logging.StreamHandler[TextIO], TextIO]] = []
    for h in _console_handlers(lambda name: name == "" or name.split(".")[0] in LIBRARY_LOGGERS):
        swapped.append((h, h.stream))
        _set_stream(h, log)
    try:
        yield
    finally:
        for h, stream in swapped:
            _set_stream(h, stream)
        for h in _console_handlers(lambda name: True):
            if h.stream is log:
                _set_stream(h, entry_err)


def _console_handlers(wanted: Callable[[str], bool]) -> list[logging.StreamHandler[TextIO]]:
    """Plain StreamHandlers (not files, not pytest's capture handlers) of the root and the `wanted` named loggers."""
    loggers = [logging.getLogger()] + [lg for name, lg in list(logging.root.manager.loggerDict.items())
                                       if isinstance(lg, logging.Logger) and wanted(name)]
    return [h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler]


def _set_stream(handler: logging.StreamHandler[TextIO], stream: TextIO) -> None:
    """setStream without flushing the old stream (which may be closed)."""
    handler.acquire()
    try:
        handler.stream = stream
    finally:
        handler.release()


def _is_tty(stream: TextIO) -> bool:
    """A terminal with a width (a pseudo-terminal of 0 columns gets the plain lines; tqdm would draw nothing)."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return True


def progress(items: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """Yield `items`, showing progress on the console: tqdm on a terminal, else a line every `PERIOD_S` seconds."""
    out = console()
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if _is_tty(out):
        from tqdm import tqdm

        yield from tqdm(items, desc=desc, total=total, unit=unit, file=out, leave=False, dynamic_ncols=True)
        return
    t0 = last = time.monotonic()
    for done, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last >= PERIOD_S:
            last = now
            share = f" ({100 * done // total}%)" if total else ""
            print(f"      {desc}: {done}/{total or '?'} {unit}{share} after {now - t0:.0f}s", file=out, flush=True)
