"""serve.sbatch / build-matrix.sbatch as sbatch and the shell read them: pyxis image refs, $WORK created before any
container mount, time/account/qos/constraint directives, and user values that cannot inject shell (the rendered
scripts run under bash with a recording `srun` stand-in)."""

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.runtime import HTTP_PORT, REFERENCE_RANK, pytorch_rank_argv
from pipeline.ops.deploy.slurm import pyxis_image
from tests.support.k8s import PIPELINE_IMAGE

EVIL = "x;touch pwned"
RECORD = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD_LOG"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "release_dir": os.environ.get("RELEASE_DIR"), "output": os.environ.get("OUTPUT")}}) + "\\n")
"""


def _render(tmp_path, spec=None, **kw):
    spec = spec or resolve_spec(model="llama-405b", precision="bf16")
    kw.setdefault("output", str(tmp_path / "serve"))
    summary = deploy_command(spec, platform="slurm", **{"release_volume": "/shared/releases", **kw})
    return Path(summary["directory"])


def _run_with_stub_srun(script: Path, tmp_path: Path) -> list[dict]:
    """Run `script` under bash with `srun` recording its argv (and nothing else); returns the records."""
    bin_dir, cwd, log = tmp_path / "bin", tmp_path / "cwd", tmp_path / "srun.log"
    bin_dir.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(RECORD)
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD_LOG": str(log), "SLURM_JOB_ID": "7",
           "TRTLLM_DEPLOY_TMP": str(tmp_path / "tmp")}
    res = subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def _no_pwned(*dirs: Path) -> None:
    for d in dirs:
        assert not [p for p in d.rglob("pwned*")], f"a command ran from a user value under {d}"


@pytest.mark.parametrize("ref,want", [
    ("nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3", "nvcr.io#nvidia/tritonserver:26.03-trtllm-python-py3"),
    ("nvcr.io#nvidia/tritonserver:26.03-trtllm-python-py3", "nvcr.io#nvidia/tritonserver:26.03-trtllm-python-py3"),
    ("localhost:5000/trtllm-pipeline:1.0", "localhost:5000#trtllm-pipeline:1.0"),
    ("registry.example.com:443/team/img@sha256:abc", "registry.example.com:443#team/img@sha256:abc"),
    ("nvidia/cuda:12.8.0-base", "nvidia/cuda:12.8.0-base"),  # Docker Hub: no registry host to split off
    ("ubuntu:24.04", "ubuntu:24.04"),
])
def test_pyxis_image_form(ref, want):
    assert pyxis_image(ref) == want


def test_serve_script_uses_pyxis_refs_and_creates_work_before_any_mount(tmp_path):
    script = (_render(tmp_path, image="nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3") /
              "serve.sbatch").read_text()
    lines = script.splitlines()
    words = [w for ln in lines if ln.startswith("srun ") for w in shlex.split(ln)]
    images = [w.split("=", 1)[1] for w in words if w.startswith("--container-image=")]
    assert images[-1] == "nvcr.io#nvidia/tritonserver:26.03-trtllm-python-py3", images
    assert images[0].startswith("trtllm-pipeline:")  # a local name: no registry host to split off
    mkdir = lines.index('srun --nodes=2 --ntasks-per-node=1 mkdir -p "$WORK"')
    first_mount = next(i for i, ln in enumerate(lines) if "--container-mounts=" in ln)
    assert mkdir < first_mount and "--container" not in lines[mkdir]
    assert '--container-mounts="$WORK:$WORK",' in lines[first_mount]


def test_serving_has_no_time_limit_unless_given_the_matrix_keeps_one(tmp_path):
    script = (_render(tmp_path) / "serve.sbatch").read_text()
    assert "#SBATCH --time" not in script and "#SBATCH --account" not in script
    script = (_render(tmp_path, output=str(tmp_path / "t"), time_="2-00:00:00", account="proj-42", qos="high",
                      constraint="h100&ib", partition="gpu") / "serve.sbatch").read_text()
    for line in ("#SBATCH --time=2-00:00:00", "#SBATCH --account=proj-42", "#SBATCH --qos=high",
                 '#SBATCH --constraint="h100&ib"', "#SBATCH --partition=gpu"):
        assert line in script.splitlines(), line
    matrix = tmp_path / "m"
    deploy_command(None, platform="slurm", matrix="tiny-llama:fp8", matrix_output="/shared/builds",
                   output=str(matrix))
    assert "#SBATCH --time=04:00:00" in (matrix / "build-matrix.sbatch").read_text().splitlines()
    deploy_command(None, platform="slurm", matrix="tiny-llama:fp8", matrix_output="/shared/builds",
                   output=str(tmp_path / "m2"), time_="30")
    assert "#SBATCH --time=30" in (tmp_path / "m2" / "build-matrix.sbatch").read_text().splitlines()


@pytest.mark.parametrize("flag,value,match", [
    ("partition", EVIL, "--partition"),
    ("partition", "gpu\n#SBATCH --wrap=id", "--partition"),
    ("account", "a b", "--account"),
    ("qos", "q#x", "--qos"),
    ("constraint", "h100;id", "--constraint"),
    ("time_", "4h", "--time"),
    ("release_volume", EVIL, "--release-volume"),  # relative: the nodes need one shared absolute directory
    ("release_volume", "/shared/rel,x", "--release-volume"),  # pyxis splits mounts on ','
    ("output", "bad\nname", "--output"),
    ("output", "logs%j", "--output"),
    ("output", "/tmp/a\\b", "--output"),  # a backslash turns off sbatch's file patterns
])
def test_bad_slurm_values_are_refused_before_anything_is_written(tmp_path, monkeypatch, flag, value, match):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    out = tmp_path / "never"
    kw = {"output": str(out), flag: value}
    with pytest.raises(DeployError, match=re.escape(match)) as exc:
        _render(tmp_path, **kw)
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)
    assert not out.exists() and not list(tmp_path.glob("**/serve.sbatch"))


def test_slurm_flags_on_k8s_are_refused(tmp_path):
    spec = resolve_spec(model="llama-8b", precision="fp8")
    with pytest.raises(DeployError, match="--account, --time: Slurm options"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       release_url="https://h/r.tar.gz", account="a", time_="10",
                       output=str(tmp_path / "k"))


def test_injection_values_stay_data_when_the_scripts_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    release = tmp_path / "rel eases" / EVIL
    d = _render(tmp_path, output=EVIL, release_volume=str(release), partition="gpu")
    assert d == tmp_path / "root" / EVIL
    script = d / "serve.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert f'#SBATCH --output="{d}/logs/%x-%j.out"' in script.read_text()
    records = _run_with_stub_srun(script, tmp_path)
    work = tmp_path / "tmp" / "trtllm-deploy-7"
    assert [r["argv"][-1] for r in records] == [str(work), f"{d}/fetch-verify.sh", f"{d}/rank.sh", str(work)]
    assert records[-1]["argv"][-3:] == ["rm", "-rf", str(work)]  # the exit trap, on every node
    assert all(f"--task-epilog={d}/remove-work.sh" in r["argv"] for r in records[1:3])
    mounts = [a for a in records[1]["argv"] if a.startswith("--container-mounts=")]
    assert mounts == [f"--container-mounts={work}:{work},{d}:{d},{release}:{release}"]
    assert {r["release_dir"] for r in records} == {str(release)}
    _no_pwned(tmp_path)


def test_matrix_output_injection_stays_data(tmp_path):
    out = tmp_path / "builds" / EVIL
    d = tmp_path / f"deploy {EVIL}"
    deploy_command(None, platform="slurm", matrix="tiny-llama:fp8", matrix_target="reference",
                   matrix_output=str(out), output=str(d))
    script = d / "build-matrix.sbatch"
    records = _run_with_stub_srun(script, tmp_path)
    assert records[0]["output"] == str(out) and out.is_dir()  # the mount source exists before the step
    assert f"--container-mounts={out}:{out},{d}:{d}" in records[0]["argv"]
    assert records[0]["argv"][-1] == f"{d}/build-cell.sh"
    _no_pwned(tmp_path)


def test_reference_rank_runs_the_pipelines_server_on_env_ports(tmp_path):
    work, repo = tmp_path / "work", tmp_path / "rel ease" / "triton_repo" / "b"
    work.mkdir()
    (work / "REPO").write_text(f"{repo}\n")
    rank, log = tmp_path / "rank.sh", tmp_path / "argv.log"
    rank.write_text(REFERENCE_RANK)
    (tmp_path / "record").write_text(RECORD)
    (tmp_path / "record").chmod(0o755)
    env = {**os.environ, "WORK": str(work), "PIPELINE": str(tmp_path / "record"), "RECORD_LOG": str(log),
           "HTTP_PORT": "18000", "GRPC_PORT": "18001"}
    env.pop("METRICS_PORT", None)
    subprocess.run(["/bin/sh", str(rank)], env=env, check=True, timeout=60)
    argv = json.loads(log.read_text())["argv"]
    assert argv == ["serve", "--repo", str(repo), "--host", "0.0.0.0", "--http-port", "18000", "--grpc-port", "18001",
                    "--metrics-port", "8002"]


def test_reference_build_deploys_on_slurm_only_without_gpus(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    d = _render(tmp_path, spec=spec, image="nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3")
    script = (d / "serve.sbatch").read_text()
    assert "--gpus" not in script and "--exclusive" not in script and "--mpi" not in script
    assert "#SBATCH --ntasks-per-node=1" in script
    rank_line = script.splitlines()[-1]
    assert rank_line.endswith(f"{d}/rank.sh") and "--container-image=trtllm-pipeline:" in rank_line  # runs invoke
    assert "tritonserver" not in rank_line
    assert json.loads((d / "deploy.json").read_text())["target"] == "reference"
    with pytest.raises(DeployError, match="--target reference"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url="https://h/r.tar.gz",
                       output=str(tmp_path / "k"))


def test_trtllm_serve_ranks_bind_all_interfaces():
    spec = resolve_spec(model="llama-8b", precision="fp8", runtime="pytorch")
    argv = pytorch_rank_argv(spec, "llama-8b-fp8", launched=True)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == str(HTTP_PORT)


SEEN_AT_RANKS = f"""#!{sys.executable}
import os, shutil, sys
if sys.argv[-1].endswith("rank.sh"):  # the serving step: what Prometheus reads while the job runs
    shutil.copy(os.environ["TARGETS"], os.environ["TARGETS_SEEN"])
"""


def _run_with_fake_node(script: Path, tmp_path: Path, targets: Path, **extra: str) -> subprocess.CompletedProcess:
    """Run `script` under bash on a fake node `gpu-node-17` (`hostname`), `srun` copying the target file when the
    ranks start."""
    bin_dir = tmp_path / "node-bin"
    bin_dir.mkdir()
    for name, text in (("srun", SEEN_AT_RANKS), ("hostname", "#!/bin/sh\necho gpu-node-17\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "METRICS_PORT"}
    env |= {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "TRTLLM_DEPLOY_TMP": str(tmp_path / "w"),
            "TARGETS": str(targets), "TARGETS_SEEN": str(tmp_path / "seen.json"), **extra}
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_serve_script_writes_the_prometheus_target_while_serving_and_removes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    d = _render(tmp_path, output=EVIL, name="llama-405b-bf16")
    assert d == tmp_path / "root" / EVIL
    targets = d / "prometheus-targets.json"
    res = _run_with_fake_node(d / "serve.sbatch", tmp_path, targets)
    assert res.returncode == 0, res.stderr
    seen = tmp_path / "seen.json"
    assert json.loads(seen.read_text()) == [{"targets": ["gpu-node-17:8002"], "labels": {"job": "llama-405b-bf16"}}]
    assert oct(seen.stat().st_mode & 0o777) == "0o644"  # copied with its mode: Prometheus' user reads it
    assert not targets.exists() and not list(d.glob("prometheus-targets.json.*"))  # removed on exit, no temp left
    scrape = (d / "prometheus-scrape.yml").read_text()
    assert yaml.safe_load(scrape)["scrape_configs"][0]["file_sd_configs"] == [{"files": [str(targets)]}]
    _no_pwned(tmp_path)


def test_scrape_target_job_name_stays_data_and_the_reference_port_follows_the_env(tmp_path):
    from pipeline.ops.deploy.runtime import runtime_for
    from pipeline.ops.deploy.slurm import SlurmOptions, _cleanup_lines, _scrape_target_lines
    from pipeline.planning.placement import place

    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    name = 'x";touch pwned;"'
    o = SlurmOptions(name=name, directory=str(tmp_path), server_image="s", pipeline_image="p", pipeline_cmd="invoke",
                     keep_work=True)
    targets = tmp_path / f"t {EVIL}.json"
    lines = _scrape_target_lines(o, runtime_for(spec, "t", placement=place(1, 1, spec.hardware), platform="slurm"), str(targets))
    script = tmp_path / "s.sh"
    script.write_text("\n".join(["set -euo pipefail", *_cleanup_lines(o, []), *lines, 'cp "$targets" "$TARGETS_SEEN"'])
                      + "\n")
    res = _run_with_fake_node(script, tmp_path, targets, METRICS_PORT="18002")  # the reference rank.sh's port
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "seen.json").read_text()) == [{"targets": ["gpu-node-17:18002"],
                                                                 "labels": {"job": name}}]
    assert not targets.exists()
    _no_pwned(tmp_path)


def test_each_replica_of_an_array_writes_its_own_prometheus_target(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    d = _render(tmp_path, output=EVIL, name="llama-405b-bf16", replicas="3")
    script = (d / "serve.sbatch").read_text()
    assert "#SBATCH --array=0-2\n" in script and "%x-%A_%a.out" in script
    targets = d / "prometheus-targets-2.json"
    res = _run_with_fake_node(d / "serve.sbatch", tmp_path, targets, SLURM_ARRAY_TASK_ID="2")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "seen.json").read_text()) == [{"targets": ["gpu-node-17:8002"],
                                                                 "labels": {"job": "llama-405b-bf16"}}]
    assert not targets.exists()
    scrape = yaml.safe_load((d / "prometheus-scrape.yml").read_text())
    assert scrape["scrape_configs"][0]["file_sd_configs"] == [{"files": [str(d / "prometheus-targets-*.json")]}]
    _no_pwned(tmp_path)


RANK_FAILS = f"""#!{sys.executable}
import sys
sys.exit(5 if sys.argv[-1].endswith("rank.sh") else 0)  # rank 0's stub watchdog stopped the server
"""


def test_a_rank_exiting_5_ends_the_step_and_fails_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    d = _render(tmp_path, output="serve", name="llama-405b-bf16")
    rank_line = (d / "serve.sbatch").read_text().splitlines()[-1]
    assert rank_line.startswith("srun --mpi=pmix ") and "--kill-on-bad-exit=1" in shlex.split(rank_line)
    assert re.search(r"^  0\) serve_watched 8000 ", (d / "rank.sh").read_text(), re.M)  # the watchdog's exit 5
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(RANK_FAILS)
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "TRTLLM_DEPLOY_TMP": str(tmp_path / "w")}
    res = subprocess.run(["bash", str(d / "serve.sbatch")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 5, res.stderr  # the job ends failed, with the rank's status
    assert not (d / "prometheus-targets.json").exists()  # and stops being scraped


def test_serving_asks_for_its_gpus_ram_and_cores_and_whole_nodes_only_when_asked(tmp_path):
    from pipeline.stages.resources import serving_host_bytes
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    script = (_render(tmp_path, spec=spec, mpi="pmi2") / "serve.sbatch").read_text()
    lines = script.splitlines()
    mib = -(-serving_host_bytes(spec, ranks_per_node=4, world_size=4) // 2**20)
    for line in ("#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4", f"#SBATCH --mem={mib}M",
                 "#SBATCH --cpus-per-task=4"):
        assert line in lines, line
    assert "--exclusive" not in script and lines[-1].startswith("srun --mpi=pmi2 ")
    assert 70 * 2**30 < mib * 2**20 < 100 * 2**30  # 4 ranks: the 68 GB release + 4 GiB each
    whole = (_render(tmp_path, spec=spec, exclusive=True, output=str(tmp_path / "x")) / "serve.sbatch").read_text()
    assert "#SBATCH --exclusive" in whole.splitlines()
    with pytest.raises(DeployError, match="--mpi 'openmpi': use one of pmix") as exc:
        _render(tmp_path, spec=spec, mpi="openmpi", output=str(tmp_path / "bad"))
    assert exc.value.exit_code == 2 and not (tmp_path / "bad").exists()
    with pytest.raises(DeployError, match="--exclusive, --keep-work: Slurm options"):
        deploy_command(spec, platform="k8s", release_url="https://h/r.tar", exclusive=True, keep_work=True,
                       output=str(tmp_path / "k"))


def test_keep_work_leaves_the_work_directory(tmp_path):
    d = _render(tmp_path, keep_work=True)
    script = (d / "serve.sbatch").read_text()
    assert "rm -rf" not in script and "--task-epilog" not in script and not (d / "remove-work.sh").exists()
    records = _run_with_stub_srun(d / "serve.sbatch", tmp_path)
    assert records[-1]["argv"][-1] == f"{d}/rank.sh"  # no removal step after the ranks


def test_remove_work_epilog_removes_only_this_jobs_directory(tmp_path):
    epilog = tmp_path / "remove-work.sh"
    epilog.write_text((_render(tmp_path) / "remove-work.sh").read_text())
    work, other = tmp_path / "trtllm-deploy-7", tmp_path / "home"
    for d in (work, other):
        d.mkdir()
    (work / "REPO").write_text("r")

    def run(**env):
        subprocess.run(["/bin/sh", str(epilog)], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", **env},
                       check=True, timeout=30)
    run(WORK=str(other))  # not this job's directory (an inherited WORK): left alone
    run(WORK=str(work), KEEP_FETCHED="1")  # the fetch step finished here: the ranks need it
    assert other.is_dir() and work.is_dir()
    run(WORK=str(work))  # a rank ended
    assert not work.exists() and other.is_dir()


def test_reference_summary_claims_no_gpu_nor_the_server_image(tmp_path, capsys):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    d = _render(tmp_path, spec=spec)
    doc = json.loads((d / "deploy.json").read_text())
    assert doc["gpus"] == 0 and doc["image"].startswith("trtllm-pipeline:") and "tritonserver" not in doc["image"]
    out = capsys.readouterr().out
    assert "GPU" not in out and "one CPU process (reference)" in out and "tritonserver" not in out
    assert "#SBATCH --cpus-per-task=1" in (d / "serve.sbatch").read_text()
    gpu = json.loads((_render(tmp_path, output=str(tmp_path / "g")) / "deploy.json").read_text())
    assert gpu["gpus"] == 16 and "tritonserver" in gpu["image"]


def test_the_build_matrix_asks_for_calibrations_host_ram_and_cores(tmp_path):
    from pipeline.stages.resources import calibration_memory
    deploy_command(None, platform="slurm", matrix="llama-8b:fp8,llama-8b:int4_awq:2", matrix_output="/shared/b",
                   output=str(tmp_path / "m"))
    lines = (tmp_path / "m" / "build-matrix.sbatch").read_text().splitlines()
    assert "#SBATCH --gpus=2" in lines and "#SBATCH --cpus-per-task=8" in lines
    mem = [ln for ln in lines if ln.startswith("#SBATCH --mem=")]
    want = max(calibration_memory(resolve_spec(model="llama-8b", precision=p, tp=t), "target").host_bytes_with_gpu
               for p, t in (("fp8", 1), ("int4_awq", 2)))
    assert mem == [f"#SBATCH --mem={-(-want // 2**20)}M"]
    deploy_command(None, platform="slurm", matrix="llama-8b:fp8", matrix_target="reference", time_="10",
                   matrix_output="/shared/b", output=str(tmp_path / "r"))
    cpu = calibration_memory(resolve_spec(model="llama-8b", precision="fp8", target="reference"), "target")
    lines = (tmp_path / "r" / "build-matrix.sbatch").read_text().splitlines()
    assert f"#SBATCH --cpus-per-task={math.ceil(cpu.cpu_seconds_per_core / 600)}" in lines  # done within --time 10
    assert f"#SBATCH --mem={-(-cpu.cpu_ram_bytes // 2**20)}M" in lines
