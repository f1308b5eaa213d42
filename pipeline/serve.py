"""Run a real `tritonserver` on a model repository: bound to 127.0.0.1, free ports, readiness timeout, SIGTERM stop.

Two binaries are supported:
- CPU (reference backend): the `tritonserver` 2.51 bundled in the `nvidia-pytriton` wheel (FACTS §5). Its Python
  backend is copied once into `cache_dir()/tritonserver/<pytriton>-py<X.Y>/backends` together with the stub for the
  running interpreter; the server runs with `LD_LIBRARY_PATH=<python LIBDIR>:<nvidia_pytriton.libs>` and the running
  interpreter's `bin/` first on PATH (so python models import this venv's torch/transformers).
- GPU (`tensorrtllm` backend): the NGC image's `/opt/tritonserver/bin/tritonserver` (or `tritonserver` on PATH);
  world size > 1 runs one process per rank under `mpirun` (what the backend's launch_triton_server.py does).

Every server gets a unique Python-backend shared-memory prefix; `stop()` sends SIGTERM (SIGKILL only after a
timeout, then removes that prefix's /dev/shm regions), so no region is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .artifacts import atomic_dir, cache_dir, stage_lock
from .errors import ServeError

SHM_DIR = Path("/dev/shm")
NGC_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
        raise ServeError(f"nvidia-pytriton has no Python backend stub for Python {py}; use Python 3.10-3.12")
    final = cache_dir() / "tritonserver" / f"pytriton-{_pytriton_version()}-py{py}" / "backends"
    with stage_lock(final):
        if not (final / "python" / "triton_python_backend_stub").is_file():
            with atomic_dir(final) as tmp:
                shutil.copytree(dist / "backends" / "python", tmp / "python")
                shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
    return final


def _repo_backends(repo: Path) -> set[str]:
    """Backends named by the repository's model configs (`backend: "..."` lines)."""
    found = set()
    for cfg in Path(repo).glob("*/config.pbtxt"):
        for line in cfg.read_text().splitlines():
            line = line.strip()
            if line.startswith("backend:"):
                found.add(line.split(":", 1)[1].strip().strip('"'))
    return found


def find_gpu_tritonserver() -> Path | None:
    """The NGC image's tritonserver (with the tensorrtllm backend), if this host has one."""
    if NGC_TRITONSERVER.is_file():
        return NGC_TRITONSERVER
    which = shutil.which("tritonserver")
    return Path(which) if which else None


def launch_repo(repo: Path) -> Path:
    """The repository to hand to tritonserver: `repo` itself, or (when a `tensorrtllm` model has a relative
    `gpt_model_path`, which the C++ backend would resolve against the server's cwd) a copy under
    cache_dir()/launch with those paths made absolute. Python (reference) models resolve relative paths themselves.
    """
    import re

    repo = Path(repo).resolve()
    pattern = re.compile(r'(key: "gpt_model_path"\s*value: \{ string_value: ")([^"]*)(")')
    rewrites = {}
    for cfg in repo.glob("*/config.pbtxt"):
        text = cfg.read_text()
        if 'backend: "tensorrtllm"' not in text:
            continue
        match = pattern.search(text)
        if match and match.group(2) and not Path(match.group(2)).is_absolute():
            absolute = (cfg.parent / match.group(2)).resolve()
            rewrites[cfg.parent.name] = pattern.sub(lambda m, a=absolute: m.group(1) + str(a) + m.group(3), text)
    if not rewrites:
        return repo
    dest = cache_dir() / "launch" / f"{repo.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    shutil.copytree(repo, dest)
    for model, text in rewrites.items():
        (dest / model / "config.pbtxt").write_text(text)
    return dest


@dataclass
class ServerCommand:
    """The exact argv/env a server is started with (built before anything runs; testable without a server)."""

    argv: list[str]
    env: dict[str, str]
    flavour: str  # "cpu-pytriton" | "gpu-ngc"


def build_command(
    repo: Path,
    *,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    shm_prefix: str,
    host: str = "127.0.0.1",
    binary: str | Path | None = None,
    world_size: int = 1,
    log_verbose: int = 0,
    exit_timeout_s: int = 10,
) -> ServerCommand:
    """argv/env for `tritonserver` on `repo` (CPU bundle unless the repo needs the tensorrtllm backend)."""
    repo = Path(repo).resolve()
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # python models must not add __pycache__ to a hashed repository
    needs_trtllm = "tensorrtllm" in _repo_backends(repo)
    common = [
        f"--model-repository={repo}",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--exit-timeout-secs={exit_timeout_s}",
        f"--log-verbose={log_verbose}",
    ]
    if needs_trtllm or binary:
        exe = Path(binary) if binary else find_gpu_tritonserver()
        if exe is None:
            raise ServeError(
                f"{repo} uses the tensorrtllm backend but no tritonserver with it is here; run inside "
                "nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 (TensorRT-LLM 1.2.1), or package with "
                "--target reference for CPU"
            )
        trtllm_models = sorted(
            cfg.parent.name for cfg in repo.glob("*/config.pbtxt") if 'backend: "tensorrtllm"' in cfg.read_text()
        )
        if len(trtllm_models) > 1:
            # Draft + target in one server: orchestrator mode (launch_triton_server.py --multi-model).
            env["TRTLLM_ORCHESTRATOR"] = "1"
            env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] = "1"
        if world_size <= 1:
            return ServerCommand([str(exe), *common, "--disable-auto-complete-config"], env, "gpu-ngc")
        # Leader mode: one process per rank under mpirun; rank 0 serves every model and the endpoints, the other
        # ranks load only the tensorrt_llm model(s) (what the backend's launch_triton_server.py does).
        argv = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root"]
        for rank in range(world_size):
            if rank:
                argv.append(":")
                rank_args = [
                    f"--model-repository={repo}",
                    "--allow-http=false",
                    "--allow-grpc=false",
                    "--allow-metrics=false",
                    "--model-control-mode=explicit",
                    *(f"--load-model={m}" for m in trtllm_models),
                    f"--backend-config=python,shm-region-prefix-name={shm_prefix}r{rank}-",
                ]
            else:
                rank_args = common
            argv += ["-n", "1", str(exe), *rank_args, "--disable-auto-complete-config"]
        return ServerCommand(argv, env, "gpu-ngc")
    dist = _pytriton_dist()
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = dist.parent.parent / "nvidia_pytriton.libs"
    ld = [p for p in (libdir, str(libs), env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # Idle OpenMP workers of the torch stubs sleep instead of spinning: on a small, busy host spinning workers
    # compete with the stubs' health thread (see the reference tensorrt_llm model's thread settings).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # The reference backend imports pipeline.checkpoint: make this source tree importable by the Python stubs.
    src_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = ":".join(p for p in (src_root, env.get("PYTHONPATH", "")) if p)
    argv = [
        str(dist / "bin" / "tritonserver"),
        *common,
        f"--backend-directory={cpu_backends_dir()}",
        f"--cache-directory={dist / 'caches'}",
    ]
    return ServerCommand(argv, env, "cpu-pytriton")


@dataclass
class TritonServer:
    """A running `tritonserver` (context manager). Ports are chosen free on 127.0.0.1 unless given.

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
    world_size: int = 1
    log_verbose: int = 0
    shm_prefix: str = field(default_factory=lambda: f"tripipe-{os.getpid()}-{uuid.uuid4().hex[:8]}-")
    validate: bool = True
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _launch: Path | None = field(default=None, init=False, repr=False)
    _log: object = field(default=None, init=False, repr=False)

    # URLs -------------------------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # Lifecycle --------------------------------------------------------------------------------------------------
    def start(self) -> TritonServer:
        """Start the server and wait until it reports ready; raises ServeError (with the log's tail) otherwise."""
        repo = Path(self.repo)
        if not repo.is_dir():
            raise ServeError(f"model repository {repo} does not exist; run `invoke package` first")
        self.http_port = self.http_port or free_port(self.host)
        self.grpc_port = self.grpc_port or free_port(self.host)
        self.metrics_port = self.metrics_port or free_port(self.host)
        if len({self.http_port, self.grpc_port, self.metrics_port}) != 3:
            raise ServeError("http, grpc and metrics ports must differ")
        if self.validate:
            from .triton.validate import validate_repo

            validate_repo(repo)
        self._launch = launch_repo(repo)
        cmd = build_command(
            self._launch,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            shm_prefix=self.shm_prefix,
            host=self.host,
            binary=self.binary,
            world_size=self.world_size,
            log_verbose=self.log_verbose,
        )
        if self.log_file is None:
            self.log_file = cache_dir() / "logs" / f"tritonserver-{self.shm_prefix.rstrip('-')}.log"
        self.log_file = Path(self.log_file)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "ab")  # noqa: SIM115 (held for the server's lifetime, closed in stop())
        self._proc = subprocess.Popen(
            cmd.argv, env=cmd.env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServeError(
                    f"tritonserver exited with code {self._proc.returncode} while loading {self.repo}; "
                    f"see {self.log_file}: {self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.5)
        raise ServeError(
            f"tritonserver not ready after {self.ready_timeout_s:.0f}s on {self.repo}; see {self.log_file}: "
            f"{self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
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
        """SIGTERM, wait (SIGKILL the whole process group after `stop_timeout_s`); remove leftover shm regions."""
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            code = proc.returncode
            # Python-backend stubs are children of the server: make sure none outlives it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for region in self.shm_regions():
            with contextlib.suppress(OSError):
                region.unlink()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._launch is not None and self._launch != Path(self.repo).resolve():
            shutil.rmtree(self._launch, ignore_errors=True)
        self._launch = None
        return code

    def __enter__(self) -> TritonServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
