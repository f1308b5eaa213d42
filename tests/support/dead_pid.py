"""A process id that no longer exists: what a killed run leaves in the names of its temporaries."""

from __future__ import annotations

import subprocess


def dead_pid() -> int:
    """The pid of a `true` that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
