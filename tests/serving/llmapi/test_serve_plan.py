"""The trtllm-serve plan: exact argv (HF checkpoint or engine) for one node and for Slurm across nodes, checked against
the recorded 1.2 CLI options, and `serve --mode trtllm-serve` (--print-only from the spec alone)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.cli.commands import serve_command
from pipeline.core.errors import DownloadError, HostError, IntegrityError, SpecError
from pipeline.core.spec import resolve_spec
from pipeline.serving.llmapi import local_inputs
from pipeline.stages.package import serve_plan
from pipeline.stages.package.llmapi_options import engine_serve_options
from tests.support.trtllm_serve_cli_table import backend_choices
from tests.support.trtllm_serve_cli_table import options as cli_options


def test_single_node_argv():
    spec = resolve_spec(model="llama-8b", precision="fp8", tp=2, pp=2, runtime="pytorch")
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/m/hf"), options_file=Path("/m/o.yaml"), port=8123)
    assert plan.argv == ["trtllm-serve", "/m/hf", "--backend", "pytorch", "--tp_size", "2", "--pp_size", "2",
                         "--host", "127.0.0.1", "--port", "8123", "--extra_llm_api_options", "/m/o.yaml"]
    assert (plan.world_size, plan.nodes, plan.multi_node) == (4, 1, False)


def test_multi_node_uses_slurm_and_the_llmapi_launcher():
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=8, pp=2, nodes=2, gpus_per_node=8, runtime="pytorch")
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/m"), options_file=Path("/o.yaml"), host="0.0.0.0")
    assert plan.argv[:6] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
                             "trtllm-llmapi-launch"]
    assert plan.argv[6:8] == ["trtllm-serve", "/m"] and plan.multi_node and plan.world_size == 16


def test_missing_trtllm_serve_is_a_host_error(monkeypatch):
    monkeypatch.setattr(serve_plan.shutil, "which", lambda name: None)
    with pytest.raises(HostError, match="trtllm-serve is not on PATH") as err:
        serve_plan.require_trtllm_serve()
    assert err.value.exit_code == 4


@pytest.fixture
def root(monkeypatch, tmp_path) -> Path:
    """A private, empty output tree and cache: nothing downloaded or built."""
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "out"


def _check_against_cli(argv: list[str]) -> None:
    """Every flag of the trtllm-serve part is a 1.2 click option, with a value exactly when it takes one."""
    table = cli_options()
    serve = argv[argv.index("trtllm-serve") + 1:]
    assert not serve[0].startswith("--")  # MODEL, the positional argument
    i = 1
    while i < len(serve):
        flag = serve[i]
        assert flag in table, flag
        if table[flag] == "flag":
            i += 1
            continue
        value = serve[i + 1]
        assert not value.startswith("--"), (flag, value)
        if table[flag] == "int":
            int(value)
        if flag == "--backend":
            assert value in backend_choices()
        i += 2


def test_engine_argv_is_the_tensorrt_backend_with_the_engines_own_limits():
    spec = resolve_spec(model="llama-8b", precision="fp8", tp=2, max_batch_size=32, max_seq_len=4096)
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/e/engine"), tokenizer_dir=Path("/e/tok"),
                                        options_file=Path("/e/o.yaml"), port=8123)
    assert plan.argv == ["trtllm-serve", "/e/engine", "--backend", "tensorrt", "--tokenizer", "/e/tok",
                         "--tp_size", "2", "--pp_size", "1", "--max_batch_size", "32", "--max_num_tokens", "8192",
                         "--max_seq_len", "4096", "--host", "127.0.0.1", "--port", "8123",
                         "--extra_llm_api_options", "/e/o.yaml"]
    assert (plan.backend, plan.world_size, plan.multi_node) == ("tensorrt", 2, False)
    _check_against_cli(plan.argv)
    with pytest.raises(SpecError, match="needs its tokenizer directory"):
        serve_plan.trtllm_serve_plan(spec, model_dir=Path("/e/engine"), options_file=Path("/e/o.yaml"))


def test_pytorch_argv_flags_are_cli_options_too():
    spec = resolve_spec(model="llama-8b", precision="fp8", tp=2, runtime="pytorch")
    _check_against_cli(serve_plan.trtllm_serve_plan(spec, model_dir=Path("/m"), options_file=Path("/o")).argv)


def test_cli_check_catches_a_flag_trtllm_serve_lacks():
    with pytest.raises(AssertionError, match="--served_model_name"):
        _check_against_cli(["trtllm-serve", "/m", "--served_model_name", "x"])


def test_multi_node_engine_ranks_run_the_launcher_under_srun():
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=8, pp=2, nodes=2, gpus_per_node=8)
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/e"), tokenizer_dir=Path("/t"),
                                        options_file=Path("/o"), host="0.0.0.0")
    assert plan.argv[:8] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
                             "trtllm-llmapi-launch", "trtllm-serve", "/e"]
    assert plan.argv[plan.argv.index("--tp_size") + 1] == "8" and plan.world_size == 16
    _check_against_cli(plan.argv)


def test_engine_with_a_draft_is_refused_with_the_way_out():
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto")
    with pytest.raises(SpecError, match="no draft-target speculation.*--mode triton"):
        serve_plan.trtllm_serve_plan(spec, model_dir=Path("/e"), tokenizer_dir=Path("/t"), options_file=Path("/o"))
    with pytest.raises(SpecError, match="no draft-target speculation"):
        serve_command(spec, mode="trtllm-serve", print_only=True)
    reference = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(SpecError, match="--target reference"):
        serve_command(reference, mode="trtllm-serve", print_only=True)


def test_command_line_quotes_every_word():
    spec = resolve_spec(model="llama-8b", precision="fp8", runtime="pytorch")
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=Path("/a dir/m"), options_file=Path("/o;rm x"))
    assert "'/a dir/m'" in plan.command_line() and "'/o;rm x'" in plan.command_line()


def test_engine_options_are_the_specs_runtime_kv_settings():
    on = engine_serve_options(resolve_spec(model="llama-8b", precision="fp8", kv_cache_free_gpu_mem_fraction=0.85))
    assert on.as_dict() == {"kv_cache_config": {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.85},
                            "enable_chunked_prefill": True}
    off = engine_serve_options(resolve_spec(model="llama-8b", precision="int8_sq", kv_cache="int8",
                                            enable_kv_cache_reuse=False, enable_chunked_context=False))
    assert off.as_dict()["kv_cache_config"]["enable_block_reuse"] is False
    assert off.as_dict()["enable_chunked_prefill"] is False


def test_serve_mode_errors():
    with pytest.raises(SpecError, match="give its spec"):
        serve_command(None, mode="trtllm-serve")
    with pytest.raises(SpecError, match="--mode 'vllm'"):
        serve_command(None, mode="vllm")


@pytest.mark.parametrize("runtime", ["engine", "pytorch"])
def test_print_only_needs_no_download_and_writes_nothing(root, capsys, runtime):
    before = sorted(root.parent.rglob("*"))
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=8, pp=2, nodes=2, gpus_per_node=8, runtime=runtime)
    plan = serve_command(spec, mode="trtllm-serve", print_only=True, host="0.0.0.0")
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == plan.command_line() and plan.multi_node
    model = plan.argv[plan.argv.index("trtllm-serve") + 1]
    pending = root / "engines" / "<build-id>"
    assert model == str(pending / ("engine" if runtime == "engine" else "hf_checkpoint"))
    assert plan.options_file == str(pending / local_inputs.options_file_name(spec))
    shown = yaml.safe_load("\n".join(line[4:] for line in lines[2:]))
    assert lines[1].startswith(f"# {plan.options_file} (written when served")
    assert ("kv_cache_config" in shown) and (("tensor_parallel_size" in shown) == (runtime == "pytorch"))
    assert "has not been downloaded" in err and "where the build will put its outputs" in err
    assert sorted(root.parent.rglob("*")) == before


def _fake_outputs(root: Path, runtime: str) -> SimpleNamespace:
    base = root / "engines" / "m-fp8-0123456789ab"
    ckpt = base / ("hf_checkpoint" if runtime == "pytorch" else "checkpoint")
    (ckpt / "tokenizer").mkdir(parents=True)
    (base / "engine").mkdir()
    return SimpleNamespace(checkpoint=SimpleNamespace(path=ckpt), engine=SimpleNamespace(path=base / "engine"),
                           draft_checkpoint=None, layout=SimpleNamespace(tokenizer=ckpt / "tokenizer"))


@pytest.mark.parametrize("runtime", ["engine", "pytorch"])
def test_a_finished_build_is_served_from_its_paths_with_its_options_written(root, monkeypatch, capsys, runtime):
    out = _fake_outputs(root, runtime)
    seen = []
    monkeypatch.setattr(local_inputs, "locate_outputs", lambda spec, until: seen.append(until) or out)
    spec = resolve_spec(model="llama-8b", precision="fp8", runtime=runtime)
    plan = serve_command(spec, mode="trtllm-serve", print_only=True)
    assert capsys.readouterr().out.splitlines() == [plan.command_line()]
    assert seen == ["compile" if runtime == "engine" else "calibrate"]
    options_file = Path(plan.options_file)
    assert options_file.parent == out.checkpoint.path.parent and options_file.is_file()
    written = yaml.safe_load(options_file.read_text())
    if runtime == "engine":
        assert plan.argv[1] == str(out.engine.path)
        assert plan.argv[plan.argv.index("--tokenizer") + 1] == str(out.layout.tokenizer)
        assert written == engine_serve_options(spec).as_dict()
    else:
        assert plan.argv[1] == str(out.checkpoint.path) and "--tokenizer" not in plan.argv
        assert written["kv_cache_config"]["dtype"] == "fp8"


def test_without_print_only_a_missing_build_says_what_to_run(root, monkeypatch):
    def missing(spec, until):
        raise DownloadError("offline: m has not been downloaded; run `invoke download --model m` first")

    monkeypatch.setattr(local_inputs, "locate_outputs", missing)
    with pytest.raises(DownloadError, match="invoke download"):
        serve_command(resolve_spec(model="llama-8b", precision="fp8"), mode="trtllm-serve")


def test_a_corrupt_build_fails_even_with_print_only(root, monkeypatch):
    def corrupt(spec, until):
        raise IntegrityError("engines/x/engine/rank0.engine differs from its manifest; rerun with --force compile")

    monkeypatch.setattr(local_inputs, "locate_outputs", corrupt)
    with pytest.raises(IntegrityError) as err:
        serve_command(resolve_spec(model="llama-8b", precision="fp8"), mode="trtllm-serve", print_only=True)
    assert err.value.exit_code == 3
