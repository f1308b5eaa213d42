"""The one seam that executes `trtllm-build`: a subprocess with its output streamed to the console and a log file.

Everything else in the compile stage is pure or reads files; this is the only code that needs a GPU host, so it is
kept thin: run, stream, and on failure raise `CompileError` with the argv, the log path and the log's tail. A
SIGTERM/SIGINT while building terminates the child's process group and propagates, so the caller's `atomic_dir`
removes the half-built directory.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from pipeline.core.errors import CompileError
from pipeline.core.procs import terminate
from pipeline.core.trtllm_rules import TRTLLM_VERSION

TAIL_LINES = 40


class BuildInterrupted(CompileError):
    """trtllm-build was stopped by a signal; nothing was published."""


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    terminate(proc, grace_s=grace_s, signal_group=True)


def run_trtllm_build(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    echo: TextIO | bool | None = True,
    cwd: Path | None = None,
) -> float:
    """Run `argv` (a planned `trtllm-build ...`), streaming output to `echo` and `log_path`. Returns seconds.

    `echo`: True streams to the current sys.stdout, a file object streams there, None/False only logs.

    Raises:
        CompileError: the command is missing, exits non-zero, or is interrupted (message: argv, log, log tail).
    """
    if echo is True:
        echo = sys.stdout
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    cmd = shlex.join(argv)
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {cmd}\n")
        log.flush()
        proc = _start(argv, env, cwd)
        with _stop_on_signals(proc) as interrupted:
            rc = _pump(proc, log, tail, echo or None)
    elapsed = time.monotonic() - start
    if interrupted:
        raise BuildInterrupted(
            f"trtllm-build was interrupted by signal {interrupted[0]}; nothing was published (log: {log_path})"
        )
    if rc != 0:
        last = " | ".join(line for line in list(tail)[-12:] if line.strip())
        raise CompileError(f"trtllm-build exited with {rc}: {cmd} (log: {log_path}); last lines: {last}")
    return elapsed


def _start(argv: Sequence[str], env: dict[str, str] | None, cwd: Path | None) -> subprocess.Popen:
    """`argv` in its own process group, stdout and stderr merged into one text pipe."""
    try:
        return subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )
    except FileNotFoundError:
        raise CompileError(
            f"{argv[0]} was not found on PATH; install TensorRT-LLM {_pinned()} (it provides trtllm-build)"
        ) from None


@contextlib.contextmanager
def _stop_on_signals(proc: subprocess.Popen) -> Iterator[list[int]]:
    """While inside: SIGTERM/SIGINT (main thread only) stop `proc` and are recorded in the yielded list; the
    previous handlers are restored on exit."""
    previous = {}
    interrupted: list[int] = []

    def on_signal(signum, _frame):
        interrupted.append(signum)
        _stop(proc)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield interrupted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pump(proc: subprocess.Popen, log: TextIO, tail: collections.deque[str], echo: TextIO | None) -> int:
    """Copy the child's output to the log, `tail` and `echo` until it exits; its exit code. Any exception
    (KeyboardInterrupt included) stops the child before it propagates."""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            tail.append(line.rstrip("\n"))
            if echo:
                echo.write(line)
                echo.flush()
        return proc.wait()
    except BaseException:
        _stop(proc)
        raise


def _pinned() -> str:
    return TRTLLM_VERSION
