"""The invoke CLI: `check` and `plan` exit codes, messages, JSON keys, instant start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_check_ok_prints_one_line():
    r = invoke("check", "--model", "llama-70b", "--precision", "fp8", "--tp", "4", "--draft", "llama-1b",
               "--max-batch", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("ok: llama-70b")
    assert "draft=llama-1b K=5" in r.stdout


def test_check_bad_combo_exits_2_with_one_line():
    r = invoke("check", "--model", "llama-70b", "--precision", "int4_awq", "--kv-cache", "fp8")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: quantization:")
    assert "Traceback" not in r.stderr


def test_check_unknown_model_exits_2():
    r = invoke("check", "--model", "gpt-5")
    assert r.returncode == 2 and "unknown model 'gpt-5'" in r.stderr


def test_check_spec_file_with_flag_override(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("model: llama-8b\nquantization: {precision: int4_awq}\nparallelism: {tp: 2}\n")
    r = invoke("check", "--spec", str(f), "--precision", "fp8")
    assert r.returncode == 0, r.stderr
    assert "precision=fp8 kv=fp8 tp=2" in r.stdout


def test_check_bad_spec_file_key(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("model: llama-8b\nquantisation: {precision: fp8}\n")
    r = invoke("check", "--spec", str(f))
    assert r.returncode == 2 and "unknown key(s) quantisation" in r.stderr


def test_check_bad_int_flag():
    r = invoke("check", "--model", "llama-8b", "--tp", "two")
    assert r.returncode == 2 and "parallelism.tp='two'" in r.stderr


def test_no_kv_reuse_flag_unblocks_int4_fp8_kv():
    r = invoke("check", "--model", "llama-70b", "--precision", "int4_awq", "--kv-cache", "fp8", "--no-kv-reuse",
               "--no-chunked-context")
    assert r.returncode == 0, r.stderr
    assert "kv_reuse=off" in r.stdout


def test_plan_json_keys():
    r = invoke("plan", "--model", "llama-70b", "--precision", "fp8", "--json", "--gpu-price", "3.0")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for key in ("weights_gib_total", "weights_gib_per_gpu", "kv_bytes_per_token_total", "kv_bytes_per_token_per_gpu",
                "kv_cache_tokens", "max_concurrent_requests", "fits", "min_tp", "decode_tokens_per_s_bound",
                "cost_per_1m_output_tokens_usd"):
        assert key in data
    assert data["weights_gib_total"] == 67.67 and data["gpu_price_per_hour"] == 3.0


def test_plan_table():
    r = invoke("plan", "--model", "llama-8b", "--precision", "int4_awq", "--input-len", "2000", "--output-len", "500")
    assert r.returncode == 0, r.stderr
    assert "concurrent requests @ 2000+500" in r.stdout and "cost per 1M output tokens" in r.stdout


def test_plan_bad_lengths_exit_2_with_one_line():
    for args, message in (
        (("--input-len", "abc"), "error: --input-len='abc': expected an integer >= 1"),
        (("--output-len", "-5"), "error: --output-len=-5: must be >= 1"),
        (("--input-len", "100000"), "error: plan: --input-len=100000 must be within 1..max_input_len=4096"),
    ):
        r = invoke("plan", "--model", "llama-70b", "--precision", "fp8", *args)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(message), r.stderr


def test_startup_imports_no_heavy_modules():
    code = (
        "import sys, tasks; from pipeline.spec import resolve_spec; from pipeline.planner import plan; "
        "plan(resolve_spec(model='llama-8b')); "
        "heavy = [m for m in ('torch', 'modelopt', 'tritonclient', 'transformers', 'tensorrt_llm', 'huggingface_hub')"
        " if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_spec_task_shares_the_flags():
    from invoke import Collection

    import tasks
    from pipeline.cli import SPEC_FLAGS

    coll = Collection.from_module(tasks)
    names = {f.name.replace("_", "-") for f in SPEC_FLAGS}
    for task_name in ("check", "plan"):
        args = {a.name.replace("_", "-") for a in coll[task_name].get_arguments()}
        assert names <= {n for n in args}, task_name


def test_task_numeric_options_fail_with_one_line():
    for args, msg in (
        (("smoke", "--max-tokens", "abc"), "--max-tokens='abc': expected an integer"),
        (("bench", "--model", "tiny-llama", "--budget", "x"), "--budget='x': expected a number"),
        (("serve", "--repo", "r", "--http-port", "0"), "--http-port=0: must be >= 1"),
    ):
        r = invoke(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().splitlines() == [f"error: {r.stderr.strip().removeprefix('error: ')}"]
        assert msg in r.stderr and "Traceback" not in r.stderr
