"""A single-node Slurm cluster on this machine for tests: munged + slurmctld + slurmd, private sockets and ports.

Partition `cpu` is this host (node0, real jobs); partition `gpu` holds two 8-GPU nodes shaped like
a DGX H100 (112 cores, 2 TB) that never run anything, so
`sbatch --test-only` can check a multi-node script against a real controller. Debian's `slurm-wlm` and `munge` are
installed when missing; if that fails the fixture fails with apt's reason (never a skip).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")


def ensure_packages() -> None:
    if all(shutil.which(b) for b in BINARIES):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if res.returncode:
            raise RuntimeError(f"cannot install {' '.join(PACKAGES)} ({' '.join(cmd)} exit {res.returncode}): "
                               f"{(res.stderr or res.stdout)[-800:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host_mib() -> int:
    """This host's memory in MiB, a little under MemTotal (slurmd drains a node configured with more than it has)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 9 // 10 // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _config(d: Path) -> str:
    host = socket.gethostname()
    return "\n".join([
        "ClusterName=pipelinetest", "SlurmctldHost=localhost", "SlurmUser=root", "SlurmdUser=root",
        "MailProg=/bin/true", "AuthType=auth/munge", f"AuthInfo=socket={d}/munge.sock", "CredType=cred/munge",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool", f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd.pid", f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none", "MpiDefault=none",
        "ReturnToService=2", "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log", "GresTypes=gpu",
        f"NodeName=node0 NodeHostname={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={_host_mib()}",
        "NodeName=gpu[1-2] NodeHostname=gpuhost[1-2] NodeAddr=127.0.0.1 CPUs=112 Gres=gpu:8 RealMemory=2000000",
        "PartitionName=cpu Nodes=node0 Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=gpu Nodes=gpu[1-2] MaxTime=INFINITE State=UP", ""])


class SlurmCluster:
    """Start with `start()`, stop with `stop()` (every daemon by its pid file)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _run(self, *cmd: str) -> None:
        res = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exit {res.returncode}: {res.stderr[-500:]} {self.log_tail()}")

    def start(self) -> SlurmCluster:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy("/etc/munge/munge.key", d / "munge.key")
        (d / "munge.key").chmod(0o600)
        self.conf.write_text(_config(d))
        self._run("munged", "--force", f"--socket={d}/munge.sock", f"--key-file={d}/munge.key",
                  f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed")
        self._run("slurmctld")
        self._run("slurmd", "-N", "node0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            res = subprocess.run(["sinfo", "-h", "-p", "cpu", "-o", "%t"], capture_output=True, text=True,
                                 env=self.env)
            if res.stdout.strip() == "idle":
                return self
            time.sleep(1)
        raise RuntimeError(f"slurm node0 never became idle: {self.log_tail()}")

    def log_tail(self) -> str:
        logs = [p for p in (self.dir / "slurmctld.log", self.dir / "slurmd.log") if p.is_file()]
        return " | ".join(p.read_text(errors="replace")[-400:] for p in logs)

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.dir / f"{name}.pid"
            if pid_file.is_file():
                try:
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(1)
