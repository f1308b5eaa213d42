"""Debian's Prometheus for tests: `promtool` and a `prometheus` server on 127.0.0.1 (private data dir, free port).

The `prometheus` package is installed when missing; if that fails the fixture fails with apt's reason (never a skip).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

PACKAGES = ("prometheus",)
BINARIES = ("prometheus", "promtool")


def ensure_prometheus() -> None:
    if all(shutil.which(b) for b in BINARIES):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if res.returncode:
            raise RuntimeError(f"cannot install {' '.join(PACKAGES)} ({' '.join(cmd)} exit {res.returncode}): "
                               f"{(res.stderr or res.stdout)[-800:]}")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """`prometheus` running `scrape_configs` (every second unless they say otherwise), evaluating `rules` every
    second."""

    def __init__(self, directory: Path, *, scrape_configs: list[dict], rules: Path):
        self.dir = directory
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(rules)],
                  "scrape_configs": scrape_configs}
        self.config = directory / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> Prometheus:
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-800:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"prometheus not ready after {timeout_s}s: {self.log.read_text()[-800:]}")

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def value(self, expr: str) -> float | None:
        """The instant value of `expr` (its first series), None when it has none (or NaN)."""
        result = self.api("query", query=expr)["result"]
        if not result:
            return None
        v = float(result[0]["value"][1])
        return None if v != v else v

    def alert_states(self, name: str) -> set[str]:
        """States (pending / firing) of the active alerts named `name`."""
        return {a["state"] for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name}

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
