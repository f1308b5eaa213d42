"""Golden `invoke compile --dry-run --json` plans, and every emitted flag walked against the 1.2.1 flag table.

The golden files (tests/stages/compile/golden/compile-<case>.json) are the whole dry-run JSON with the output root replaced by
`$PIPELINE_ROOT`. After an intended plan change, regenerate them with
`UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/stages/compile/test_golden.py` and review the diff: each file is what
trtllm-build 1.2.1 will be run with. Besides the byte-for-byte comparison, each case asserts the decisions it
exists to pin (DECISIONS), so a regenerated golden cannot silently drop one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli.commands import compile_command
from pipeline.core.spec import resolve_spec
from pipeline.stages.compile.flags import ACCEPTED, BUILD_FLAGS, PLUGIN_FLAGS

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).with_name("golden")

CASES: dict[str, dict] = {
    "llama70b-fp8-tp4": dict(model="llama-70b", precision="fp8", tp=4),
    "llama70b-fp8-tp4-draft-llama1b-k5": dict(model="llama-70b", precision="fp8", tp=4, draft="llama-1b",
                                              draft_len=5),
    "llama8b-fp8-draft-llama1b-batch4": dict(model="llama-8b", precision="fp8", draft="llama-1b", max_batch_size=4),
    "llama70b-int4awq": dict(model="llama-70b", precision="int4_awq"),
    "llama70b-w4a8awq-tp4": dict(model="llama-70b", precision="w4a8_awq", tp=4),
    "llama8b-int8sq": dict(model="llama-8b", precision="int8_sq"),
    "llama70b-bf16-tp8": dict(model="llama-70b", precision="bf16", tp=8),
}

# What each golden exists to pin, per engine: --flag -> value (sources: pipeline/core/trtllm_rules.py's table).
DECISIONS: dict[str, dict[str, dict[str, str]]] = {
    "llama70b-fp8-tp4": {"target": {
        "--reduce_fusion": "enable", "--user_buffer": "enable", "--gemm_plugin": "disable",
        "--gemm_swiglu_plugin": "fp8", "--low_latency_gemm_plugin": "disable", "--use_fused_mlp": "enable",
        "--use_fp8_context_fmha": "enable", "--use_paged_context_fmha": "enable", "--multiple_profiles": "enable",
        "--workers": "4", "--max_batch_size": "64", "--max_draft_len": "0"}},
    "llama70b-fp8-tp4-draft-llama1b-k5": {
        "target": {"--reduce_fusion": "enable", "--user_buffer": "disable", "--workers": "4",
                   "--max_batch_size": "64", "--speculative_decoding_mode": "draft_tokens_external",
                   "--max_draft_len": "5", "--max_seq_len": "8192", "--max_num_tokens": "8192",
                   "--gemm_swiglu_plugin": "fp8"},
        "draft": {"--reduce_fusion": "disable", "--user_buffer": "disable", "--workers": "1",
                  "--max_batch_size": "8", "--max_seq_len": "8197", "--max_draft_len": "0",
                  "--gemm_swiglu_plugin": "disable", "--low_latency_gemm_plugin": "disable",
                  "--use_paged_context_fmha": "enable"}},
    "llama8b-fp8-draft-llama1b-batch4": {
        "target": {"--low_latency_gemm_plugin": "fp8", "--low_latency_gemm_swiglu_plugin": "fp8",
                   "--gemm_plugin": "disable", "--reduce_fusion": "disable", "--max_batch_size": "4",
                   "--max_draft_len": "5"},
        "draft": {"--low_latency_gemm_plugin": "fp8", "--max_batch_size": "4", "--max_seq_len": "8197",
                  "--workers": "1"}},
    "llama70b-int4awq": {"target": {
        "--gemm_plugin": "bfloat16", "--use_fp8_context_fmha": "disable", "--use_paged_context_fmha": "enable",
        "--reduce_fusion": "disable", "--user_buffer": "disable", "--gemm_swiglu_plugin": "disable",
        "--workers": "1"}},
    "llama70b-w4a8awq-tp4": {"target": {  # fp16 activations, as upstream's W4A8-AWQ recipes
        "--gemm_plugin": "float16", "--gpt_attention_plugin": "float16", "--use_fp8_context_fmha": "enable",
        "--reduce_fusion": "enable", "--user_buffer": "disable", "--low_latency_gemm_plugin": "disable",
        "--workers": "4"}},
    "llama8b-int8sq": {"target": {
        "--gemm_plugin": "bfloat16", "--use_fp8_context_fmha": "disable", "--reduce_fusion": "disable",
        "--max_batch_size": "128"}},
    "llama70b-bf16-tp8": {"target": {
        "--gemm_plugin": "bfloat16", "--gpt_attention_plugin": "bfloat16", "--reduce_fusion": "enable",
        "--user_buffer": "disable", "--use_fp8_context_fmha": "disable", "--workers": "8"}},
}


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = tmp_path / "root"
    monkeypatch.setenv("PIPELINE_ROOT", str(r))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return r


def _normalize(text: str, root: Path) -> dict:
    return json.loads(text.replace(str(root.resolve()), "$PIPELINE_ROOT").replace(str(root), "$PIPELINE_ROOT"))


def _dry_run(case: str, root: Path, capsys) -> dict:
    compile_command(resolve_spec(**CASES[case]), dry_run=True, json_=True)
    return _normalize(capsys.readouterr().out, root)


def _engines(plan: dict) -> dict[str, dict]:
    return {role: plan[role] for role in ("target", "draft") if plan[role] is not None}


@pytest.mark.parametrize("case", list(CASES))
def test_golden_dry_run_plan(case, root, capsys):
    plan = _dry_run(case, root, capsys)
    path = GOLDEN / f"compile-{case}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(plan, indent=2) + "\n")
    assert path.is_file(), f"no golden file {path}; run with UPDATE_GOLDEN=1 and review it"
    assert plan == json.loads(path.read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_golden_pins_its_decisions(case):
    plan = json.loads((GOLDEN / f"compile-{case}.json").read_text())
    engines = _engines(plan)
    assert set(engines) == set(DECISIONS[case])
    for role, want in DECISIONS[case].items():
        options = engines[role]["options"]
        assert {flag: options.get(flag) for flag in want} == want, role
        argv = engines[role]["argv"]
        assert argv[1::2] == list(options), role  # the argv is the options, in order, paths filled in
    assert plan["trtllm_version"] == "1.2.1"


def _value_ok(spec, value: str) -> bool:
    if spec.kind == "int":
        return value.lstrip("-").isdigit()
    if spec.kind == "choice":
        return value in spec.choices
    return spec.kind in ("str", "nargs+")


@pytest.mark.parametrize("case", list(CASES))
def test_every_emitted_flag_and_value_is_in_the_1_2_1_table(case):
    """Walk each golden argv flag by flag: an option of trtllm-build 1.2.1 (commands/build.py parse_arguments or
    plugin.py cli_plugin_args), given once, with a value its type or choices accept; and every plugin flag is
    recorded with the same value in the build_config the engine must end with."""
    plan = json.loads((GOLDEN / f"compile-{case}.json").read_text())
    build_names = {f.name for f in BUILD_FLAGS}
    plugin_names = {f.name for f in PLUGIN_FLAGS}
    for role, engine in _engines(plan).items():
        argv = engine["argv"]
        assert argv[0] == "trtllm-build"
        rest, seen = argv[1:], set()
        assert len(rest) % 2 == 0, f"{case}/{role}: every planned flag takes exactly one value"
        plugin_config = engine["expected_build_config"]["plugin_config"]
        for flag, value in zip(rest[::2], rest[1::2]):
            assert flag.startswith("--") and not value.startswith("--"), (case, role, flag, value)
            spec = ACCEPTED.get(flag)
            assert spec is not None, f"{case}/{role}: trtllm-build 1.2.1 has no {flag}"
            assert spec.kind != "store_true", f"{case}/{role}: {flag} takes no value"
            assert spec.name not in seen, f"{case}/{role}: {flag} given twice"
            seen.add(spec.name)
            assert _value_ok(spec, value), f"{case}/{role}: {flag} {value!r} is not a valid {spec.kind}"
            assert spec.name in build_names | plugin_names
            if spec.name in plugin_names:
                recorded = plugin_config.get(spec.name, "not planned")
                if value in ("enable", "disable") and spec.choices == ("enable", "disable"):
                    assert recorded is (value == "enable"), (case, role, flag)
                elif value == "disable":
                    assert recorded is None, (case, role, flag)
                elif spec.kind == "int":
                    assert recorded == int(value), (case, role, flag)
                else:
                    assert recorded == value, (case, role, flag)
            elif spec.name in engine["expected_build_config"] and spec.kind == "int":
                want = engine["expected_build_config"][spec.name]
                if spec.name == "max_seq_len" and engine["expected_build_config"]["max_draft_len"]:
                    want -= engine["expected_build_config"]["max_draft_len"]  # build() adds K to the target's
                assert int(value) == want, (case, role, flag)


def test_cli_dry_run_json_matches_the_golden(tmp_path):
    """The real CLI prints the same plan (one subprocess: `invoke compile ... --dry-run --json`; the golden's batch
    64 given, as the memory model would choose more)."""
    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path / "root"), PIPELINE_CACHE=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-m", "invoke", "compile", "--model", "llama-70b", "--precision", "fp8", "--tp", "4",
         "--draft", "llama-1b", "--draft-len", "5", "--max-batch", "64", "--dry-run", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )
    assert r.returncode == 0, r.stderr
    plan = _normalize(r.stdout, tmp_path / "root")
    assert plan == json.loads((GOLDEN / "compile-llama70b-fp8-tp4-draft-llama1b-k5.json").read_text())
    assert "speculation with max_batch_size=64" in r.stderr  # the spec's warning, on stderr


# Runtime pytorch compiles nothing: its dry run is what TensorRT-LLM 1.2.1's trtllm-serve is given (the command and
# its --extra_llm_api_options YAML, which the llmapi model.yaml carries too).
SERVE_CASES: dict[str, dict] = {
    "llama33-70b-fp8-tp4-pytorch-eagle3": dict(model="llama3.3-70b", precision="fp8", tp=4, runtime="pytorch",
                                               speculative_decoding="eagle3", draft="auto"),
}


def _serve_dry_run(case: str, tmp_path: Path, capsys) -> dict:
    compile_command(resolve_spec(**SERVE_CASES[case]), dry_run=True, json_=True)
    text = capsys.readouterr().out.replace(str((tmp_path / "cache").resolve()), "$PIPELINE_CACHE")
    return _normalize(text, tmp_path / "root")


@pytest.mark.parametrize("case", list(SERVE_CASES))
def test_golden_pytorch_dry_run_is_the_trtllm_serve_input(case, root, tmp_path, capsys):
    from tests.support import llm_args_table as table

    plan = _serve_dry_run(case, tmp_path, capsys)
    path = GOLDEN / f"compile-{case}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(plan, indent=2) + "\n")
    assert plan == json.loads(path.read_text())
    assert plan["compile"] is None and plan["trtllm_serve"][:4] == [
        "trtllm-serve", "$PIPELINE_ROOT/engines/<build-id>/hf_checkpoint", "--backend", "pytorch"]
    options = plan["extra_llm_api_options"]
    assert set(options) <= table.LLM_ARGS
    config = options["speculative_config"]
    assert config["decoding_type"] == "Eagle" and config["max_draft_len"] == 3
    assert set(config) - {"decoding_type"} <= table.CLASSES["Eagle"]
    # the head is served as downloaded: its pinned download directory, never an engine or a calibrated checkpoint
    assert config["speculative_model_dir"] == "$PIPELINE_CACHE/downloads/yuhuili--EAGLE3-LLaMA3.3-Instruct-70B/<commit>"


def test_cli_pytorch_eagle3_dry_run_downloads_nothing(tmp_path):
    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path / "root"), PIPELINE_CACHE=str(tmp_path / "cache"),
               HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-m", "invoke", "compile", "--model", "llama3.3-70b", "--precision", "fp8", "--tp", "4",
         "--runtime", "pytorch", "--speculative-decoding", "eagle3", "--draft", "auto", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "trtllm-serve " in r.stdout and "trtllm-build" not in r.stdout
    assert "  decoding_type: Eagle\n" in r.stdout and "speculative_model_dir: " in r.stdout
    assert not (tmp_path / "cache" / "downloads").exists() and not (tmp_path / "root" / "engines").exists()
