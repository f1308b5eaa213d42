"""`invoke deploy --runtime pytorch`: trtllm-serve on the release's HF checkpoint, on Kubernetes and Slurm.

The rank program is executed for real (with recording stand-ins for trtllm-llmapi-launch / trtllm-serve on PATH), so
its argv is compared with `pipeline.stages.package.serve_plan` as the shell actually expands it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError, PackageError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.serve_inputs import OPTIONS_FILE, PYTORCH_METRICS, write_serve_inputs
from pipeline.ops.deploy.serve_inputs import main as serve_inputs_main
from pipeline.ops.deploy.validate import validate_objects
from pipeline.stages.package.serve_plan import LLMAPI_LAUNCH, trtllm_serve_plan
from pipeline.stages.package import llmapi_yaml
from pipeline.stages.package.llmapi_options import LlmApiOptions, llm_api_options
from pipeline.stages.package.llmapi_package import model_yaml
from tests.support.rank_stub import run_rank
from tests.support.k8s import PIPELINE_IMAGE

URL = "https://releases.example.invalid/llama.tar.gz"
REPO = Path(__file__).resolve().parents[3]


def _k8s(tmp_path, precision, **kw):
    spec = resolve_spec(model="llama-405b", precision=precision, runtime="pytorch")
    out = tmp_path / precision
    summary = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                             release_url=URL, output=str(out), **kw)
    objects = list(yaml.safe_load_all((out / "serving.yaml").read_text()))
    return summary, {o["kind"]: o for o in objects}, objects


def _plan(spec, tmp_path, name):
    work = tmp_path / "node work" / "serve"
    return trtllm_serve_plan(spec, model_dir=work / name, options_file=work / OPTIONS_FILE, host="0.0.0.0",
                             port=8000)


def test_fp8_is_one_trtllm_serve_process_probed_on_health(tmp_path):
    summary, by_kind, objects = _k8s(tmp_path, "fp8")
    assert (summary["kind"], summary["runtime"], summary["tp"], summary["nodes"]) == ("Deployment", "pytorch", 8, 1)
    assert "LeaderWorkerSet" not in by_kind and "Role" not in by_kind
    server = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert server["command"] == ["/bin/sh", "/config/rank.sh"]  # no mpirun: the LLM spawns its 8 workers
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {server[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/health"}
    assert server["ports"] == [{"name": "http", "containerPort": 8000}]
    assert [p["port"] for p in by_kind["Service"]["spec"]["ports"]] == [8000]
    scripts = by_kind["ConfigMap"]["data"]
    assert ("-m pipeline.ops.deploy.serve_inputs \"$repo\" \"$work/serve\" llama-405b-fp8-tp8"
            in scripts["fetch-verify.sh"])
    validate_objects(objects)
    spec = resolve_spec(model="llama-405b", precision="fp8", runtime="pytorch", tp=8)
    plan = _plan(spec, tmp_path, "llama-405b-fp8-tp8")
    assert not plan.multi_node and run_rank(scripts["rank.sh"], tmp_path) == plan.argv


def test_bf16_is_a_leader_worker_set_whose_ranks_run_the_serve_plan(tmp_path):
    summary, by_kind, objects = _k8s(tmp_path, "bf16")
    assert (summary["tp"], summary["pp"], summary["world_size"], summary["nodes"]) == (8, 2, 16, 2)
    tmpl = by_kind["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert env["WORLD_SIZE"] == "16" and env["RANKS_PER_NODE"] == "8"
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "readinessProbe" not in tmpl["workerTemplate"]["spec"]["containers"][0]
    assert {"ServiceAccount", "Role", "RoleBinding"} <= set(by_kind)
    assert [p["port"] for p in by_kind["Service"]["spec"]["ports"]] == [8000]
    scripts = by_kind["ConfigMap"]["data"]
    assert "mpirun" in scripts["launch-leader.sh"] and "/config/rank.sh" in scripts["launch-leader.sh"]
    validate_objects(objects)
    spec = resolve_spec(model="llama-405b", precision="bf16", runtime="pytorch", tp=8, pp=2, nodes=2)
    plan = _plan(spec, tmp_path, "llama-405b-bf16-tp8-pp2")
    # serve_plan: srun ... trtllm-llmapi-launch trtllm-serve ...; every rank runs the part from the launcher on
    assert plan.multi_node and plan.argv[0] == "srun"
    assert run_rank(scripts["rank.sh"], tmp_path) == plan.argv[plan.argv.index(LLMAPI_LAUNCH):]


@pytest.mark.parametrize("precision,nodes", [("bf16", 2), ("fp8", 1)])
def test_slurm_sbatch_starts_world_size_ranks_of_the_launcher(tmp_path, precision, nodes):
    spec = resolve_spec(model="llama-405b", precision=precision, runtime="pytorch")
    out = tmp_path / "serve"
    summary = deploy_command(spec, platform="slurm", release_volume="/shared/releases", partition="gpu",
                             output=str(out))
    assert (summary["kind"], summary["runtime"], summary["nodes"]) == ("sbatch", "pytorch", nodes)
    script = (out / "serve.sbatch").read_text()
    assert f"#SBATCH --nodes={nodes}" in script and "#SBATCH --ntasks-per-node=8" in script
    assert (f"srun --mpi=pmix --nodes={nodes} --ntasks-per-node=8 --kill-on-bad-exit=1 --task-epilog={out}/"
            "remove-work.sh --container-image=") in script
    assert script.rstrip().endswith(f"{out}/rank.sh") and "fetch-verify.sh" in script
    # upstream's Slurm recipe: as many MPI processes as the world size, each under trtllm-llmapi-launch
    rank = (out / "rank.sh").read_text()
    argv = run_rank(rank, tmp_path)
    multi = resolve_spec(model="llama-405b", precision=precision, runtime="pytorch", tp=8, pp=nodes, nodes=nodes)
    serve = _plan(multi, tmp_path, f"llama-405b-{precision}-tp8" + ("-pp2" if nodes == 2 else "")).argv
    assert argv[0] == LLMAPI_LAUNCH and argv[1:] == serve[serve.index("trtllm-serve"):]


def test_pytorch_release_uses_the_trtllm_version_it_is_written_for(tmp_path):
    # a recorded spec sets every field: the draft's engine-only defaults must not read as given on runtime pytorch
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4, draft="auto", runtime="pytorch")
    doc = {"format": 1, "name": "llama-70b-fp8-abc-v1.0.0", "spec": spec.model_dump(mode="json"),
           "runtime": "pytorch", "serving": {"runtime": "pytorch", "tensorrt_llm": "1.2.0", "sm_pinned": False},
           "toolchain": {"engine": None, "calibrate": {}}, "files": {}}
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "release.json").write_text(json.dumps(doc))
    summary = deploy_command(None, platform="slurm", release=str(rel), release_volume="/r", output=str(tmp_path / "d"))
    assert (summary["runtime"], summary["trtllm_version"], summary["tp"]) == ("pytorch", "1.2.0", 4)
    assert "draft=" in summary["summary"]
    assert summary["image"] == "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3"


def test_reference_pytorch_build_is_not_deployed(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference", runtime="pytorch")
    with pytest.raises(DeployError, match="--target reference"):
        deploy_command(spec, platform="slurm", release_volume="/r", output=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def _installed_repo(tmp_path: Path, *, draft: bool, model: str | None = None) -> tuple[Path, object, Path, Path]:
    spec = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch", **({"draft": "auto"} if draft else {}))
    ckpt, draft_dir = tmp_path / "engines" / "b" / "hf_checkpoint", tmp_path / "engines" / "d" / "hf_checkpoint"
    ckpt.mkdir(parents=True)
    draft_dir.mkdir(parents=True)
    options = llm_api_options(spec, draft_dir=draft_dir if draft else None)
    data = model_yaml(spec, options, model=model or str(ckpt), draft=str(draft_dir) if draft else None,
                      tokenizer=None)
    repo = tmp_path / "triton_repo" / "r"
    (repo / llmapi_yaml.MODEL_YAML).parent.mkdir(parents=True)
    llmapi_yaml.write(repo / llmapi_yaml.MODEL_YAML, data)
    return repo, options, ckpt, draft_dir


def _release_options(path: Path) -> LlmApiOptions:
    """The release's options in a written options file, whose metrics switches are checked and dropped."""
    data = yaml.safe_load(path.read_text())
    assert {key: data.pop(key, None) for key in PYTORCH_METRICS} == PYTORCH_METRICS
    return LlmApiOptions.from_mapping(data, what=str(path))


def test_serve_inputs_link_the_checkpoint_and_write_the_release_options(tmp_path):
    repo, options, ckpt, draft_dir = _installed_repo(tmp_path, draft=True)
    link, options_file = write_serve_inputs(repo, tmp_path / "work" / "serve", "tiny-llama-fp8")
    assert link.name == "tiny-llama-fp8" and link.resolve() == ckpt.resolve()
    written = _release_options(options_file)
    assert written == options and written.speculative_config.speculative_model_dir == str(draft_dir)
    assert (link.parent / "tiny-llama-fp8.draft").resolve() == draft_dir.resolve()  # Dynamo's workers name it
    # no model/backend/triton_config; the metrics switches the monitoring rules need
    assert set(yaml.safe_load(options_file.read_text())) == set(options.as_dict()) | set(PYTORCH_METRICS)
    write_serve_inputs(repo, tmp_path / "work" / "serve", "tiny-llama-fp8")  # a rerun replaces the link
    assert link.resolve() == ckpt.resolve()


def test_serve_inputs_refuse_an_uninstalled_or_foreign_repo(tmp_path, capsys):
    repo, *_ = _installed_repo(tmp_path / "a", draft=False, model="../../../engines/b/hf_checkpoint")
    with pytest.raises(DeployError, match="not an existing absolute directory.*install-repo"):
        write_serve_inputs(repo, tmp_path / "out", "m")
    assert serve_inputs_main([str(tmp_path / "nowhere"), str(tmp_path / "out"), "m"]) == 2
    assert "no tensorrt_llm/1/model.yaml" in capsys.readouterr().err
    repo, *_ = _installed_repo(tmp_path / "b", draft=False)
    data = llmapi_yaml.read(repo / llmapi_yaml.MODEL_YAML)
    data["max_batch_size"] = "many"
    llmapi_yaml.write(repo / llmapi_yaml.MODEL_YAML, data)
    with pytest.raises(PackageError, match="max_batch_size"):
        write_serve_inputs(repo, tmp_path / "out", "m")
    assert not (tmp_path / "out" / OPTIONS_FILE).exists()


@pytest.mark.slow
def test_release_to_rank_program_on_a_node(pipeline_env, tmp_path):
    """A runtime-pytorch build (target trtllm: nothing is compiled) released, deployed from its tarball; the rendered
    fetch-verify.sh runs for real (sha256, verify, unpack, install-repo, serve inputs), then the rank program."""
    invoke = [sys.executable, "-m", "invoke", "-r", str(REPO)]
    args = ["--model", "tiny-llama", "--precision", "fp8", "--draft", "auto", "--runtime", "pytorch",
            "--calib-size", "4", "--calib-seq-len", "32"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    releases = tmp_path / "releases"
    for cmd in (["build", *args], ["release", *args, "--output", str(releases)]):
        res = subprocess.run([*invoke, *cmd], env=env, capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    tarball = next(releases.glob("*.tar"))
    deploy = tmp_path / "deploy"
    summary = deploy_command(None, platform="slurm", release=str(tarball), release_volume=str(releases),
                             no_container=True, output=str(deploy))
    assert summary["runtime"] == "pytorch" and summary["sha256"]
    work = tmp_path / "node work"
    node = {**env, "WORK": str(work), "PIPELINE": " ".join(invoke), "PIPELINE_PYTHON": sys.executable,
            "RELEASE_DIR": str(releases), "RELEASE_FILE": tarball.name, "RELEASE_SHA256": summary["sha256"]}
    res = subprocess.run(["/bin/sh", str(deploy / "fetch-verify.sh")], env=node, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    repo = Path((work / "REPO").read_text().strip())
    installed = llmapi_yaml.read(repo / llmapi_yaml.MODEL_YAML)
    link = work / "serve" / "tiny-llama-fp8-tp1-draft"
    assert link.resolve() == Path(installed["model"]) and (link / "hf_quant_config.json").is_file()
    written = _release_options(work / "serve" / OPTIONS_FILE)
    assert written.speculative_config.speculative_model_dir == installed["speculative_config"]["speculative_model_dir"]
    assert Path(written.speculative_config.speculative_model_dir).is_dir()
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", runtime="pytorch")
    plan = _plan(spec, tmp_path, "tiny-llama-fp8-tp1-draft")
    argv = run_rank((deploy / "rank.sh").read_text(), tmp_path)
    assert argv == [LLMAPI_LAUNCH, *plan.argv] and Path(argv[2]) == link


def test_serve_inputs_check_the_eagle3_head_directory(tmp_path):
    """An EAGLE-3 release names its head (carried in the repository, made absolute by install-repo) like a draft:
    trtllm-serve is given the options with `decoding_type: Eagle` and the head must exist on the node."""
    spec = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch", speculative_decoding="eagle3",
                        draft="tiny-llama-eagle3", max_batch_size=4)
    ckpt = tmp_path / "engines" / "b" / "hf_checkpoint"
    ckpt.mkdir(parents=True)
    repo = tmp_path / "triton_repo" / "r"
    head = (repo / llmapi_yaml.MODEL_YAML).parent / "eagle3_head"
    options = llm_api_options(spec, draft_dir=head)
    data = model_yaml(spec, options, model=str(ckpt), draft=str(head), tokenizer=None)
    head.parent.mkdir(parents=True)
    llmapi_yaml.write(repo / llmapi_yaml.MODEL_YAML, data)
    with pytest.raises(DeployError, match="speculative_model_dir .* is not an existing absolute directory"):
        write_serve_inputs(repo, tmp_path / "work", "tiny-llama-fp8")
    head.mkdir()
    _, options_file = write_serve_inputs(repo, tmp_path / "work", "tiny-llama-fp8")
    written = _release_options(options_file)
    assert written == options and written.speculative_config.decoding_type == "Eagle"
    assert (tmp_path / "work" / "tiny-llama-fp8.draft").resolve() == head.resolve()
