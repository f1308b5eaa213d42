"""The launch plan: one table of layouts (upstream's launch_triton_server.py semantics), and `serve`, Kubernetes and
Slurm starting the same processes for each layout."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import DeployError, ServeError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.runtime import HISTOGRAM_LATENCIES
from pipeline.stages.package.launch_plan import (
    ORCHESTRATOR_ASSERT,
    ORCHESTRATOR_ENV,
    Endpoints,
    EngineModel,
    RepoShape,
    ServerArgs,
    plan_launch,
    shape_from_repo,
    shape_from_spec,
)
from tests.support.k8s import PIPELINE_IMAGE

EP = Endpoints("0.0.0.0", 8000, 8001, 8002)
TARGET = "tensorrt_llm"
DRAFT = "tensorrt_llm_draft"


@pytest.fixture
def out_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _plan(shape, *, nodes=1, gpus_per_node=None, error=ServeError, **server):
    args = ServerArgs("/r", "tritonserver", EP, **server)
    return plan_launch(shape, args, nodes=nodes, gpus_per_node=gpus_per_node, error=error)


def _engine(*models):
    return RepoShape("engine", tuple(models))


# (layout, shape, host kw, mode, processes, orchestrator env)
LAYOUTS = [
    ("single", _engine(EngineModel(TARGET, 1)), {}, "single", 1, False),
    ("leader tp2", _engine(EngineModel(TARGET, 2)), {}, "leader", 2, False),
    ("leader tp4", _engine(EngineModel(TARGET, 4)), {}, "leader", 4, False),
    ("leader tp2 x pp2", shape_from_spec(resolve_spec(model="llama-70b", precision="fp8", tp=2, pp=2,
                                                      target="trtllm")), {}, "leader", 4, False),
    ("orchestrator tp1 + draft", _engine(EngineModel(TARGET, 1, (0,)), EngineModel(DRAFT, 1, (0,))),
     {"gpus_per_node": 1}, "orchestrator", 1, True),
    ("tp4 target + tp1 draft", shape_from_spec(resolve_spec(model="llama-70b", precision="fp8", tp=4,
                                                            draft="llama-1b", target="trtllm")),
     {"gpus_per_node": 4}, "orchestrator", 1, True),
    ("multi-node leader 8 x 2", _engine(EngineModel(TARGET, 16)), {"nodes": 2, "gpus_per_node": 8}, "leader", 16,
     False),
]


@pytest.mark.parametrize(("layout", "shape", "host", "mode", "processes", "orchestrator"), LAYOUTS,
                         ids=[row[0] for row in LAYOUTS])
def test_layout_table(layout, shape, host, mode, processes, orchestrator):
    plan = _plan(shape, **host)
    assert (plan.mode, plan.processes, plan.ranks_launched) == (mode, processes, processes > 1)
    first = plan.ranks[0]
    assert first[0] == "tritonserver" and "--model-repository=/r" in first
    assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002", "--http-address=0.0.0.0"} <= set(first)
    assert not any(a.startswith("--load-model") for a in first)  # rank 0 serves every model
    for i, rank in enumerate(plan.ranks):  # upstream: shm-region-prefix-name=prefix{i}_
        assert f"--backend-config=python,shm-region-prefix-name=prefix{i}_" in rank
    for rank in plan.ranks[1:]:  # leader mode, ranks >= 1: only tensorrt_llm, endpoints off
        assert {"--model-control-mode=explicit", f"--load-model={TARGET}", "--allow-http=false",
                "--allow-grpc=false", "--allow-metrics=false"} <= set(rank)
        assert not any(a.startswith(("--http-port", "--grpc-port", "--metrics-port")) for a in rank)
    if orchestrator:
        # launch_triton_server.py: --multi-model asserts world size 1 (ORCHESTRATOR_ASSERT); the backend spawns
        assert plan.env == ORCHESTRATOR_ENV and ORCHESTRATOR_ASSERT in plan.source
        gpus = host["gpus_per_node"]
        pools = [a for a in first if a.startswith("--cuda-memory-pool-byte-size=")]
        assert pools == [f"--cuda-memory-pool-byte-size={j}:0" for j in range(gpus)]
        assert {"--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"} <= set(first)
    else:
        assert plan.env == {} and not any("memory-pool" in a for a in first)


# ------------------------------------------------------------------------------ our argv == the launcher's get_cmd
GET_CMD = json.loads((Path(__file__).parents[2] / "data" / "launch_triton_server_get_cmd.json").read_text())
# What our argv changes in the launcher's, per segment: rank 0 binds its endpoints to an address and sets the log
# level; ranks >= 1 turn the endpoints off instead of repeating rank 0's ports (their backend never serves).
RANK0_ADDED = {"--http-address", "--grpc-address", "--metrics-address", "--log-verbose"}
WORKER_ADDED = {"--allow-http", "--allow-grpc", "--allow-metrics", "--log-verbose"}
WORKER_DROPPED = {"--http-port", "--grpc-port", "--metrics-port"}


def _get_cmd(case: str) -> list[str]:
    return next(c["argv"] for c in GET_CMD["cases"] if c["case"] == case)


def _segments(argv: list[str]) -> tuple[list[str], list[tuple[list[str], dict[str, set[str]]]]]:
    """The mpirun options, then each `-n 1 PROGRAM... --flag=value ...` segment as (programs, flag -> values)."""
    start = argv.index("-n")
    words = " ".join(argv[start:]).split(" : ")
    segments = []
    for text in filter(None, (w.strip(" :") for w in words)):
        tokens = text.split()
        assert tokens[:2] == ["-n", "1"], text
        programs = [t for t in tokens[2:] if not t.startswith("--")]
        flags: dict[str, set[str]] = {}
        for t in tokens[2 + len(programs):]:
            name, _, value = t.partition("=")
            flags.setdefault(name, set()).add(value)
        segments.append((programs, flags))
    return argv[:start], segments


def _assert_as_launched(ours: list[str], case: str) -> None:
    """`ours` starts what get_cmd starts, field by field: the mpirun options, the segments, each segment's programs
    and every flag's values, but for the documented RANK0_ADDED / WORKER_ADDED / WORKER_DROPPED."""
    up_mpi, up = _segments(_get_cmd(case))
    our_mpi, mine = _segments(ours)
    assert our_mpi == up_mpi and len(mine) == len(up)
    for i, ((up_prog, up_flags), (our_prog, our_flags)) in enumerate(zip(up, mine)):
        assert our_prog == up_prog, i
        added, dropped = (RANK0_ADDED, set()) if i == 0 else (WORKER_ADDED, WORKER_DROPPED)
        assert set(our_flags) - set(up_flags) == added and set(up_flags) - set(our_flags) == dropped, i
        for name in set(up_flags) - dropped:
            assert our_flags[name] == up_flags[name], (i, name)


def test_leader_tp4_is_launched_as_get_cmd_launches_it():
    _assert_as_launched(_plan(_engine(EngineModel(TARGET, 4)), exit_timeout_s=10).local_argv(), "leader tp4")


def test_orchestrator_tp4_target_and_draft_is_launched_as_get_cmd_launches_it():
    shape = _engine(EngineModel(TARGET, 4, (0, 1, 2, 3)), EngineModel(DRAFT, 1, (0,)))
    plan = _plan(shape, gpus_per_node=4, exit_timeout_s=10)
    assert plan.processes == 1 and plan.own_mpirun and plan.env == ORCHESTRATOR_ENV
    _assert_as_launched(plan.local_argv(), "orchestrator tp4 target + draft")  # serve
    _assert_as_launched(plan.process_argv(0, oversubscribe=True),  # deploy's rank.sh
                        "orchestrator tp4 target + draft, --oversubscribe")


def test_llmapi_tp2_is_launched_as_get_cmd_trtllm_llmapi_launch_launches_it():
    plan = _plan(RepoShape("llmapi", (EngineModel(TARGET, 2),)), exit_timeout_s=10)
    assert (plan.mode, plan.processes, plan.ranks_launched) == ("llmapi", 2, True)
    _assert_as_launched(plan.local_argv(), "llmapi tp2")
    assert [r[0] for r in plan.ranks] == ["trtllm-llmapi-launch"] * 2


def test_the_comparison_fails_on_a_changed_flag():
    argv = _plan(_engine(EngineModel(TARGET, 4)), exit_timeout_s=10).local_argv()
    for bad in ([a.replace("prefix2_", "prefix9_") for a in argv], [a for a in argv if a != "--model-control-mode=explicit"],
                [a.replace("--allow-run-as-root", "--oversubscribe") for a in argv]):
        with pytest.raises(AssertionError):
            _assert_as_launched(bad, "leader tp4")


def test_leader_local_argv_is_one_mpirun_with_a_segment_per_rank():
    plan = _plan(_engine(EngineModel(TARGET, 4)))
    argv = plan.local_argv("mpirun")
    assert argv[:2] == ["mpirun", "--allow-run-as-root"] and argv.count(":") == 3
    segments = " ".join(argv[2:]).split(" : ")
    assert [s.split()[2:] for s in segments] == [list(r) for r in plan.ranks]
    assert _plan(_engine(EngineModel(TARGET, 1))).local_argv() == list(_plan(_engine(EngineModel(TARGET, 1))).ranks[0])


def test_multi_node_draft_target_is_refused_naming_the_fix():
    spec = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2, draft="llama-1b", target="trtllm")
    with pytest.raises(DeployError, match=r"MPI_Comm_spawn.*keep the target within one node"):
        _plan(shape_from_spec(spec), nodes=2, gpus_per_node=8, error=DeployError)
    # one node too small for the target: the same refusal (ServeError for `serve`)
    with pytest.raises(ServeError, match="16 ranks over 8 GPUs per node"):
        _plan(shape_from_spec(spec), gpus_per_node=8)


def test_orchestrator_gpu_ids_the_executor_refuses():
    target4 = EngineModel(TARGET, 4, (0, 1, 2, 3))
    # co-locating the draft on the target's first GPU is upstream's recommended layout: accepted
    assert _plan(_engine(target4, EngineModel(DRAFT, 1, (0,))), gpus_per_node=4).mode == "orchestrator"
    with pytest.raises(ServeError, match="name 2 GPU.* for 1 rank"):  # executorImpl: deviceIds == tp*pp*cp
        _plan(_engine(target4, EngineModel(DRAFT, 1, (0, 1))), gpus_per_node=4)
    with pytest.raises(ServeError, match="repeat a GPU"):
        _plan(_engine(target4, EngineModel(DRAFT, 2, (1, 1))), gpus_per_node=4)
    with pytest.raises(ServeError, match="beyond the node's 4 GPU"):
        _plan(_engine(target4, EngineModel(DRAFT, 1, (4,))), gpus_per_node=4)


def test_llmapi_tp1_and_reference_are_one_process_without_mpi():
    llm = _plan(RepoShape("llmapi", (EngineModel(TARGET, 1),)))
    assert (llm.mode, llm.processes, llm.env, llm.mpi) == ("llmapi", 1, {}, False)
    assert llm.local_argv() == list(llm.ranks[0]) and llm.ranks[0][0] == "tritonserver"  # launcher's --no-mpi
    assert shape_from_spec(resolve_spec(model="llama-70b", precision="fp8", tp=2, runtime="pytorch")) == \
        RepoShape("llmapi", (EngineModel(TARGET, 2),))
    ref = _plan(RepoShape("reference"), extra_args=("--backend-directory=/b",))
    assert ref.mode == "cpu-reference" and ref.ranks[0][-1] == "--backend-directory=/b"


def _write_repo(root: Path, models: dict[str, str], ids: dict[str, str] | None = None) -> Path:
    for name, backend in models.items():
        (root / name / "1").mkdir(parents=True)
        param = ""
        if ids and name in ids:
            param = f'parameters: {{ key: "gpu_device_ids" value: {{ string_value: "{ids[name]}" }} }}\n'
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "{backend}"\n{param}')
    return root


def test_shape_from_repo_reads_backends_and_gpu_ids(tmp_path):
    repo = _write_repo(tmp_path / "dt", {TARGET: "tensorrtllm", DRAFT: "tensorrtllm", "preprocessing": "python"},
                       {TARGET: "0,1,2,3", DRAFT: "0"})
    assert shape_from_repo(repo) == _engine(EngineModel(TARGET, 4, (0, 1, 2, 3)), EngineModel(DRAFT, 1, (0,)))
    assert shape_from_repo(_write_repo(tmp_path / "ref", {TARGET: "python"})).kind == "reference"
    assert shape_from_repo(_write_repo(tmp_path / "l", {TARGET: "tensorrtllm"}), world_size=2) == \
        _engine(EngineModel(TARGET, 2))
    bad = _write_repo(tmp_path / "bad", {TARGET: "tensorrtllm"}, {TARGET: "0,x"})
    with pytest.raises(ServeError, match="not a comma-separated list"):
        shape_from_repo(bad)


# ------------------------------------------------------------------------------------------------ serve == k8s == slurm
SPECS = {
    "single": dict(model="llama-70b", precision="fp8", tp=1, target="trtllm", gpu_count=1),
    "leader tp4": dict(model="llama-70b", precision="fp8", tp=4, target="trtllm", gpu_count=4),
    "leader tp2 x pp2": dict(model="llama-70b", precision="fp8", tp=2, pp=2, target="trtllm", gpu_count=4),
    "tp4 target + tp1 draft": dict(model="llama-70b", precision="fp8", tp=4, draft="llama-1b", target="trtllm",
                                   gpu_count=4),
    "multi-node leader": dict(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2, target="trtllm",
                              gpu_count=8),
}


def _serve_processes(spec, tmp_path, monkeypatch) -> tuple[list[list[str]], dict[str, str]]:
    """What `serve` starts for a repository `package` would write for `spec` (its engine models' configs)."""
    from pipeline.serving import serve

    shape = shape_from_spec(spec)
    repo = _write_repo(tmp_path / "repo", {m.name: "tensorrtllm" for m in shape.engine_models},
                       {m.name: ",".join(map(str, m.gpu_device_ids)) for m in shape.engine_models if m.gpu_device_ids})
    monkeypatch.setattr(serve, "visible_gpu_count", lambda: spec.hardware.gpu_count)
    cmd = serve.build_command(repo, EP, shm_prefix="prefix", binary="/opt/tritonserver/bin/tritonserver",
                              world_size=spec.parallelism.world_size)
    argv = cmd.argv
    if Path(argv[0]).name == "mpirun":  # leader and orchestrator mode: one mpirun, a `-n 1 ...` segment per process
        assert argv[1:argv.index("-n")] == ["--allow-run-as-root"]
        ranks = [s.split()[2:] for s in " ".join(argv[argv.index("-n"):]).split(" : ")]
    else:
        ranks = [argv]
    norm = [[("tritonserver" if a == "/opt/tritonserver/bin/tritonserver" else a.replace(str(repo.resolve()), "R"))
             for a in r] for r in ranks]
    env = {k: cmd.env[k] for k in ORCHESTRATOR_ENV if k in cmd.env}
    return norm, env


def _rank_script(text: str) -> tuple[list[list[str]], dict[str, str]]:
    # rank 0 (HTTP and the Python models) runs under the stub watchdog, the others exec their argv
    assert re.search(r"^  0\) serve_watched 8000 ", text, re.M) and not re.search(r"^  [1-9]\d*\) serve_watched", text,
                                                                                  re.M)
    ranks = [shlex.split(m.group(2).replace('"$repo"', "R"))
             for m in re.finditer(r"^  (\d+)\) (?:exec|serve_watched 8000) (.*) ;;$", text, re.M)]
    env = dict(m.groups() for m in re.finditer(r"^export (\w+)=(\S+)$", text, re.M))
    # deployed rank 0 also exports Triton's latency histograms (the TTFT alerts); `invoke serve` does not
    assert [r.count(HISTOGRAM_LATENCIES) for r in ranks] == [1] + [0] * (len(ranks) - 1)
    ranks = [[a for a in r if a != HISTOGRAM_LATENCIES] for r in ranks]
    if env == ORCHESTRATOR_ENV:  # the one process is its own mpirun -n 1 (launch_triton_server.py --oversubscribe)
        assert len(ranks) == 1 and ranks[0][:5] == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "1"]
        ranks = [ranks[0][5:]]
    else:
        assert not any(r[0] == "mpirun" for r in ranks)  # the platform starts the ranks
    return ranks, env


def _k8s_processes(spec, out: Path) -> int:
    from pipeline.cli.commands import deploy_command

    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                   release_url="https://r.example.invalid/x.tar.gz", output=str(out))
    objects = {o["kind"]: o for o in yaml.safe_load_all((out / "serving.yaml").read_text())}
    scripts = objects["ConfigMap"]["data"]
    if "LeaderWorkerSet" in objects:
        leader = objects["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        env = {e["name"]: e.get("value") for e in leader["containers"][0]["env"]}
        assert '-np "$WORLD_SIZE"' in scripts["launch-leader.sh"]
        count = int(env["WORLD_SIZE"])
    else:
        command = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]
        count = int(command[command.index("-np") + 1]) if command[0] == "mpirun" else 1
    return count, _rank_script(scripts["rank.sh"])


def _slurm_processes(spec, out: Path) -> int:
    from pipeline.cli.commands import deploy_command

    deploy_command(spec, platform="slurm", release_volume="/shared/releases", output=str(out))
    sbatch = (out / "serve.sbatch").read_text()
    srun = next(line for line in sbatch.splitlines() if line.endswith("rank.sh"))
    nodes = int(re.search(r"--nodes=(\d+)", srun).group(1))
    per_node = int(re.search(r"--ntasks-per-node=(\d+)", srun).group(1))
    return nodes * per_node, _rank_script((out / "rank.sh").read_text())


@pytest.mark.parametrize("layout", list(SPECS))
def test_serve_k8s_and_slurm_start_the_same_processes(layout, tmp_path, monkeypatch, out_env):
    spec = resolve_spec(**SPECS[layout])
    served, serve_env = _serve_processes(spec, tmp_path, monkeypatch)
    k8s_count, (k8s_ranks, k8s_env) = _k8s_processes(spec, tmp_path / "k8s")
    slurm_count, (slurm_ranks, slurm_env) = _slurm_processes(spec, tmp_path / "slurm")
    assert len(served) == k8s_count == slurm_count == len(k8s_ranks) == len(slurm_ranks)
    assert served == k8s_ranks == slurm_ranks  # modulo the repository path and the binary's location
    assert serve_env == k8s_env == slurm_env
    draft = spec.draft_model is not None
    assert len(served) == (1 if draft else spec.parallelism.world_size)
    assert (serve_env == ORCHESTRATOR_ENV) is draft


def test_draft_target_with_tp4_target_is_one_orchestrator_process_everywhere(tmp_path, monkeypatch, out_env):
    spec = resolve_spec(**SPECS["tp4 target + tp1 draft"])
    served, env = _serve_processes(spec, tmp_path, monkeypatch)
    assert len(served) == 1 and served[0][0] == "tritonserver" and env == ORCHESTRATOR_ENV
    assert "--cuda-memory-pool-byte-size=3:0" in served[0]
    sbatch = (tmp_path / "s" / "serve.sbatch")
    _slurm_processes(spec, tmp_path / "s")
    text = sbatch.read_text()
    # one task, no PMI from Slurm: its own mpirun -n 1 runs tritonserver, from which the backend spawns the ranks
    assert "--mpi=pmix" not in text and re.search(r"^srun --mpi=none --nodes=1 --ntasks-per-node=1 .*rank\.sh$", text,
                                                  re.M)


def test_multi_node_draft_target_deploy_is_refused(out_env, tmp_path):
    from pipeline.cli.commands import deploy_command

    spec = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2, draft="llama-1b", target="trtllm")
    with pytest.raises(DeployError, match="keep the target within one node"):
        deploy_command(spec, platform="slurm", release_volume="/shared/releases", output=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def test_serve_print_only_needs_only_the_spec(out_env, capsys):
    from pipeline.cli.commands import serve_command

    spec = resolve_spec(**SPECS["tp4 target + tp1 draft"])
    plan = serve_command(spec, print_only=True, host="0.0.0.0", port_offset="10")
    text = capsys.readouterr().out
    assert plan.mode == "orchestrator" and "# mode orchestrator: 1 process(es)" in text
    assert "export TRTLLM_ORCHESTRATOR=1\nexport TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1\n" in text
    command = shlex.split(text.strip().splitlines()[-1])
    assert command[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"]  # launch_triton_server.py keeps MPI on
    assert command[4:] == list(plan.ranks[0]) and "--http-port=8010" in command and "--http-address=0.0.0.0" in command
    assert "--disable-auto-complete-config" in command
    repo = next(a for a in command if a.startswith("--model-repository=")).split("=", 1)[1]
    assert Path(repo).parent == out_env / "out" / "triton_repo" and "<build-id>" in repo  # not built yet
    leader = serve_command(resolve_spec(**SPECS["leader tp4"]), print_only=True)
    assert shlex.split(capsys.readouterr().out.strip().splitlines()[-1])[:4] == ["mpirun", "--allow-run-as-root",
                                                                                  "-n", "1"]
    assert leader.processes == 4


@pytest.mark.parametrize("layout", ["leader tp4", "tp4 target + tp1 draft"])
def test_rank_script_execs_the_plan_argv_of_its_rank(layout, tmp_path, out_env):
    """/bin/sh runs the rendered rank.sh with a stand-in tritonserver that records the argv and env it gets."""
    import json
    import os
    import subprocess
    import sys

    from pipeline.ops.deploy.runtime import REPO_WORD, engine_launch_plan, with_latency_histograms
    from pipeline.planning.placement import place

    spec = resolve_spec(**SPECS[layout])
    _slurm_processes(spec, tmp_path / "d")
    bindir, work = tmp_path / "bin", tmp_path / "work dir"
    bindir.mkdir()
    work.mkdir()
    (work / "REPO").write_text("/srv/repo with space\n")
    for program in ("tritonserver", "mpirun"):  # stand-ins: the program's name, its argv and the TRTLLM_ env
        stand_in = bindir / program
        stand_in.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                            "print(json.dumps([[os.path.basename(sys.argv[0]), *sys.argv[1:]], "
                            "{k: v for k, v in os.environ.items() if k.startswith('TRTLLM_')}]))\n")
        stand_in.chmod(0o755)
    plan = engine_launch_plan(spec, place(spec.parallelism.tp, spec.parallelism.pp, spec.hardware))
    for rank in range(plan.processes):
        env = {"PATH": f"{bindir}:{os.environ['PATH']}", "WORK": str(work), "SLURM_PROCID": str(rank)}
        out = subprocess.run(["/bin/sh", str(tmp_path / "d" / "rank.sh")], env=env, capture_output=True, text=True,
                             check=True, timeout=60).stdout
        argv, got_env = json.loads(out)
        assert argv == [a.replace(REPO_WORD, "/srv/repo with space")
                        for a in with_latency_histograms(plan.process_argv(rank, oversubscribe=True), rank)]
        assert argv[0] == ("mpirun" if plan.mode == "orchestrator" else "tritonserver")
        assert got_env == plan.env
    beyond = subprocess.run(["/bin/sh", str(tmp_path / "d" / "rank.sh")], capture_output=True, text=True,
                            env={"PATH": f"{bindir}:{os.environ['PATH']}", "WORK": str(work),
                                 "SLURM_PROCID": str(plan.processes)})
    assert beyond.returncode == 2 and "outside the" in beyond.stderr
