"""`invoke deploy --serve-mode trtllm-serve`: an engine release served by trtllm-serve --backend tensorrt.

The rank program runs for real with recording stand-ins for trtllm-llmapi-launch / trtllm-serve on PATH, so its argv is
compared with `pipeline.stages.package.serve_plan` as the shell expands it; the node step (`serve_inputs --engine`) runs on an
installed repository's configs.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError, SpecError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.runtime import fetch_verify_script, runtime_for
from pipeline.ops.deploy.serve_inputs import OPTIONS_FILE, TOKENIZER_LINK, write_engine_serve_inputs
from pipeline.ops.deploy.serve_inputs import main as serve_inputs_main
from pipeline.ops.deploy.validate import validate_objects
from pipeline.planning.placement import place
from pipeline.stages.package.serve_plan import LLMAPI_LAUNCH, trtllm_serve_plan
from tests.support.rank_stub import run_rank
from tests.support.k8s import PIPELINE_IMAGE

URL = "https://releases.example.invalid/llama.tar.gz"
REPO = Path(__file__).resolve().parents[3]


def _plan(spec, tmp_path, name):
    work = tmp_path / "node work" / "serve"
    return trtllm_serve_plan(spec, model_dir=work / name, tokenizer_dir=work / TOKENIZER_LINK,
                             options_file=work / OPTIONS_FILE, host="0.0.0.0", port=8000)


def test_k8s_engine_under_trtllm_serve_is_one_process_probed_on_health(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    out = tmp_path / "k8s"
    summary = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(out),
                             serve_mode="trtllm-serve")
    objects = list(yaml.safe_load_all((out / "serving.yaml").read_text()))
    by_kind = {o["kind"]: o for o in objects}
    assert (summary["kind"], summary["runtime"], summary["server"]) == ("Deployment", "engine", "engine-trtllm-serve")
    server = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert server["command"] == ["/bin/sh", "/config/rank.sh"]
    assert {server[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/health"}
    assert server["ports"] == [{"name": "http", "containerPort": 8000}]
    scripts = by_kind["ConfigMap"]["data"]
    assert "-m pipeline.ops.deploy.serve_inputs --engine \"$repo\" \"$work/serve\" llama-70b-fp8-tp4" in \
        scripts["fetch-verify.sh"]
    assert "tritonserver" not in scripts["rank.sh"]
    validate_objects(objects)
    plan = _plan(spec, tmp_path, "llama-70b-fp8-tp4")
    assert not plan.multi_node and plan.backend == "tensorrt"
    assert run_rank(scripts["rank.sh"], tmp_path) == plan.argv


def test_default_serve_mode_of_an_engine_stays_tritonserver(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    summary = deploy_command(spec, platform="slurm", release_volume="/r", output=str(tmp_path / "d"))
    assert summary["server"] == "engine" and "tritonserver" in (tmp_path / "d" / "rank.sh").read_text()


def test_slurm_engine_ranks_run_the_launcher(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=8, pp=2, nodes=2, gpus_per_node=8)
    out = tmp_path / "slurm"
    summary = deploy_command(spec, platform="slurm", release_volume="/shared/releases", partition="gpu",
                             output=str(out), serve_mode="trtllm-serve")
    assert (summary["nodes"], summary["world_size"]) == (2, 16)
    script = (out / "serve.sbatch").read_text()
    assert "srun --mpi=pmix --nodes=2 --ntasks-per-node=8" in script
    argv = run_rank((out / "rank.sh").read_text(), tmp_path)
    serve = _plan(spec, tmp_path, "llama-70b-fp8-tp8-pp2").argv
    assert argv[0] == LLMAPI_LAUNCH and argv[1:] == serve[serve.index("trtllm-serve"):]


def test_serve_mode_refusals(tmp_path):
    draft = resolve_spec(model="tiny-llama", precision="fp8", draft="auto")
    with pytest.raises(SpecError, match="no draft-target speculation"):
        deploy_command(draft, platform="slurm", release_volume="/r", output=str(tmp_path / "a"),
                       serve_mode="trtllm-serve")
    pytorch = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch")
    with pytest.raises(DeployError, match="--serve-mode triton: a runtime-pytorch release"):
        deploy_command(pytorch, platform="slurm", release_volume="/r", output=str(tmp_path / "b"),
                       serve_mode="triton")
    with pytest.raises(DeployError, match="--serve-mode 'vllm': use one of triton, trtllm-serve"):
        deploy_command(pytorch, platform="slurm", release_volume="/r", output=str(tmp_path / "c"), serve_mode="vllm")
    assert not any((tmp_path / d).exists() for d in "abc")


def _pbtxt(name: str, params: dict[str, str]) -> str:
    body = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
    return f'name: "{name}"\n{body}'


def _installed_engine_repo(tmp_path: Path, *, engine: str | None = None, draft: bool = False,
                           fraction: str = "0.85", reuse: str = "true") -> tuple[Path, Path, Path]:
    eng, tok = tmp_path / "release" / "engines" / "b" / "engine", tmp_path / "release" / "tokenizer"
    eng.mkdir(parents=True)
    tok.mkdir(parents=True)
    repo = tmp_path / "release" / "triton_repo" / "r"
    models = {"tensorrt_llm": {"gpt_model_path": engine or str(eng), "kv_cache_free_gpu_mem_fraction": fraction,
                               "enable_kv_cache_reuse": reuse, "enable_chunked_context": "false"},
              "preprocessing": {"tokenizer_dir": str(tok)}}
    if draft:
        models["tensorrt_llm_draft"] = {"gpt_model_path": str(eng)}
    for model, params in models.items():
        (repo / model).mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(_pbtxt(model, params))
    return repo, eng, tok


def test_engine_serve_inputs_link_engine_and_tokenizer_and_write_the_repos_kv_settings(tmp_path):
    repo, eng, tok = _installed_engine_repo(tmp_path)
    out = tmp_path / "work" / "serve"
    link, options_file = write_engine_serve_inputs(repo, out, "llama-70b-fp8")
    assert link == out / "llama-70b-fp8" and link.resolve() == eng.resolve()
    assert (out / TOKENIZER_LINK).resolve() == tok.resolve()
    assert yaml.safe_load(options_file.read_text()) == {
        "kv_cache_config": {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.85},
        "enable_chunked_prefill": False, "return_perf_metrics": True}  # the last: /prometheus/metrics
    write_engine_serve_inputs(repo, out, "llama-70b-fp8")  # a rerun replaces the links
    assert link.resolve() == eng.resolve()


def test_engine_serve_inputs_refusals(tmp_path, capsys):
    repo, *_ = _installed_engine_repo(tmp_path / "a", engine="../../../engines/b/engine")
    with pytest.raises(DeployError, match="gpt_model_path.*not an existing absolute directory.*install-repo"):
        write_engine_serve_inputs(repo, tmp_path / "out", "m")
    repo, *_ = _installed_engine_repo(tmp_path / "b", draft=True)
    with pytest.raises(DeployError, match="draft-target release.*--serve-mode triton"):
        write_engine_serve_inputs(repo, tmp_path / "out", "m")
    repo, *_ = _installed_engine_repo(tmp_path / "c", fraction="1.5")
    with pytest.raises(DeployError, match="kv_cache_free_gpu_mem_fraction '1.5'"):
        write_engine_serve_inputs(repo, tmp_path / "out", "m")
    repo, *_ = _installed_engine_repo(tmp_path / "d")
    with pytest.raises(DeployError, match="'tokenizer' is reserved"):
        write_engine_serve_inputs(repo, tmp_path / "out", "tokenizer")
    assert serve_inputs_main(["--engine", str(tmp_path / "nowhere"), str(tmp_path / "out"), "m"]) == 2
    assert "no tensorrt_llm/config.pbtxt" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_rendered_node_step_then_the_rank_program(tmp_path):
    """fetch-verify.sh's serve-inputs line as rendered, run by /bin/sh with this interpreter, then rank.sh: the
    argv trtllm-serve gets points at the links that line wrote."""
    spec = resolve_spec(model="tiny-llama", precision="fp8")
    rt = runtime_for(spec, "tiny-llama-fp8", placement=place(1, 1, spec.hardware), platform="k8s",
                     serve_mode="trtllm-serve")
    repo, eng, tok = _installed_engine_repo(tmp_path)
    work = tmp_path / "node work"
    setup = fetch_verify_script(rt).splitlines()[-1]
    env = {"PATH": "/usr/bin:/bin", "PIPELINE_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    subprocess.run(["/bin/sh", "-c", f'set -eu\nrepo="$1"\nwork="$2"\n{setup}', "sh", str(repo), str(work)],
                   env=env, check=True, timeout=120)
    argv = run_rank(rt.rank_script, tmp_path)
    assert Path(argv[1]).resolve() == eng.resolve()
    assert Path(argv[argv.index("--tokenizer") + 1]).resolve() == tok.resolve()
    assert Path(argv[argv.index("--extra_llm_api_options") + 1]).is_file()


def test_a_reference_build_is_not_deployed_with_trtllm_serve():
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(DeployError, match="--target reference build is served by tritonserver"):
        runtime_for(spec, "tiny-llama-fp8", placement=place(1, 1, spec.hardware), platform="slurm",
                    serve_mode="trtllm-serve")
