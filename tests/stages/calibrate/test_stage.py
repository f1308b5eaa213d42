"""Calibrate stage on the generated tiny Llama (CPU, real ModelOpt 0.37): recipes, export layout, quality gate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.core.errors import CalibrationError, SpecError
from pipeline.core.trtllm_rules import KV_QUANT_ALGO, QUANT_ALGO
from pipeline.stages.calibrate import data
from pipeline.stages.calibrate.stage import run_calibrate
from tests.support.calibrate_fixtures import calibrated, leftovers, make_spec, run_in_root

REPO = Path(__file__).resolve().parents[3]
PRECISIONS = ("bf16", "fp16", "fp8", "int8_sq", "int4_awq", "w4a8_awq")
KVS = ("fp8", "int8", "bf16", "fp16")


def _allowed_combos() -> list[tuple[str, str]]:
    out = []
    for precision in PRECISIONS:
        for kv in KVS:
            try:
                make_spec(precision=precision, kv_cache=kv)
            except SpecError:
                continue
            out.append((precision, kv))
    return out


COMBOS = _allowed_combos()


# --- calibration data --------------------------------------------------------------------------------------------
def test_combos_cover_every_precision_and_kv():
    assert {p for p, _ in COMBOS} == set(PRECISIONS)
    assert ("fp16", "bf16") not in COMBOS and ("fp8", "fp16") not in COMBOS
    # W4A8-AWQ computes in fp16 (upstream's recipes: quantize.py --dtype float16): its 16-bit KV is fp16
    assert ("w4a8_awq", "bf16") not in COMBOS and ("w4a8_awq", "fp16") in COMBOS
    assert len(COMBOS) == 18


def test_jsonl_and_plain_text(tmp_path):
    j = tmp_path / "c.jsonl"
    j.write_text('{"text": "alpha beta"}\n\n{"text": "gamma"}\n')
    assert data.load_texts(j)[0] == ["alpha beta", "gamma"]
    t = tmp_path / "c.txt"
    t.write_text("para one\nstill one\n\npara two\n")
    assert data.load_texts(t)[0] == ["para one\nstill one", "para two"]
    texts, source = data.load_texts(None)
    assert texts and source == "bundled-corpus"
    assert not set(texts) & set(data.heldout_texts(texts))


@pytest.mark.parametrize(
    "name, body, message",
    [
        ("bad.jsonl", '{"text": "ok"}\n{not json}\n', "bad.jsonl:2: not valid JSON"),
        ("nofield.jsonl", '{"body": "x"}\n', 'nofield.jsonl:1: expected an object with a string "text"'),
        ("empty.jsonl", "\n\n", "holds no text"),
        ("empty.txt", "   \n", "holds no text"),
    ],
)
def test_bad_calibration_files(tmp_path, name, body, message):
    p = tmp_path / name
    p.write_text(body)
    with pytest.raises(CalibrationError, match=message.replace("{", r"\{").replace('"', '"')):
        data.load_texts(p)


def test_calibration_directory_is_named_as_such(tmp_path):
    with pytest.raises(CalibrationError, match=r"is a directory, not a regular file; pass a \.jsonl or text file to "
                                               "--calib-data"):
        data.load_texts(tmp_path)


def test_missing_calibration_file_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    from pipeline.stages.check import resolve_checked_spec

    with pytest.raises(CalibrationError, match="does not exist"):  # the spec check already reads the file
        resolve_checked_spec(model="tiny-llama", precision="fp8", calib_data=str(tmp_path / "nope.jsonl"))
    spec = make_spec(precision="fp8")
    spec.quantization.calib_data = str(tmp_path / "nope.jsonl")  # e.g. deleted after the check
    with pytest.raises(CalibrationError, match="does not exist"):
        run_calibrate(spec, source=tmp_path / "no-model")
    assert leftovers(tmp_path) == []


def test_cli_malformed_calib_file_exits_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "calibrate", "--model", "tiny-llama", "--calib-data", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            "PIPELINE_ROOT": str(tmp_path),
            "PIPELINE_CACHE": str(tmp_path / "c"),
            "HF_HUB_OFFLINE": "1",
            "PATH": "/usr/bin:/bin",
        },
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "bad.jsonl:1" in proc.stderr


def test_pack_is_seeded_and_fingerprinted():
    texts = [f"text number {i} " * 5 for i in range(40)]
    def enc(s):
        return [ord(c) for c in s]

    a = data.pack(texts, enc, size=4, seq_len=16, seed=0, source="t")
    b = data.pack(texts, enc, size=4, seq_len=16, seed=0, source="t")
    c = data.pack(texts, enc, size=4, seq_len=16, seed=1, source="t")
    assert a == b and a.fingerprint != c.fingerprint
    assert len(a.samples) == 4 and all(len(s) == 16 for s in a.samples)
    short = data.pack(["abc"], enc, size=4, seq_len=16, seed=0, source="t")
    assert short.samples == [[97, 98, 99]]
    with pytest.raises(CalibrationError, match="zero tokens"):
        data.pack([""], enc, size=1, seq_len=4, seed=0, source="t")


# --- every precision x KV the validator allows --------------------------------------------------------------------
# the export dtype: fp16 for fp16 and W4A8-AWQ (upstream's quantize.py --dtype float16 --qformat w4a8_awq)
_HALF = {p: torch.float16 if p in ("fp16", "w4a8_awq") else torch.bfloat16 for p in PRECISIONS}


def _expect_linear(w: dict, prefix: str, precision: str, out_f: int, in_f: int, block: int = 128) -> None:
    wt = w[f"{prefix}.weight"]
    if precision in ("bf16", "fp16"):
        assert wt.dtype == _HALF[precision] and wt.shape == (out_f, in_f)
        assert f"{prefix}.weights_scaling_factor" not in w
        return
    wsf = w[f"{prefix}.weights_scaling_factor"]
    assert wsf.dtype == torch.float32
    if precision == "fp8":
        assert wt.dtype == torch.float8_e4m3fn and wt.shape == (out_f, in_f) and wsf.shape == (1,)
    elif precision == "int8_sq":
        assert wt.dtype == torch.int8 and wt.shape == (out_f, in_f) and wsf.shape == (out_f,)
        assert w[f"{prefix}.prequant_scaling_factor"].shape == (in_f,)
    else:  # int4_awq / w4a8_awq: two int4 per int8 byte along the output dim, one scale per block of 128 inputs
        assert wt.dtype == torch.int8 and wt.shape == (out_f // 2, in_f) and wsf.shape == (out_f, in_f // block)
        assert w[f"{prefix}.prequant_scaling_factor"].shape == (in_f,)
        assert (f"{prefix}.weights_scaling_factor_2" in w) == (precision == "w4a8_awq")
    has_act = precision in ("fp8", "int8_sq", "w4a8_awq")
    assert (f"{prefix}.activation_scaling_factor" in w) == has_act
    if has_act:
        assert w[f"{prefix}.activation_scaling_factor"].shape == (1,)


@pytest.mark.slow
@pytest.mark.parametrize("precision, kv", COMBOS, ids=[f"{p}-kv_{k}" for p, k in COMBOS])
def test_precision_kv_matrix(tiny_models, precision, kv):
    tp = 2 if precision in ("int4_awq", "w4a8_awq") else 1  # AWQ also exercises TP sharding of packed weights
    pp = 2 if (precision, kv) == ("fp8", "fp8") else 1
    # 2 calibration samples are enough for the layout but not always for the 1 % gate (tested on its own below).
    res = calibrated(tiny_models, precision=precision, kv_cache=kv, tp=tp, pp=pp, quality_gate=False)
    ck = res.path
    assert (
        ck.name == "checkpoint"
        and res.manifest.build_id == ck.parent.name
        and res.manifest.build_id.startswith(f"tiny-llama-{precision}-")
    )
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["architecture"] == "LlamaForCausalLM"
    assert cfg["dtype"] == ("float16" if _HALF[precision] == torch.float16 else "bfloat16")
    assert cfg["quantization"]["quant_algo"] == QUANT_ALGO[precision]
    assert cfg["quantization"]["kv_cache_quant_algo"] == KV_QUANT_ALGO[kv]
    assert cfg["mapping"] == {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]) == (
        4,
        256,
        512,
        1024,
    )
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rotary_base"]) == (8, 4, 10000.0)
    if precision in ("int4_awq", "w4a8_awq"):
        q = cfg["quantization"]
        assert (q["group_size"], q["has_zero_point"], q["pre_quant_scale"]) == (128, False, True)
    assert sorted(p.name for p in ck.glob("rank*.safetensors")) == [f"rank{i}.safetensors" for i in range(tp * pp)]
    w = load_file(str(ck / "rank0.safetensors"))
    pre = "transformer.layers.0"
    _expect_linear(w, f"{pre}.attention.qkv", precision, (256 + 2 * 128) // tp, 256)
    _expect_linear(w, f"{pre}.attention.dense", precision, 256, 256 // tp)
    _expect_linear(w, f"{pre}.mlp.fc", precision, 512 // tp, 256)
    _expect_linear(w, f"{pre}.mlp.gate", precision, 512 // tp, 256)
    _expect_linear(w, f"{pre}.mlp.proj", precision, 256, 512 // tp)
    if KV_QUANT_ALGO[kv]:
        assert w[f"{pre}.attention.kv_cache_scaling_factor"].dtype == torch.float32
    else:
        assert f"{pre}.attention.kv_cache_scaling_factor" not in w
    last = load_file(str(ck / f"rank{tp * pp - 1}.safetensors"))
    assert last["lm_head.weight"].dtype == _HALF[precision]
    assert (ck / "tokenizer" / "tokenizer.json").is_file()
    m = res.manifest
    assert m.key and m.roundtrip.passed
    if precision not in ("int4_awq", "w4a8_awq"):
        assert m.roundtrip.max_rel_logit_err < 1e-2
    assert {"ppl_base", "ppl_quant", "ppl_delta_pct", "kl_mean", "top1_agreement"} <= set(m.quality.model_dump())
    assert m.recipe.quant_algo == QUANT_ALGO[precision] and m.parallelism["tp"] == tp
    assert set(m.toolchain) >= {"torch", "modelopt", "transformers"}
    assert m.calibration.samples == 2 and len(m.calibration.fingerprint) == 64
    assert m.files["config.json"].size > 0 and "tokenizer/tokenizer.json" in m.files
    assert m.tokenizer.file == "tokenizer.json"


# --- quality gate, no-op re-runs, draft role -----------------------------------------------------------------------
@pytest.mark.slow
def test_fp8_gate_passes_and_rerun_is_noop(tiny_models):
    first = calibrated(tiny_models, precision="fp8", kv_cache="fp8")
    q = first.manifest.quality
    assert q.passed and 0 <= abs(q.ppl_delta_pct) < 1.0 and q.top1_agreement > 0.9 and q.kl_mean >= 0
    from tests.support.calibrate_fixtures import session_root

    again = run_in_root(
        session_root(), run_calibrate, make_spec(precision="fp8", kv_cache="fp8"), source=tiny_models["tiny-llama"]
    )
    assert again.status == "cached" and again.manifest == first.manifest


@pytest.mark.slow
def test_impossible_gate_fails_with_both_numbers_and_leaves_nothing(tiny_models, tmp_path):
    spec = make_spec(precision="fp8", kv_cache="fp8", max_ppl_delta_pct=1e-9)
    with pytest.raises(CalibrationError) as err:
        run_in_root(tmp_path, run_calibrate, spec, source=tiny_models["tiny-llama"])
    msg = str(err.value)
    assert err.value.exit_code == 2 and "quality gate failed" in msg and "\n" not in msg
    assert msg.count(" -> ") == 1 and "--no-quality-gate" in msg
    assert not list((tmp_path / "engines").glob("*/checkpoint")) and not list((tmp_path / "engines").rglob(".tmp-*"))
    # Not enforced: the checkpoint is written and the failing numbers are recorded.
    soft = make_spec(precision="fp8", kv_cache="fp8", max_ppl_delta_pct=1e-9, quality_gate=False)
    res = run_in_root(tmp_path, run_calibrate, soft, source=tiny_models["tiny-llama"])
    assert res.manifest.quality.passed is False and res.manifest.quality.enforced is False
    # Enforcing again finds the cached checkpoint but still refuses it (the gate is re-applied to its numbers).
    with pytest.raises(CalibrationError, match="quality gate failed"):
        run_in_root(tmp_path, run_calibrate, spec, source=tiny_models["tiny-llama"])


@pytest.mark.slow
def test_draft_role_uses_draft_model_and_precision(tiny_models):
    res = calibrated(
        tiny_models, role="draft", precision="bf16", kv_cache="bf16", draft="tiny-llama-draft", draft_precision="fp8"
    )
    assert res.manifest.build_id.startswith("tiny-llama-draft-fp8-")
    cfg = json.loads((res.path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["quantization"]["quant_algo"] == "FP8"
    assert res.manifest.role == "draft"


def test_unsupported_architecture(tmp_path, monkeypatch, tiny_models):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    src = tmp_path / "gpt2"
    src.mkdir()
    cfg = json.loads((tiny_models["tiny-llama"] / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CalibrationError, match="GPT2LMHeadModel.*not supported"):
        run_calibrate(make_spec(precision="fp8"), source=src)
    assert leftovers(tmp_path / "out") == []


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


SOURCE_FAULTS = {
    "header length 2**40": ("model.safetensors", lambda p: p.write_bytes((2**40).to_bytes(8, "little") + b"{}"),
                            "header length 1099511627776 bytes"),
    "weights cut in half": ("model.safetensors", _cut_in_half, "truncated"),
    "garbage tokenizer.json": ("tokenizer.json", lambda p: p.write_bytes(b"\x00garbage"), "cannot be loaded"),
}


@pytest.mark.parametrize("case", list(SOURCE_FAULTS))
def test_corrupt_source_is_one_line_exit_3_and_leaves_nothing(tmp_path, tiny_models, case):
    """A damaged source model fails before any weights are loaded, never with a traceback (issue 22)."""
    from pipeline.core.errors import IntegrityError

    name, damage, needle = SOURCE_FAULTS[case]
    src = tmp_path / "src"
    shutil.copytree(tiny_models["tiny-llama"], src)
    damage(src / name)
    with pytest.raises(IntegrityError) as err:
        run_in_root(tmp_path / "out", run_calibrate, make_spec(precision="fp8"), source=src)
    msg = str(err.value)
    assert err.value.exit_code == 3 and needle in msg and str(src / name) in msg and "\n" not in msg
    assert "invoke download --model tiny-llama --verify" in msg
    assert leftovers(tmp_path / "out") == []


def test_role_draft_without_draft_model():
    with pytest.raises(CalibrationError, match="no draft model"):
        run_calibrate(make_spec(precision="fp8"), role="draft")


@pytest.mark.slow
def test_invoke_calibrate_downloads_source_and_reruns_as_noop(pipeline_env):
    """The task wiring end to end: download_model provides the source; the second run only reads manifests; `package`
    then finds the same checkpoint without calibrating again (one source id for a generated model)."""
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = [
        sys.executable,
        "-m",
        "invoke",
        "calibrate",
        "--model",
        "tiny-llama",
        "--precision",
        "fp8",
        "--calib-size",
        "2",
        "--calib-seq-len",
        "32",
    ]
    first = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith("ok: target built: ") and "ppl" in first.stdout
    ckpt = Path(first.stdout.split(": ")[2].split(" (")[0])
    assert ckpt.is_relative_to(pipeline_env / "out" / "engines")
    from pipeline.core.artifacts import read_manifest
    from pipeline.core.registry import get_model
    from pipeline.stages.download.stage import download_model

    assert read_manifest(ckpt)["model"]["sha"] == download_model(get_model("tiny-llama")).manifest.sha
    second = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert second.returncode == 0 and second.stdout.startswith(f"ok: target cached: {ckpt} ")
    # `package` (no build) finds that checkpoint: the source id of a generated model is the one calibrate used.
    stamp = (ckpt / "manifest.json").stat().st_mtime_ns
    pkg = subprocess.run([*args[:3], "package", *args[4:], "--target", "reference"], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env=env, check=False)
    assert pkg.returncode == 0, pkg.stderr[-2000:]
    assert pkg.stdout.startswith("ok: ") and " written: " in pkg.stdout
    assert (ckpt / "manifest.json").stat().st_mtime_ns == stamp  # calibration did not run again
    assert sorted((pipeline_env / "out" / "engines").glob("*/checkpoint")) == [ckpt]


def test_an_eagle3_head_is_never_calibrated():
    """With eagle3 the draft is an EAGLE-3 head served as downloaded: no draft role to calibrate (refused before any
    download) and the stage's report says so; a draft model (draft-target) is calibrated as before."""
    from pipeline.core.spec import resolve_spec
    from pipeline.stages.calibrate.stage import run_calibrate, uncalibrated_head

    spec = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch", speculative_decoding="eagle3",
                        draft="tiny-llama-eagle3", max_batch_size=4)
    with pytest.raises(CalibrationError, match="its EAGLE-3 head is served as downloaded, in its own dtype"):
        run_calibrate(spec, role="draft")
    assert uncalibrated_head(spec) == ("EAGLE-3 head tiny-llama-eagle3 served as downloaded, in its own dtype "
                                       "(not calibrated)")
    assert uncalibrated_head(resolve_spec(model="tiny-llama", precision="fp8", draft="auto")) is None
