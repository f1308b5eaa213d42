"""Run a real `tritonserver` on a model repository: bound to 127.0.0.1 (or a given host), validated free ports,
readiness timeout (and the listening sockets checked to be this server's), SIGTERM stop, and nothing left behind.

Two binaries are supported:
- CPU (reference backend): the `tritonserver` 2.51 bundled in the `nvidia-pytriton` wheel. Its Python
  backend is copied once into `cache_dir()/tritonserver/<pytriton>-py<X.Y>/backends` together with the stub for the
  running interpreter; the server runs with `LD_LIBRARY_PATH=<python LIBDIR>:<nvidia_pytriton.libs>` and the running
  interpreter's `bin/` first on PATH (so python models import this venv's torch/transformers).
- GPU (`tensorrtllm` backend): the NGC image's `/opt/tritonserver/bin/tritonserver` (or `tritonserver` on PATH),
  started as the repository's launch plan says (`pipeline.stages.package.launch_plan`: one process, leader-mode
  ranks under `mpirun`, or one orchestrator process that spawns each model's ranks).

The server always runs on an *installed* copy of the repository under `cache_dir()/launch` (every path parameter
absolute, see `pipeline.stages.package.install`), removed at stop. It runs in its own process group with a parent-death
signal (SIGTERM), so it stops cleanly (and releases its ports and /dev/shm regions) even when its parent is killed
with SIGKILL; its environment carries no secrets (`server_env`). Every server gets a unique Python-backend
shared-memory prefix; `stop()` sends SIGTERM (SIGKILL only after a timeout, then removes that prefix's regions).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from pipeline.core.artifacts import atomic_dir, cache_dir, stage_lock
from pipeline.core.errors import ServeError
from pipeline.core.host import visible_gpu_count
from pipeline.core.procs import parent_death_preexec, pid_alive, terminate
from pipeline.stages.package.launch_plan import (SERVER_STACK_BYTES, Endpoints, LaunchPlan, RepoShape, ServerArgs,
                                                 plan_launch, shape_from_repo)
from pipeline.stages.package.install import install_repo

SHM_DIR = Path("/dev/shm")
NGC_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
# Environment variables never handed to the server (its python models run arbitrary code and log their env): by
# name (any credential-looking word), and by value (a URL carrying a password, a well-known token format).
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|KEY|APIKEY|PAT|AUTH|COOKIE|DSN)(_|$)|"
                          r"_PWD(_|$)|SECRET|PASSWORD|APIKEY|API_KEY|ACCESS_KEY|PRIVATE_KEY|TOKEN$")
_SECRET_VALUE = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@|"
                           r"^(hf_|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|sk-|xox[abprs]-|nvapi-|AKIA|ASIA)[A-Za-z0-9_-]{8,}",
                           re.IGNORECASE)


# ------------------------------------------------------------------------------------------------- ports
def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports that are free on `host` right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    return free_ports(1, host)[0]


def check_port(port: int, what: str, host: str = "127.0.0.1") -> int:
    """`port` if it is in 1-65535 and nothing listens on it at `host`; ServeError naming it otherwise."""
    flag = f"--{what}-port"
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServeError(f"{what} port {port!r} is out of range; pass {flag} in 1-65535 (or omit it for a free one)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise ServeError(f"{what} port {port} on {host} {why}; pass another {flag} or omit it for a free one") \
                from None
    return port


SERVE_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}  # `invoke serve`'s defaults (upstream's)


def check_host(host: str) -> str:
    """`host` if it is an IP address to bind (127.0.0.1 loopback, 0.0.0.0 every interface); ServeError otherwise."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ServeError(f"--host {host!r}: expected an IP address to bind, e.g. 127.0.0.1 (this host only) or "
                         "0.0.0.0 (every interface)") from None
    return host


def serve_ports(*, host: str, offset: int = 0, given: dict[str, int | None] | None = None,
                check_free: bool = True) -> dict[str, int]:
    """endpoint -> port for `invoke serve`: a given port, else 8000/8001/8002 shifted by `offset`; each checked free
    on `host` unless `check_free` is off.

    Raises:
        ServeError: a port out of range, two endpoints on one port, or a port in use (naming it and the fix).
    """
    given = given or {}
    ports = {what: given.get(what) or base + offset for what, base in SERVE_PORTS.items()}
    if len(set(ports.values())) != len(ports):
        raise ServeError(f"http, grpc and metrics ports must differ (got {ports}); fix --http-port/--grpc-port/"
                         "--metrics-port")
    for what, port in ports.items():
        if not 1 <= port <= 65535:
            raise ServeError(f"{what} port {port} is out of range 1-65535; lower --port-offset or pass --{what}-port")
        if check_free:
            try:
                check_port(port, what, host)
            except ServeError:
                fix = f"pass another --{what}-port" if given.get(what) else \
                    f"pass --port-offset N (shifts {'/'.join(str(p + offset) for p in SERVE_PORTS.values())} by N) " \
                    f"or --{what}-port"
                raise ServeError(f"{what} port {port} on {host} is already in use (another server?); {fix}") from None
    return ports


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(d.name))
    return tree


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc; just `pid` elsewhere)."""
    if not Path("/proc/self/stat").is_file():
        return [pid]
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += tree.get(p, [])
    return out


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def _hex_address(text: str) -> tuple[str, int]:
    """/proc/net/tcp{,6} `ADDR:PORT` (address as little-endian 32-bit words) -> (host, port)."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, words), int(port, 16)
    host = ipaddress.IPv6Address(words)
    return str(host.ipv4_mapped or host), int(port, 16)  # gRPC listens on an IPv6 socket with a v4-mapped address


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(host, port) of every TCP socket in LISTEN state held by `pid` or its descendants (empty off Linux)."""
    inodes = _socket_inodes(process_tree(pid))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[9]) in inodes:
                found.add(_hex_address(f[1]))
    return found


# ------------------------------------------------------------------------------------------------- environment
def is_secret_name(name: str) -> bool:
    """True for credential-looking variable names (HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, NGC_API_KEY,
    OPENAI_KEY, GH_PAT...)."""
    return bool(_SECRET_NAME.search(name.upper()))


def is_secret_value(value: str) -> bool:
    """True for values that carry a credential whatever their name: `scheme://user:password@host...`, or a token
    in a well-known format (hf_..., ghp_..., sk-..., AKIA...)."""
    return bool(_SECRET_VALUE.search(value.strip()))


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) without secrets: the server needs none, and its models can read and log env."""
    base = dict(os.environ if base is None else base)
    return {k: v for k, v in base.items() if not is_secret_name(k) and not is_secret_value(v)}


# ------------------------------------------------------------------------------------------------- binaries
def _pytriton_dist() -> Path:
    try:
        import pytriton
    except ImportError:
        raise ServeError(
            "nvidia-pytriton is not installed; `pip install nvidia-pytriton==0.7.0` for the CPU tritonserver"
        ) from None
    dist = Path(pytriton.__file__).parent / "tritonserver"
    if not (dist / "bin" / "tritonserver").is_file():
        raise ServeError(f"{dist} has no bin/tritonserver; reinstall nvidia-pytriton==0.7.0")
    return dist


def _pytriton_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-pytriton")
    except PackageNotFoundError:
        return "unknown"


def cpu_backends_dir() -> Path:
    """Backend directory for the bundled CPU server: its python backend + the stub for this interpreter (cached)."""
    dist = _pytriton_dist()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / py / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServeError(f"nvidia-pytriton has no Python backend stub for Python {py}; use Python 3.11-3.12")
    final = cache_dir() / "tritonserver" / f"pytriton-{_pytriton_version()}-py{py}" / "backends"
    with stage_lock(final):
        if not (final / "python" / "triton_python_backend_stub").is_file():
            with atomic_dir(final, marker="python") as tmp:
                shutil.copytree(dist / "backends" / "python", tmp / "python")
                shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
    return final


def find_gpu_tritonserver() -> Path | None:
    """The NGC image's tritonserver (with the tensorrtllm backend), if this host has one."""
    if NGC_TRITONSERVER.is_file():
        return NGC_TRITONSERVER
    which = shutil.which("tritonserver")
    return Path(which) if which else None


# ------------------------------------------------------------------------------------------------- launch copies
def launch_root() -> Path:
    return cache_dir() / "launch"


def _launch_owner(name: str) -> int | None:
    """The pid encoded in a launch copy's name (`<repo>-<pid>-<hex>`, staging `.tmp-<that>-<pid>`)."""
    if name.startswith(".tmp-"):
        text = name.rsplit("-", 1)[-1]
    else:
        parts = name.rsplit("-", 2)
        text = parts[1] if len(parts) == 3 else ""
    return int(text) if text.isdigit() else None


def prune_launch_copies() -> None:
    """Remove launch copies left by processes that no longer exist (a parent killed with SIGKILL)."""
    root = launch_root()
    if not root.is_dir():
        return
    for d in root.iterdir():
        pid = _launch_owner(d.name)
        if pid is not None and pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


SHM_PREFIX = "tripipe-"


def prune_shm_regions() -> list[Path]:
    """Remove /dev/shm regions of servers whose owner (the `tripipe-<pid>-` in the name) no longer exists: a
    parent killed with SIGKILL during model load never ran `stop`. Returns what was removed."""
    removed = []
    for p in SHM_DIR.glob(f"{SHM_PREFIX}*") if SHM_DIR.is_dir() else []:
        if _dead_owner(p.name.encode()) and p.is_file():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def _dead_owner(name: bytes) -> bool:
    """True when `name` (a shared-memory region) is one of ours, `tripipe-<pid>-...`, and that pid no longer exists."""
    pid = name[len(SHM_PREFIX):].split(b"-", 1)[0] if name.startswith(SHM_PREFIX.encode()) else b""
    return pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid))


def prune_orphan_stubs() -> list[int]:
    """SIGKILL the Python-backend stubs of servers whose owner (the `tripipe-<pid>-` of the stub's shared-memory
    region) no longer exists: when the owner is killed during model load, tritonserver dies and its stubs live on,
    orphaned, holding their regions. Returns the pids killed."""
    killed = []
    for d in Path("/proc").iterdir() if Path("/proc/self").is_dir() else []:
        try:
            args = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:
            continue
        # triton_python_backend_stub <model.py> <shm region> ...
        if len(args) > 2 and args[0].endswith(b"triton_python_backend_stub") and _dead_owner(args[2]):
            with contextlib.suppress(OSError):
                os.kill(int(d.name), signal.SIGKILL)
                killed.append(int(d.name))
    return killed


def launch_repo(repo: Path, *, engine_dir: Path | None = None, draft_engine_dir: Path | None = None,
                validate: bool = True) -> Path:
    """An installed copy of `repo` under cache_dir()/launch (every path parameter absolute and checked, engine
    dirs overridden when given), which the server is started on; the caller removes it."""

    repo = Path(repo).resolve()
    prune_launch_copies()
    dest = launch_root() / f"{repo.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return install_repo(repo, dest, engine_dir=engine_dir, draft_engine_dir=draft_engine_dir, link=True,
                        validate=validate).path


@dataclass
class ServerCommand:
    """The exact argv/env a server is started with (built before anything runs; testable without a server)."""

    argv: list[str]
    env: dict[str, str]
    flavour: str  # "cpu-pytriton" | "gpu-ngc"
    plan: LaunchPlan | None = None


def build_command(
    repo: Path,
    endpoints: Endpoints,
    *,
    shm_prefix: str,
    binary: str | Path | None = None,
    world_size: int | None = None,
    log_verbose: int = 0,
    exit_timeout_s: int = 10,
) -> ServerCommand:
    """argv/env for `tritonserver` on `repo` listening on `endpoints`, from the repository's launch plan
    (`pipeline.stages.package.launch_plan`): the CPU bundle for a reference repository, else the GPU server (mpirun
    over the ranks in leader mode).

    `world_size` overrides the repository manifest's for `tensorrt_llm`; a `binary` serves even a repository without
    TensorRT-LLM models with the GPU server.
    """
    repo = Path(repo).resolve()
    env = server_env()
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # python models must not add __pycache__ to a hashed repository
    shape = shape_from_repo(repo, world_size=world_size)
    if shape.kind == "reference" and binary:
        shape = RepoShape("engine")
    server = ServerArgs(str(repo), endpoints=endpoints, shm_prefix=shm_prefix, log_verbose=log_verbose,
                        exit_timeout_s=exit_timeout_s)
    if shape.kind == "reference":
        return _cpu_command(server, env)
    exe = Path(binary) if binary else find_gpu_tritonserver()
    if exe is None:
        raise ServeError(
            f"{repo} needs the GPU tritonserver (tensorrtllm backend or TensorRT-LLM LLM API) but none is here; "
            "run inside "
            "nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 (TensorRT-LLM 1.2.1), or package with "
            "--target reference for CPU"
        )
    plan = plan_launch(shape, replace(server, binary=str(exe)), gpus_per_node=visible_gpu_count())
    env.update(plan.env)
    return ServerCommand(plan.local_argv(shutil.which("mpirun") or "mpirun"), env, "gpu-ngc", plan)


def _cpu_command(server: ServerArgs, env: dict[str, str]) -> ServerCommand:
    """The pytriton wheel's tritonserver with the Python backend, running this venv's interpreter and sources."""
    dist = _pytriton_dist()
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = dist.parent.parent / "nvidia_pytriton.libs"
    ld = [p for p in (libdir, str(libs), env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # Idle OpenMP workers of the torch stubs sleep instead of spinning: on a small, busy host spinning workers
    # compete with the stubs' health thread (see the reference tensorrt_llm model's thread settings).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # The reference backend imports pipeline.stages.calibrate.checkpoint: make this source tree importable by the Python stubs.
    src_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = ":".join(p for p in (src_root, env.get("PYTHONPATH", "")) if p)
    extra = (f"--backend-directory={cpu_backends_dir()}", f"--cache-directory={dist / 'caches'}")
    plan = plan_launch(RepoShape("reference"), replace(server, binary=str(dist / "bin" / "tritonserver"),
                                                       extra_args=extra))
    return ServerCommand(plan.local_argv(), env, "cpu-pytriton", plan)


def _server_preexec():
    """The parent-death signal plus a soft RLIMIT_STACK of at least SERVER_STACK_BYTES (capped by the hard limit)."""
    death = parent_death_preexec()

    def preexec() -> None:
        if death is not None:
            death()
        soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
        want = SERVER_STACK_BYTES if hard == resource.RLIM_INFINITY else min(SERVER_STACK_BYTES, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_STACK, (want, hard))

    return preexec


def spawn(cmd: ServerCommand, log: IO[bytes] | int | None) -> subprocess.Popen[bytes]:
    """Start `cmd` (tritonserver, or mpirun with one per rank) in its own process group with SIGTERM as its
    parent-death signal: a parent killed even by SIGKILL makes it shut down cleanly (ports, /dev/shm released;
    mpirun forwards SIGTERM to its ranks). Its threads get SERVER_STACK_BYTES stacks (see there)."""
    return subprocess.Popen(cmd.argv, env=cmd.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_server_preexec())


@dataclass
class TritonServer:
    """A running `tritonserver` (context manager). Ports are chosen free on 127.0.0.1 unless given.

    Start it from the main thread: its parent-death signal fires when the starting thread exits.

    Example:
        with TritonServer("triton_repo/tiny-llama-fp8-...-reference") as srv:
            print(srv.http_url, srv.grpc_url)
    """

    repo: Path
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    host: str = "127.0.0.1"
    log_file: Path | None = None
    ready_timeout_s: float = 180.0
    stop_timeout_s: float = 60.0
    binary: str | Path | None = None
    world_size: int | None = None  # tensorrt_llm's TP×PP (default: the repository manifest's)
    log_verbose: int = 0
    shm_prefix: str = field(default_factory=lambda: f"{SHM_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-")
    validate: bool = True
    engine_dir: Path | None = None
    draft_engine_dir: Path | None = None
    bound: dict[str, str | None] = field(default_factory=dict)  # endpoint -> "host:port" it listens on
    command: ServerCommand | None = field(default=None, init=False, repr=False)  # what start() ran
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _stubs: set[str] = field(default_factory=set, init=False, repr=False)
    _launch: Path | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    # URLs (a server bound to every address is reached on loopback) -------------------------------------------------
    @property
    def client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host

    @property
    def http_url(self) -> str:
        return f"{self.client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.client_host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def launch_dir(self) -> Path | None:
        """The installed copy the server runs on (removed by stop())."""
        return self._launch

    # Lifecycle --------------------------------------------------------------------------------------------------
    def _choose_ports(self) -> Endpoints:
        given = {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}
        for what, port in given.items():
            if port is not None:
                check_port(port, what, self.host)
        chosen = [p for p in given.values() if p is not None]
        if len(set(chosen)) != len(chosen):
            raise ServeError(f"http, grpc and metrics ports must differ (got {given})")
        spare = iter(p for p in free_ports(6, self.host) if p not in chosen)
        self.http_port = self.http_port or next(spare)
        self.grpc_port = self.grpc_port or next(spare)
        self.metrics_port = self.metrics_port or next(spare)
        return Endpoints(self.host, self.http_port, self.grpc_port, self.metrics_port)

    def start(self) -> TritonServer:
        """Start the server and wait until it reports ready; raises ServeError (with the log's tail) otherwise."""
        repo = Path(self.repo)
        if not repo.is_dir():
            raise ServeError(f"model repository {repo} does not exist; run `invoke package` first")
        endpoints = self._choose_ports()
        prune_orphan_stubs()
        prune_shm_regions()
        self._launch = launch_repo(repo, engine_dir=self.engine_dir, draft_engine_dir=self.draft_engine_dir,
                                   validate=self.validate)
        try:
            cmd = build_command(self._launch, endpoints, shm_prefix=self.shm_prefix, binary=self.binary,
                                world_size=self.world_size, log_verbose=self.log_verbose)
            if self.log_file is None:
                self.log_file = cache_dir() / "logs" / f"tritonserver-{self.shm_prefix.rstrip('-')}.log"
            self.log_file = Path(self.log_file)
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_file, "ab")  # noqa: SIM115 (held for the server's lifetime, closed in stop())
            self.command = cmd
            self._proc = spawn(cmd, self._log)
            self.wait_ready()
            self._stubs = set(self.stub_instances().values())  # at once: a stub dying from now on is reported
            self.bound = self.wait_bound()
        except BaseException:
            self.stop()
            raise
        return self

    def stub_instances(self) -> dict[int, str]:
        """pid -> model instance name (e.g. `tensorrt_llm_0_0`) of the live Python-backend stubs of this server."""
        found = {}
        for pid in process_tree(self.pid) if self.pid else []:
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # triton_python_backend_stub <model.py> <shm region> <shm size> <growth> <parent pid> <lib> <ipc> <name>
            if len(args) > 8 and args[0].endswith(b"triton_python_backend_stub"):
                found[pid] = args[8].decode(errors="replace")
        return found

    def dead_stubs(self) -> list[str]:
        """Model instances whose Python stub was running once the server was ready and is gone now (no live stub
        of the same name replaced it). tritonserver keeps such a model READY while it answers every request with
        "Stub process ... is not healthy"; `is_ready()` and `invoke serve` report it instead."""
        return sorted(self._stubs - set(self.stub_instances().values()))

    def is_ready(self) -> bool:
        """The server says ready and no model instance lost its Python stub."""
        if self._stubs and self.dead_stubs():
            return False
        import tritonclient.http as httpclient  # heavy (gevent): not at CLI start-up
        from tritonclient.utils import InferenceServerException

        client = httpclient.InferenceServerClient(self.http_url, connection_timeout=2, network_timeout=2)
        try:
            return client.is_server_ready()
        except (InferenceServerException, OSError):
            return False
        finally:
            client.close()

    @property
    def running(self) -> bool:
        """Started, not stopped, and its process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise ServeError(f"tritonserver on {self.repo} is not started (or was stopped); start() it first")
        return self._proc

    def wait_ready(self) -> None:
        proc = self._started()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServeError(
                    f"tritonserver exited with code {proc.returncode} while loading {self.repo}; "
                    f"see {self.log_file}: {self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.5)
        raise ServeError(
            f"tritonserver not ready after {self.ready_timeout_s:.0f}s on {self.repo}; see {self.log_file}: "
            f"{self.log_tail()}"
        )

    def wait_bound(self, timeout_s: float = 10.0) -> dict[str, str | None]:
        """endpoint -> "host:port" this server's process tree listens on (read from /proc; None for all off Linux).

        Raises:
            ServeError: the server exited, or after `timeout_s` some endpoint is not listening in its process tree
                (another process answered the readiness check on that port).
        """
        ports = {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}
        if not Path("/proc/net/tcp").is_file():
            return dict.fromkeys(ports)
        proc = self._started()
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise ServeError(f"tritonserver exited with code {proc.returncode} (another process answers on "
                                 f"its ports?); see {self.log_file}: {self.log_tail()}")
            listening = listening_addresses(proc.pid)
            bound = {what: next((f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in sorted(listening) if p == port),
                                None) for what, port in ports.items()}
            missing = [what for what, addr in bound.items() if addr is None]
            if not missing:
                return bound
            if time.monotonic() > deadline:
                what = missing[0]
                raise ServeError(f"tritonserver answers ready but its process does not listen on its {what} port "
                                 f"{ports[what]}: another process holds it; stop that process or choose other ports "
                                 f"(--port-offset N or --{what}-port); see {self.log_file}: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 5) -> str:
        if self.log_file is None:
            return ""
        try:
            text = Path(self.log_file).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def shm_regions(self) -> list[Path]:
        """This server's Python-backend shared-memory regions still present under /dev/shm."""
        if not SHM_DIR.is_dir():
            return []
        return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith(self.shm_prefix))

    def stop(self) -> int | None:
        """SIGTERM, wait (SIGKILL the whole process group after `stop_timeout_s`); remove leftover shm regions and
        the launch copy."""
        proc, self._proc = self._proc, None
        code = terminate(proc, grace_s=self.stop_timeout_s) if proc is not None else None
        for region in self.shm_regions():
            with contextlib.suppress(OSError):
                region.unlink()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._launch is not None:
            shutil.rmtree(self._launch, ignore_errors=True)
        self._launch = None
        return code

    def __enter__(self) -> TritonServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
