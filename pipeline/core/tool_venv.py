"""A command-line tool whose pins we cannot share (NVIDIA AIPerf, ...): installed on first use into its own venv
under the cache (`<cache>/<venv_name>`), or taken from an environment variable naming an existing install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.artifacts import cache_dir
from pipeline.core.errors import HostError

INSTALL_TIMEOUT_S = 1800
INSTALLED_MARKER = "installed.ok"


@dataclass(frozen=True)
class VenvTool:
    """One tool: what to pip-install, the executable it provides, the override variable and the venv's name."""

    requirement: str  # e.g. "aiperf==0.13.*"
    executable: str  # e.g. "aiperf", in the venv's bin/
    env: str  # e.g. "PIPELINE_AIPERF=/path/to/aiperf" uses that install instead
    venv_name: str  # e.g. "aiperf-venv"

    @property
    def venv(self) -> Path:
        return cache_dir() / self.venv_name

    def located(self) -> str | None:
        """The executable without installing anything: $env when set, else the cache venv's when fully installed.

        Raises:
            HostError: $env names no file.
        """
        override = os.environ.get(self.env)
        if override:
            if not Path(override).is_file():
                raise HostError(f"{self.env}={override} is not a file; point it at the {self.executable} executable "
                                "or unset it")
            return override
        exe = self.venv / "bin" / self.executable
        return str(exe) if exe.is_file() and (self.venv / INSTALLED_MARKER).is_file() else None

    def ensure(self, *, quiet: bool = False) -> str:
        """The executable: `located()`, else a fresh venv with `requirement` pip-installed (first use).

        Raises:
            HostError: the install failed (exit 4).
        """
        found = self.located()
        if found:
            return found
        venv = self.venv
        if not quiet:
            print(f"installing {self.requirement} into {venv} (first use) ...", file=sys.stderr)
        shutil.rmtree(venv, ignore_errors=True)
        for argv in ([sys.executable, "-m", "venv", str(venv)],
                     [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", self.requirement]):
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
                failure = None if done.returncode == 0 else ((done.stderr or done.stdout).strip().splitlines()
                                                             or ["no output"])[-1][:300]
            except (OSError, subprocess.TimeoutExpired) as exc:
                failure = str(exc)
            if failure is not None:
                shutil.rmtree(venv, ignore_errors=True)
                raise HostError(f"installing {self.requirement} failed: {failure}; check network access to PyPI or "
                                f"set {self.env}=/path/to/{self.executable}")
        (venv / INSTALLED_MARKER).write_text(self.requirement + "\n")
        return str(venv / "bin" / self.executable)
