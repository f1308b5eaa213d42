"""Serving hygiene: the server dies with its parent (parent-death signal, own process group, also under mpirun),
no secrets in its environment, ports validated and reported as bound, one SIGTERM -> SIGKILL helper.

Unit tests use small Python stand-ins for the server; the slow test kills `invoke serve` with SIGKILL while a real
tritonserver runs and checks that the server, its shared-memory regions and its ports are gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.core.errors import ServeError

ROOT = Path(__file__).resolve().parents[2]


def gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout_s:.0f}s")
        time.sleep(0.2)


# ----------------------------------------------------------------------------------------------------- secrets
@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "AWS_SESSION_TOKEN",
                                  "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "DB_PASSWORD", "MY_SECRET_THING",
                                  "NGC_API_KEY", "HF_TOKEN_PATH", "GOOGLE_APPLICATION_CREDENTIALS", "hf_token",
                                  "OPENAI_KEY", "APIKEY", "GH_PAT", "DB_PASS", "MYSQL_PWD", "SENTRY_DSN",
                                  "BASIC_AUTH", "SESSION_COOKIE", "REFRESH_TOKEN"])
def test_secret_names(name):
    from pipeline.serving.serve import is_secret_name

    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "TOKENIZERS_PARALLELISM", "LD_LIBRARY_PATH", "HF_HOME",
                                  "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "KEYBOARD", "PWD",
                                  "OLDPWD", "PATCH_LEVEL", "KEYMAP", "PASSIVE_MODE", "TOKENIZER_DIR"])
def test_ordinary_names(name):
    from pipeline.serving.serve import is_secret_name

    assert not is_secret_name(name)


@pytest.mark.parametrize("value", ["postgres://app:s3cret@db.internal:5432/prod", "https://user:pw@proxy:3128",
                                   "hf_abcdefghijklmnopqrstuvwxyz", "ghp_0123456789abcdefghij", "sk-proj-abcdefghij12",
                                   "AKIAIOSFODNN7EXAMPLE"])
def test_secret_values_are_dropped_whatever_the_name(value):
    from pipeline.serving.serve import server_env

    env = server_env({"DATABASE_URL": value, "PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin"}


@pytest.mark.parametrize("value", ["https://example.com/x", "postgres://db.internal:5432/prod", "/opt/hf_cache",
                                   "skip", "1", "http://user@host/"])
def test_ordinary_values_stay(value):
    from pipeline.serving.serve import server_env

    assert server_env({"SOME_URL": value}) == {"SOME_URL": value}


def test_server_command_env_has_no_secrets(tmp_path, monkeypatch):
    from pipeline.serving.serve import build_command
    from pipeline.stages.package.launch_plan import Endpoints

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_secret")
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    env = build_command(repo, Endpoints(http_port=1, grpc_port=2, metrics_port=3), shm_prefix="p-").env
    assert "HF_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PATH"] and env["PYTHONDONTWRITEBYTECODE"] == "1"


# ------------------------------------------------------------------------------------------------------- ports
@pytest.mark.parametrize("port", [0, -1, 65536, 100000, "8000", True])
def test_port_out_of_range(port):
    from pipeline.serving.serve import check_port

    with pytest.raises(ServeError, match=r"out of range; pass --http-port in 1-65535") as info:
        check_port(port, "http")
    assert "\n" not in str(info.value)


def test_port_in_use_is_named():
    from pipeline.serving.serve import check_port, free_ports

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServeError, match=f"grpc port {port} on 127.0.0.1 is already in use; pass another "
                                             "--grpc-port"):
            check_port(port, "grpc")
    assert check_port(port, "grpc") == port  # free again once closed
    ports = free_ports(3)
    assert len(set(ports)) == 3


def test_server_refuses_busy_or_equal_ports_before_starting(tmp_path, monkeypatch):
    from pipeline.serving.serve import TritonServer

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "repo").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        srv = TritonServer(tmp_path / "repo", metrics_port=busy)
        with pytest.raises(ServeError, match=f"metrics port {busy} on 127.0.0.1 is already in use"):
            srv.start()
        assert srv.pid is None and not (tmp_path / "cache" / "launch").exists()
    with pytest.raises(ServeError, match="must differ"):
        TritonServer(tmp_path / "repo", http_port=busy, grpc_port=busy).start()


def test_serve_defaults_to_8000_8002_shifted_by_port_offset():
    from pipeline.serving.serve import serve_ports

    assert serve_ports(host="127.0.0.1", offset=100, check_free=False) == {"http": 8100, "grpc": 8101,
                                                                            "metrics": 8102}
    assert serve_ports(host="127.0.0.1", given={"grpc": 9001}, check_free=False)["grpc"] == 9001
    with pytest.raises(ServeError, match="out of range 1-65535; lower --port-offset"):
        serve_ports(host="127.0.0.1", offset=60000, check_free=False)


def test_busy_default_port_names_it_and_port_offset():
    from pipeline.serving.serve import serve_ports

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ServeError, match=f"http port {busy} on 127.0.0.1 is already in use .*--port-offset N"):
            serve_ports(host="127.0.0.1", offset=busy - 8000)
        with pytest.raises(ServeError, match=f"grpc port {busy} .* pass another --grpc-port"):
            serve_ports(host="127.0.0.1", given={"grpc": busy})


def test_host_must_be_an_address():
    from pipeline.serving.serve import check_host

    assert check_host("0.0.0.0") == "0.0.0.0"
    with pytest.raises(ServeError, match="--host 'my host': expected an IP address"):
        check_host("my host")


def test_invoke_serve_on_a_busy_port_is_an_error_not_ok(tmp_path):
    repo = _echo_repo(tmp_path / "repo")
    env = {**os.environ, "PIPELINE_CACHE": str(tmp_path / "cache"), "PIPELINE_ROOT": str(tmp_path / "out")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "invoke", "serve", "--repo", str(repo), "--http-port", str(busy)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "ok:" not in done.stdout
    assert done.stderr.strip() == f"error: http port {busy} on 127.0.0.1 is already in use (another server?); pass " \
                                  "another --http-port"


def test_readiness_from_another_process_on_the_port_is_refused(tmp_path):
    """Another process answers on the ports (the server's own bind failed): not this server's sockets -> error."""
    from pipeline.serving.serve import TritonServer

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            srv = TritonServer(tmp_path, http_port=port, grpc_port=port + 1, metrics_port=port + 2,
                               log_file=tmp_path / "log")
            srv._proc = proc
            with pytest.raises(ServeError, match=f"does not listen on its http port {port}: another process holds"):
                srv.wait_bound(timeout_s=0.5)
            proc.kill()
            proc.wait()
            with pytest.raises(ServeError, match="tritonserver exited"):
                srv.wait_bound(timeout_s=0.5)
    finally:
        proc.kill()


def test_listening_addresses_reads_proc():
    from pipeline.serving.serve import listening_addresses

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ("127.0.0.1", port) in listening_addresses(os.getpid())
    assert ("127.0.0.1", port) not in listening_addresses(os.getpid())


def test_hex_address_parsing():
    from pipeline.serving.serve import _hex_address

    assert _hex_address("0100007F:1F40") == ("127.0.0.1", 8000)
    assert _hex_address("00000000000000000000000001000000:0050") == ("::1", 80)
    assert _hex_address("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)  # v4-mapped


# ---------------------------------------------------------------------------------------------- process death
STANDIN = textwrap.dedent("""
    import os, signal, sys, time
    mark = sys.argv[1]
    def on_term(*_):
        open(mark, "a").write(f"{os.getpid()} SIGTERM\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(mark + ".ready", "a").write(f"{os.getpid()}\\n")
    while True:
        time.sleep(0.1)
""")

# mpirun stand-in: `-n 1 EXE ARGS [: -n 1 EXE ARGS]...`; forwards SIGTERM to its ranks, as Open MPI's mpirun does.
FAKE_MPIRUN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    args = [a for a in sys.argv[1:] if a != "--allow-run-as-root"]
    groups, cur = [], []
    for a in args:
        if a == ":":
            groups.append(cur); cur = []
        else:
            cur.append(a)
    groups.append(cur)
    ranks = [subprocess.Popen(g[2:]) for g in groups]
    def on_term(*_):
        for r in ranks:
            r.send_signal(signal.SIGTERM)
        for r in ranks:
            r.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    while True:
        time.sleep(0.1)
""")

PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pipeline.serving.serve import ServerCommand, build_command, spawn
    from pipeline.stages.package.launch_plan import Endpoints
    mode, exe, mark, repo = sys.argv[1:5]
    if mode == "mpirun":
        cmd = build_command(Path(repo), Endpoints(http_port=1, grpc_port=2, metrics_port=3), shm_prefix="p-",
                            binary=exe, world_size=2)
        cmd.argv = [a for a in cmd.argv if not a.startswith("--")]  # the stand-in takes no server flags
        cmd.argv = [x for a in cmd.argv for x in ([a, mark] if a == exe else [a])]
    else:
        cmd = ServerCommand([exe, mark], {}, "cpu-pytriton")
    cmd.env = {"PATH": Path(sys.executable).parent.as_posix() + ":" + mark + ".bin"}
    proc = spawn(cmd, open(mark + ".log", "ab"))
    print(proc.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("mode", ["direct", "mpirun"])
def test_server_gets_sigterm_when_its_parent_is_killed(tmp_path, mode):
    mark = tmp_path / "mark"
    bindir = tmp_path / "mark.bin"
    bindir.mkdir()
    exe = bindir / "fake-tritonserver"
    exe.write_text(f"#!{sys.executable}\n{STANDIN}")
    exe.chmod(0o755)
    mpirun = bindir / "mpirun"
    mpirun.write_text(f"#!{sys.executable}\n{FAKE_MPIRUN}")
    mpirun.chmod(0o755)
    repo = tmp_path / "repo"
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\nbackend: "tensorrtllm"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{bindir}:{os.environ['PATH']}"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, str(exe), str(mark), str(repo)], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        top = int(parent.stdout.readline())
        ranks = 2 if mode == "mpirun" else 1
        ready = Path(f"{mark}.ready")
        wait_until(lambda: ready.is_file() and len(ready.read_text().split()) == ranks, 30, "stand-ins started")
        pids = [int(p) for p in ready.read_text().split()]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_until(lambda: all(gone(p) for p in [top, *pids]), 30, "server processes exiting")
        terminated = {int(line.split()[0]) for line in mark.read_text().splitlines()}
        assert terminated == set(pids), "every server process must have received SIGTERM (a clean shutdown)"
    finally:
        for pid in (parent.pid,):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_terminate_escalates_to_sigkill_and_reaps_the_group(tmp_path):
    from pipeline.core.procs import terminate

    stubborn = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                "print(c.pid, flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    t0 = time.monotonic()
    code = terminate(proc, grace_s=1.0)
    assert code == -signal.SIGKILL and time.monotonic() - t0 < 10
    wait_until(lambda: gone(child), 10, "the group's child being killed")


def test_terminate_sends_sigterm_first(tmp_path):
    from pipeline.core.procs import terminate

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    assert terminate(proc, grace_s=10) == -signal.SIGTERM
    assert terminate(proc, grace_s=10) == -signal.SIGTERM  # already stopped: no error


# ------------------------------------------------------------------------------------------------- real server
ECHO = """
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def _echo_repo(root: Path) -> Path:
    model = root / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    (model / "1" / "model.py").write_text(ECHO)
    return root


def _start_serve(repo: Path, tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """`invoke serve --repo REPO ARGS` in its own session (stderr to tmp_path/serve.err)."""
    return subprocess.Popen([sys.executable, "-m", "invoke", "serve", "--repo", str(repo), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=(tmp_path / "serve.err").open("w"), text=True,
                            start_new_session=True)


def _bound(serve: subprocess.Popen, tmp_path: Path) -> dict[str, str]:
    """endpoint -> address from serve's "(bound)" lines, once it says it serves."""
    try:
        lines = _read_until(serve, "(Ctrl-C to stop)", 240)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; stderr: {(tmp_path / 'serve.err').read_text()[-2000:]}") from None
    return {ln.split()[0]: ln.split()[1] for ln in lines if ln.endswith("(bound)")}


def _read_until(proc: subprocess.Popen, marker: str, timeout_s: float) -> list[str]:
    import queue
    import threading

    lines: list[str] = []
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in proc.stdout] + [q.put(None)], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} from `invoke serve` within {timeout_s:.0f}s: {lines}")


@pytest.mark.slow
def test_kill_9_of_invoke_serve_leaves_nothing(tmp_path):
    from pipeline.serving.serve import SHM_DIR, check_port, free_ports, listening_addresses, process_tree

    repo = _echo_repo(tmp_path / "repo")
    # distinctive values: a short one ("pw") can occur by chance inside a random temporary path of the environment
    secrets = {name: f"s3cret-value-of-{name.lower()}" for name in
               ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_TOKEN")}
    env = {**os.environ, **secrets, "PIPELINE_CACHE": str(tmp_path / "cache")}
    ports = [f"--{what}-port={port}" for what, port in zip(("http", "grpc", "metrics"), free_ports(3))]
    serve = _start_serve(repo, tmp_path, env, *ports)
    server = None
    try:
        bound = _bound(serve, tmp_path)
        assert set(bound) == {"http", "grpc", "metrics"}, bound
        server = next(p for p in process_tree(serve.pid)
                      if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver")
        listening = {f"{h}:{p}" for h, p in listening_addresses(server)}
        assert set(bound.values()) <= listening and all(v.startswith("127.0.0.1:") for v in bound.values())
        environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
        names = {e.split(b"=", 1)[0].decode() for e in environ if e}
        assert not names & set(secrets), names & set(secrets)
        assert not any(v.encode() in environ_entry for v in secrets.values() for environ_entry in environ)
        prefix = f"tripipe-{serve.pid}-"
        assert [p for p in SHM_DIR.iterdir() if p.name.startswith(prefix)], "the python backend holds regions"

        os.kill(serve.pid, signal.SIGKILL)
        serve.wait()
        wait_until(lambda: gone(server), 60, "tritonserver exiting after its parent was killed")
        wait_until(lambda: not [p for p in SHM_DIR.iterdir() if p.name.startswith(prefix)], 30,
                   "its /dev/shm regions disappearing")
        for what, addr in bound.items():
            check_port(int(addr.rsplit(":", 1)[1]), what)  # released
    finally:
        if serve.poll() is None:
            serve.kill()
        if server is not None and not gone(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.slow
def test_invoke_serve_host_0000_binds_every_interface(tmp_path):
    from pipeline.serving.serve import free_ports, listening_addresses, process_tree

    repo = _echo_repo(tmp_path / "repo")
    env = {**os.environ, "PIPELINE_CACHE": str(tmp_path / "cache")}
    http, grpc, metrics = free_ports(3, "0.0.0.0")
    serve = _start_serve(repo, tmp_path, env, "--host", "0.0.0.0", "--http-port", str(http), "--grpc-port", str(grpc),
                         "--metrics-port", str(metrics))
    try:
        bound = _bound(serve, tmp_path)
        # gRPC binds 0.0.0.0 as a dual-stack IPv6 socket ([::]: every IPv4 and IPv6 address)
        assert bound["http"] == f"0.0.0.0:{http}" and bound["metrics"] == f"0.0.0.0:{metrics}"
        assert bound["grpc"] in (f"0.0.0.0:{grpc}", f"[::]:{grpc}")
        server = next(p for p in process_tree(serve.pid)
                      if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver")
        listening = listening_addresses(server)
        assert {("0.0.0.0", http), ("0.0.0.0", metrics)} <= listening
        assert ("0.0.0.0", grpc) in listening or ("::", grpc) in listening
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=120) == 0
    finally:
        if serve.poll() is None:
            serve.kill()


def test_next_server_start_removes_shm_regions_of_dead_owners(tmp_path, monkeypatch):
    """A parent SIGKILLed during model load leaves `tripipe-<pid>-...` regions in /dev/shm: the next server start
    removes those whose owner pid is dead, and keeps a live owner's (issue 22)."""
    from pipeline.serving import serve
    from tests.support.dead_pid import dead_pid

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(serve, "SHM_DIR", shm)
    dead = shm / f"tripipe-{dead_pid()}-0123abcd-tensorrt_llm_0_0"
    live = shm / f"tripipe-{os.getppid()}-0123abcd-tensorrt_llm_0_0"
    other = shm / f"{dead_pid()}-not-ours"
    for p in (dead, live, other):
        p.write_bytes(b"\0" * 64)

    def stop_here(*_a, **_k):
        raise ServeError("stopped after the shm pruning")

    monkeypatch.setattr(serve, "launch_repo", stop_here)
    repo = tmp_path / "repo"
    repo.mkdir()
    with pytest.raises(ServeError, match="stopped after"):
        serve.TritonServer(repo=repo).start()
    assert not dead.exists() and live.exists() and other.exists()


def test_next_server_start_kills_orphaned_stubs_of_dead_owners(tmp_path):
    """tritonserver killed during model load (its owner got SIGKILL) leaves its Python stubs running, orphaned, on
    their `tripipe-<dead pid>-...` regions: the next start kills those, and no stub of a live owner."""
    from pipeline.serving import serve
    from tests.support.dead_pid import dead_pid

    (tmp_path / "model.py").write_text("sleep 120\n")  # run by /bin/sh under a stub's argv

    def stub(region: str) -> subprocess.Popen:
        return subprocess.Popen([str(tmp_path / "triton_python_backend_stub"), "model.py", region, "1048576"],
                                executable="/bin/sh", cwd=tmp_path)

    orphan = stub(f"tripipe-{dead_pid()}-0123abcd-0_e6d4")
    live = stub(f"tripipe-{os.getpid()}-0123abcd-0_e6d4")
    other = stub(f"{dead_pid()}-not-ours")
    try:
        wait_until(lambda: all(Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(str(tmp_path).encode())
                               for p in (orphan, live, other)), 10, "stand-in stubs")
        assert serve.prune_orphan_stubs() == [orphan.pid]
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert live.poll() is None and other.poll() is None
    finally:
        for p in (orphan, live, other):
            p.kill()
            p.wait()
