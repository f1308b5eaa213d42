"""A DynamoGraphDeployment (`pipeline.ops.deploy.dynamo`) run as local processes on 127.0.0.1, with Dynamo's engine
simulator (`dynamo.mocker`) in place of the TensorRT-LLM workers: a CPU stand-in for the rendered graph.

The Frontend runs its rendered argv (router flags included) on a free port; each worker component runs `replicas`
mockers taking the rendered `--served-model-name` and `--disaggregation-mode` (the LLM-API YAML and the TensorRT-LLM
publishing flags have no mocker counterpart; the mocker always publishes KV events). Discovery is file-based under
the run's directory (no etcd, no NATS), `HOME` (Dynamo's caches) too, and every process is stopped by PID on exit.
Dynamo 1.6.1's direct-ZMQ event publishers bind every interface (`tcp://0.0.0.0:0`, not configurable) but advertise
and are reached on 127.0.0.1; everything else binds 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import HostError

PYTHON_ENV = "PIPELINE_DYNAMO_PYTHON"  # the Python of a Dynamo 1.6.1 install (default: the checkout's .venv-dynamo)
LOCAL_ENV = {"DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_EVENT_PLANE_HOST": "127.0.0.1",
             "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1"}
PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")
MOCKER_ENGINE = {"agg": "trtllm", "prefill": "vllm", "decode": "vllm"}  # its TRT-LLM mode refuses the hand-off
ROLE_OF_TYPE = {"worker": "agg", "prefill": "prefill", "decode": "decode"}


def dynamo_python() -> Path | None:
    """The Python of the Dynamo install: $PIPELINE_DYNAMO_PYTHON, else `.venv-dynamo` of this checkout
    (`scripts/setup.sh`); None when neither has Dynamo's frontend."""
    given = os.environ.get(PYTHON_ENV)
    exe = Path(given) if given else Path(__file__).resolve().parents[2] / ".venv-dynamo" / "bin" / "python"
    return exe if exe.is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _main_container(component: dict[str, Any]) -> dict[str, Any]:
    return component["podTemplate"]["spec"]["containers"][0]


def _value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def frontend_argv(component: dict[str, Any], port: int) -> list[str]:
    """The rendered Frontend's arguments on `port` of 127.0.0.1, with file discovery."""
    args = list(_main_container(component)["args"])
    if "--http-port" in args:
        args[args.index("--http-port") + 1] = str(port)
    return [*args, "--http-host", "127.0.0.1", *PLANES]


def mocker_argv(component: dict[str, Any], model_dir: Path, kv_blocks: int) -> list[str]:
    """A mocker standing in for one copy of the rendered worker component, on `model_dir` (its tokenizer and
    config; no weights are read) with `kv_blocks` KV blocks."""
    role = ROLE_OF_TYPE[component["type"]]
    rendered = list(_main_container(component)["args"])
    argv = ["-m", "dynamo.mocker", "--engine-type", MOCKER_ENGINE[role], "--model-path", str(model_dir),
            "--num-gpu-blocks-override", str(kv_blocks), *PLANES]
    served = _value(rendered, "--served-model-name")
    if served:
        argv += ["--model-name", served]
    if role != "agg":
        argv += ["--disaggregation-mode", role]
    return argv


@dataclass
class LocalGraph:
    """The processes of one graph: `with LocalGraph(dgd, model_dir, run_dir) as g:` then `g.url` (OpenAI HTTP)."""

    dgd: dict[str, Any]
    model_dir: Path
    run_dir: Path
    kv_blocks: int = 200
    ready_timeout_s: float = 60.0
    python: Path | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalGraph:
        exe = self.python or dynamo_python()
        if exe is None:
            raise HostError(f"no Dynamo install: run scripts/setup.sh (it installs .venv-dynamo) or set {PYTHON_ENV}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **LOCAL_ENV, "HF_HUB_OFFLINE": "1", "HOME": str(self.run_dir / "home"),
               "DYN_FILE_KV": str(self.run_dir / "discovery"), "TMPDIR": str(self.run_dir)}
        self.port = free_port()
        workers = 0
        try:
            for c in self.dgd["spec"]["components"]:
                if c["type"] == "frontend":
                    self._start(exe, frontend_argv(c, self.port), env, "frontend")
                    continue
                for i in range(int(c.get("replicas", 1))):
                    self._start(exe, mocker_argv(c, self.model_dir, self.kv_blocks), env, f"{c['name']}-{i}")
                    workers += 1
            self._wait_ready(workers)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self, exe: Path, argv: list[str], env: dict[str, str], name: str) -> None:
        log = open(self.run_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        with log:
            self.procs.append(subprocess.Popen([str(exe), *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def _wait_ready(self, workers: int) -> None:
        """Until the frontend lists the model and has registered every worker (its router metrics count them)."""
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            dead = [p.pid for p in self.procs if p.poll() is not None]
            if dead:
                raise HostError(f"a Dynamo process (PID {dead[0]}) exited at start-up; see the logs in "
                                f"{self.run_dir}")
            if self._registered() >= workers:
                return
            time.sleep(0.2)
        raise HostError(f"the Dynamo graph was not ready in {self.ready_timeout_s:.0f}s; see the logs in "
                        f"{self.run_dir}")

    def _registered(self) -> int:
        """Workers whose `generate` endpoint is in the file discovery store, once the frontend lists a model."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as r:
                if b'"id"' not in r.read():
                    return 0
        except OSError:
            return 0
        instances = self.run_dir / "discovery" / "v1" / "instances"
        return sum(1 for p in instances.glob("*") if "generate" in p.name) if instances.is_dir() else 0

    def stop(self) -> None:
        """SIGTERM each process group by PID, then SIGKILL what is left of it after 10 s."""
        for pid in self.alive():
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid in self.alive():  # the leader or a child of its ignored SIGTERM
            os.killpg(pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def alive(self) -> list[int]:
        """PIDs of the graph's processes whose process group still has a member (a child of theirs included)."""
        out = []
        for p in self.procs:
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            out.append(p.pid)
        return out
