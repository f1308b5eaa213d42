"""build: stage ranges, fail-fast validation before any I/O, CLI exit codes (the real chain: test_e2e_release)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import CompileError, DownloadError
from pipeline.core.spec import resolve_spec
from pipeline.stages.build import STAGES, BuildError, build, stage_range

ROOT = Path(__file__).resolve().parents[2]


def test_stage_range_defaults_and_bounds():
    assert stage_range(until=None, from_stage=None, force=None, target="trtllm") == list(STAGES)
    assert stage_range(until="calibrate", from_stage=None, force=None, target="reference") == [
        "check", "download", "calibrate"]
    assert stage_range(until=None, from_stage="package", force="package", target="reference") == ["package"]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(until="deploy"), "--until 'deploy' is not a stage"),
        (dict(from_stage="package", until="download"), "--from package comes after --until download"),
        (dict(force="download", from_stage="calibrate"), "--force download is outside"),
        (dict(force="compile", target="reference"), "--force compile: target=reference has no compile stage"),
        (dict(force="compile", runtime="pytorch"), "--force compile: runtime pytorch has nothing to compile"),
    ],
)
def test_stage_range_errors(kwargs, needle):
    args = dict(until=None, from_stage=None, force=None, target="trtllm") | kwargs
    with pytest.raises(BuildError, match=needle):
        stage_range(**args)


def test_impossible_trtllm_build_fails_in_check_before_any_output(tmp_path, monkeypatch):
    """On a host without TensorRT-LLM/GPU a trtllm build stops at the preflight; nothing is written."""
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    from pipeline.stages.compile.preflight import probe_host

    if probe_host().trtllm_installed:
        pytest.skip("TensorRT-LLM is installed here: the preflight may pass")
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    lines: list[str] = []
    with pytest.raises(CompileError, match="compiling needs an H100-class GPU"):
        build(spec, progress=lines.append)
    assert lines == ["[1/5] check: validating spec and GPU/toolchain preflight ..."]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def invoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_rejects_invalid_spec_and_bad_stage_with_exit_2(tmp_path):
    import os

    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path / "out"), PIPELINE_CACHE=str(tmp_path / "cache"))
    r = invoke("build", "--model", "llama-70b", "--precision", "fp8", "--gpu", "a100", env=env)
    assert r.returncode == 2 and r.stderr.startswith("error: hardware.gpu=a100") and "Traceback" not in r.stderr
    r = invoke("build", "--model", "tiny-llama", "--target", "reference", "--until", "deploy", env=env)
    assert r.returncode == 2 and "--until 'deploy' is not a stage" in r.stderr
    assert not (tmp_path / "out").exists()


def test_from_past_calibrate_without_any_checkpoint_is_refused_before_download(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(DownloadError, match="tiny-llama has not been generated in .*; run `invoke build` first"):
        build(spec, from_stage="package", progress=None)
    assert not (tmp_path / "cache").exists()  # nothing downloaded or generated


def test_release_without_a_build_is_refused(tmp_path, monkeypatch):
    from pipeline.ops.release import release

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(DownloadError, match="run `invoke build`"):
        release(spec)
    assert not (tmp_path / "out" / "releases").exists()


def test_package_and_compile_find_the_checkpoint_but_never_calibrate(pipeline_env):
    """`invoke package` (and compile's lookup) ask the calibrate stage check-only: no checkpoint, one line."""
    import os

    from pipeline.stages.compile.inputs import locate_checkpoints
    from pipeline.core.errors import CalibrationError

    env = dict(os.environ)  # PIPELINE_ROOT/PIPELINE_CACHE from the fixture; the generated models are there
    r = invoke("package", "--model", "tiny-llama", "--precision", "fp8", "--target", "reference", env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "no current target checkpoint for tiny-llama fp8" in lines[0]
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto")
    with pytest.raises(CalibrationError, match="no current target checkpoint"):
        locate_checkpoints(spec, checkpoint_dir=None, draft_checkpoint_dir=None, dry_run=False)
    assert not (pipeline_env / "out" / "engines").exists()  # nothing calibrated, nothing started


@pytest.mark.slow
def test_runtime_pytorch_build_exports_hf_skips_compile_and_packages_llmapi(pipeline_env):
    import json

    import yaml

    from pipeline.stages.package.llmapi_options import LlmApiOptions

    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", runtime="pytorch", calib_size=4,
                        calib_seq_len=32)
    lines: list[str] = []
    report = build(spec, progress=lines.append)
    stages = {o.stage: o for o in report.stages}
    assert stages["compile"].status == "skipped" and "no-op, nothing to compile" in stages["compile"].detail
    assert any(line.startswith("compile: skipped (no-op") for line in lines)
    ckpt, draft = report.outputs.checkpoint.path, report.outputs.draft_checkpoint.path
    assert ckpt.name == draft.name == "hf_checkpoint" and report.outputs.engine is None
    q = json.loads((ckpt / "hf_quant_config.json").read_text())["quantization"]
    assert (q["quant_algo"], q["kv_cache_quant_algo"]) == ("FP8", "FP8")
    repo = report.outputs.triton_repo.path
    # target trtllm builds on a CPU host too: nothing is compiled, the llmapi repo runs tensorrt_llm.LLM at serve time
    m = report.outputs.triton_repo.manifest
    assert not repo.name.endswith("-reference") and (m.target, m.runtime) == ("trtllm", "pytorch")
    data = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    options = LlmApiOptions.from_mapping({k: v for k, v in data.items() if k in LlmApiOptions.model_fields},
                                         what="model.yaml")
    assert options.speculative_config.max_draft_len == 4 and options.kv_cache_config.dtype == "fp8"
    again = build(spec, progress=None)
    assert again.noop and again.outputs.triton_repo.path == repo
