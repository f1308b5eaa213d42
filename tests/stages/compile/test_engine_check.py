"""Engine verification, manifests, the stage cache and the tokenizer check — on FABRICATED directories.

The engine directories here are written by the tests (tests/support/compile_fixtures.py), shaped like trtllm-build 1.2.1
output; they are not engines. The real build is covered by tests/stages/compile/test_gpu.py (GPU hosts only).
"""

from __future__ import annotations

import json

import pytest

from pipeline.core.artifacts import read_manifest, sha256_file
from pipeline.core.errors import CompileError, IntegrityError
from pipeline.core.spec import resolve_spec
from pipeline.stages.compile import plan_compile, run_compile
from pipeline.stages.compile.engine_check import verify_engine_dir
from pipeline.stages.compile.manifest import (
    BuildRun,
    build_config_hash,
    check_same_tokenizer,
    checkpoint_identity,
    compile_key,
    draft_record,
    engine_manifest,
)
from pipeline.stages.compile.preflight import Toolchain
from pipeline.stages.compile.stage import CompileIO, _compile_one, log_path_for
from tests.support.compile_fixtures import write_fabricated_checkpoint, write_fabricated_engine

TOOLCHAIN = Toolchain(tensorrt_llm="1.2.1", tensorrt="10.14.1.48", cuda="13.0", driver="580.95.05",
                      gpu_name="NVIDIA H100 80GB HBM3", sm=90, gpu_count=8)


@pytest.fixture(autouse=True)
def _tree(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def pair(tmp_path):
    """Plan for tiny-llama fp8 + tiny-llama-draft from FABRICATED checkpoints sharing one tokenizer."""
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft")
    base = tmp_path / "root" / "engines" / "tiny-llama-fp8-fabricated"
    t = write_fabricated_checkpoint(base / "checkpoint", precision="fp8", kv_cache="fp8", vocab_size=1024,
                                    tokenizer_extra={"chat_template": "target template"})
    d = write_fabricated_checkpoint(tmp_path / "root" / "engines" / "tiny-llama-draft-fp8-fabricated" / "checkpoint",
                                    precision="fp8", kv_cache="fp8", vocab_size=1024,
                                    tokenizer_extra={"chat_template": "another template"},
                                    manifest_key="fabricated-draft-checkpoint-key")
    return plan_compile(spec, checkpoint_dir=t, output_dir=base / "engine", draft_checkpoint_dir=d)


def test_verify_accepts_engine_matching_plan(tmp_path, pair):
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.target)
    config = verify_engine_dir(eng, pair.target, trtllm_version="1.2.1")
    assert config["build_config"]["max_seq_len"] == 516


def test_verify_rejects_version_mismatch(tmp_path, pair):
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.target, version="1.2.0rc5")
    with pytest.raises(CompileError, match=r"version: built by TensorRT-LLM '1.2.0rc5', expected '1.2.1'"):
        verify_engine_dir(eng, pair.target, trtllm_version="1.2.1")


def test_verify_rejects_missing_rank_file(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    ckpt = write_fabricated_checkpoint(tmp_path / "fabricated-ckpt", precision="fp8", kv_cache="fp8", tp=4)
    plan = plan_compile(spec, checkpoint_dir=ckpt, output_dir=tmp_path / "e").target
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", plan, ranks=3)
    with pytest.raises(CompileError, match=r"rank3.engine: missing") as info:
        verify_engine_dir(eng, plan, trtllm_version="1.2.1")
    assert "rank0.engine" not in str(info.value)


def test_verify_rejects_empty_rank_file(tmp_path, pair):
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.draft, empty_rank=0)
    with pytest.raises(CompileError, match=r"rank0.engine: empty"):
        verify_engine_dir(eng, pair.draft, trtllm_version="1.2.1")


def test_verify_lists_build_config_differences(tmp_path, pair):
    bc = json.loads(json.dumps(pair.target.expected_build_config))
    bc["max_seq_len"] = 520  # e.g. K added twice
    bc["plugin_config"]["use_paged_context_fmha"] = False
    del bc["max_draft_len"]
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.target, build_config=bc)
    with pytest.raises(CompileError) as info:
        verify_engine_dir(eng, pair.target, trtllm_version="1.2.1")
    msg = str(info.value)
    assert "build_config.max_seq_len: planned 516, engine has 520" in msg
    assert "build_config.plugin_config.use_paged_context_fmha: planned True, engine has False" in msg
    assert "build_config.max_draft_len: planned 4, engine has nothing (default 0)" in msg
    assert "\n" not in msg


def test_verify_accepts_enum_spellings(tmp_path, pair):
    bc = json.loads(json.dumps(pair.target.expected_build_config))
    bc["speculative_decoding_mode"] = "SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL"
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.target, build_config=bc)
    verify_engine_dir(eng, pair.target, trtllm_version="1.2.1")


def _as_written(plan, form: str) -> dict:
    """The plan's build_config in the spelling one TensorRT-LLM BuildConfig serializer writes (see engine_check.py's
    sources): "dataclass" = builder.py @ 008b2b8d BuildConfig.to_dict (kv_cache_type enum name, IntFlag as int);
    "pydantic" = model_dump(mode="json") with the str-Enum KVCacheType (kv_cache_type.py @ 18836202: value "paged")
    and PluginConfig as validated from trtllm-build's "enable"/"disable" strings (plugin.py @ c20322ff), paged_kv_cache
    left None; "bindings" = the C++ KVCacheType ordinal (modelConfig.h @ 012f8ad2) and the IntFlag member name."""
    bc = json.loads(json.dumps(plan.expected_build_config))
    pc = bc["plugin_config"]
    pc["dtype"] = pc["gpt_attention_plugin"]
    if form == "dataclass":
        bc["kv_cache_type"] = "PAGED"
    elif form == "pydantic":
        bc["kv_cache_type"] = "paged"
        pc["paged_kv_cache"] = None
        pc["gpt_attention_plugin"] = "auto"  # stored as given; PluginConfig.__getattribute__ reads it as dtype
    else:
        bc["kv_cache_type"] = 1
        bc["speculative_decoding_mode"] = "DRAFT_TOKENS_EXTERNAL" if plan.draft_len else "NONE"
        for key, value in pc.items():
            if isinstance(value, bool):
                pc[key] = "enable" if value else "disable"
            elif value is None:
                pc[key] = "disable"
    if not plan.draft_len:  # BuildConfig.from_dict defaults: max_draft_len 0, mode NONE
        del bc["max_draft_len"], bc["speculative_decoding_mode"]
    return bc


@pytest.mark.parametrize("form", ["dataclass", "pydantic", "bindings"])
@pytest.mark.parametrize("role", ["target", "draft"])
def test_verify_accepts_every_serialized_form(tmp_path, pair, form, role):
    plan = getattr(pair, role)
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", plan, build_config=_as_written(plan, form))
    config = json.loads((eng / "config.json").read_text())
    config["build_config"] = _as_written(plan, form)  # keep the form's own kv_cache_type spelling
    (eng / "config.json").write_text(json.dumps(config))
    verify_engine_dir(eng, plan, trtllm_version="1.2.1")


@pytest.mark.parametrize("change, expected", [
    ({"kv_cache_type": "CONTINUOUS"}, "build_config.kv_cache_type: planned 'paged', engine has 'CONTINUOUS'"),
    ({"kv_cache_type": 0}, "build_config.kv_cache_type: planned 'paged', engine has 0"),
    ({"kv_cache_type": None, "paged_kv_cache": False}, "build_config.kv_cache_type: planned 'paged', engine has None"),
    ({"speculative_decoding_mode": "NONE"}, "build_config.speculative_decoding_mode: planned 2, engine has 'NONE'"),
    ({"user_buffer": "enable"}, "build_config.plugin_config.user_buffer: planned False, engine has 'enable'"),
    ({"gpt_attention_plugin": "auto", "dtype": "float16"},
     "build_config.plugin_config.gpt_attention_plugin: planned 'bfloat16', engine has 'auto'"),
    ({"gemm_plugin": "auto"}, "build_config.plugin_config.gemm_plugin: planned None, engine has 'auto'"),
])
def test_verify_rejects_differences_of_meaning(tmp_path, pair, change, expected):
    bc = _as_written(pair.target, "pydantic")
    for key, value in change.items():
        (bc if key in bc else bc["plugin_config"])[key] = value
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.target)
    config = json.loads((eng / "config.json").read_text())
    config["build_config"] = bc
    (eng / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompileError) as info:
        verify_engine_dir(eng, pair.target, trtllm_version="1.2.1")
    assert expected in str(info.value)
    assert str(info.value).count("build_config.") == 1


def test_verify_needs_config_json(tmp_path, pair):
    (tmp_path / "fabricated-engine").mkdir()
    with pytest.raises(CompileError, match="has no config.json"):
        verify_engine_dir(tmp_path / "fabricated-engine", pair.target, trtllm_version="1.2.1")


def _engine_manifest(eng, plan, key, draft=None, build_seconds=None):
    config = verify_engine_dir(eng, plan, trtllm_version="1.2.1")
    return engine_manifest(eng, plan, key=key, run=BuildRun(config, build_seconds), toolchain=TOOLCHAIN.as_dict(),
                           checkpoint=checkpoint_identity(plan.checkpoint_dir), draft=draft)


def test_manifest_records_toolchain_files_checkpoint_and_draft(tmp_path, pair):
    draft_dir = write_fabricated_engine(tmp_path / "fabricated-draft-engine", pair.draft)
    _engine_manifest(draft_dir, pair.draft, "fabricated-draft-engine-key").write(draft_dir)
    tok = check_same_tokenizer(pair.target.checkpoint_dir, pair.draft.checkpoint_dir)
    draft = draft_record(draft_dir, tok)
    eng = write_fabricated_engine(tmp_path / "fabricated-engine", pair.target)
    m = _engine_manifest(eng, pair.target, "k", draft=draft, build_seconds=1.234)
    assert m.toolchain == {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48", "cuda": "13.0", "driver": "580.95.05"}
    assert m.gpu.model_dump() == {"name": "NVIDIA H100 80GB HBM3", "sm": 90, "count": 8}
    assert m.argv == pair.target.argv and m.argv[0] == "trtllm-build"
    assert m.build_config_sha256 == build_config_hash(json.loads((eng / "config.json").read_text()))
    assert set(m.files) == {"config.json", "rank0.engine", "timing.cache"}
    assert m.files["rank0.engine"].sha256 == sha256_file(eng / "rank0.engine")
    assert m.files["rank0.engine"].size == (eng / "rank0.engine").stat().st_size
    assert m.checkpoint.key == "fabricated-checkpoint-key"
    assert m.draft.manifest_sha256 == sha256_file(draft_dir / "manifest.json")
    assert m.draft.tokenizer == tok == m.tokenizer and m.draft.key == "fabricated-draft-engine-key"


def test_draft_with_different_tokenizer_rejected(tmp_path):
    t = write_fabricated_checkpoint(tmp_path / "fabricated-target", precision="fp8", kv_cache="fp8")
    d = write_fabricated_checkpoint(tmp_path / "fabricated-draft", precision="fp8", kv_cache="fp8",
                                    tokenizer_variant="other-family")
    with pytest.raises(CompileError, match="different tokenizer than the target"):
        check_same_tokenizer(t, d)


def test_checkpoint_without_tokenizer_rejected(tmp_path):
    t = write_fabricated_checkpoint(tmp_path / "fabricated-target", precision="fp8", kv_cache="fp8")
    d = write_fabricated_checkpoint(tmp_path / "fabricated-draft", precision="fp8", kv_cache="fp8")
    (d / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(CompileError, match="has no tokenizer"):
        check_same_tokenizer(t, d)


def test_run_compile_rejects_other_tokenizer_before_preflight(tmp_path):
    """On this CPU host the preflight would fail; the tokenizer check must come first and say so."""
    from pipeline.stages.compile import run_compile

    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="tiny-llama-draft")
    t = write_fabricated_checkpoint(tmp_path / "fabricated-target", precision="fp8", kv_cache="fp8", vocab_size=1024)
    d = write_fabricated_checkpoint(tmp_path / "fabricated-draft", precision="fp8", kv_cache="fp8", vocab_size=1024,
                                    tokenizer_variant="other-family")
    with pytest.raises(CompileError, match="different tokenizer"):
        run_compile(spec, CompileIO(checkpoint=t, output_dir=tmp_path / "e", draft_checkpoint=d))
    assert not (tmp_path / "e").exists()


def test_stage_key_covers_plan_checkpoint_toolchain_arch(pair):
    tc = TOOLCHAIN.as_dict()
    base = compile_key(pair.target, checkpoint_key="c1", toolchain=tc)
    assert base == compile_key(pair.target, checkpoint_key="c1", toolchain=dict(tc, driver="999"))  # driver: no
    assert base != compile_key(pair.target, checkpoint_key="c2", toolchain=tc)
    assert base != compile_key(pair.target, checkpoint_key="c1", toolchain=dict(tc, tensorrt_llm="1.2.0"))
    assert base != compile_key(pair.target, checkpoint_key="c1", toolchain=dict(tc, sm=89))
    assert base != compile_key(pair.draft, checkpoint_key="c1", toolchain=tc)
    assert base != compile_key(pair.target, checkpoint_key="c1", toolchain=tc, draft_key="d")


def test_current_engine_is_not_rebuilt_unless_its_files_changed(pair):
    """Same key and intact files -> cached, trtllm-build (absent here) never started; a changed rank file is refused
    with one line naming --force compile; check-only finds the engine without any toolchain on this host."""
    spec = resolve_spec(model="tiny-llama", precision="fp8")
    plan = plan_compile(spec, checkpoint_dir=pair.target.checkpoint_dir, output_dir=pair.target.output_dir).target
    ckpt = checkpoint_identity(plan.checkpoint_dir)
    key = compile_key(plan, checkpoint_key=ckpt.key, toolchain=TOOLCHAIN.as_dict())
    eng = write_fabricated_engine(plan.output_dir, plan)
    _engine_manifest(eng, plan, key).write(eng)
    res = _compile_one(plan, TOOLCHAIN, force=False, draft=None)
    assert res.status == "cached" and res.manifest.key == key and res.path == eng
    located, draft = run_compile(spec, CompileIO(checkpoint=plan.checkpoint_dir, output_dir=eng), check_only=True)
    assert located.status == "cached" and located.manifest.key == key and draft is None
    (eng / "rank0.engine").write_bytes(b"tampered")
    for call in (lambda: _compile_one(plan, TOOLCHAIN, force=False, draft=None),
                 lambda: run_compile(spec, CompileIO(checkpoint=plan.checkpoint_dir, output_dir=eng), check_only=True)):
        with pytest.raises(IntegrityError, match=r"rank0\.engine: \d+ bytes, recorded \d+; re-run `invoke build "
                           r"--force compile`") as err:
            call()
        assert err.value.exit_code == 3 and "\n" not in str(err.value)


def test_failed_rebuild_keeps_previous_engine_and_leaves_no_temp(pair, tmp_path, monkeypatch):
    """A different toolchain changes the key; the build fails (no trtllm-build on this host) and publishes nothing."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    plan = pair.target
    eng = write_fabricated_engine(plan.output_dir, plan)
    _engine_manifest(eng, plan, "old-fabricated-key").write(eng)
    before = sorted(p.name for p in eng.parent.iterdir())
    with pytest.raises(CompileError, match="trtllm-build was not found on PATH"):
        _compile_one(plan, TOOLCHAIN, force=False, draft=None)
    assert read_manifest(eng)["key"] == "old-fabricated-key"
    after = sorted(p.name for p in eng.parent.iterdir())
    assert [n for n in after if n.startswith((".tmp-", ".old-"))] == []
    assert set(after) - set(before) <= {".engine.lock", log_path_for(eng).name}


_KILLED_COMPILE = """
import pickle, sys, time
import pipeline.stages.compile.stage as stage

def paused(argv, log_path):  # trtllm-build is running in the temporary engine dir
    print("paused", flush=True)
    time.sleep(600)

stage.run_trtllm_build = paused
plan, toolchain = pickle.loads(bytes.fromhex(sys.argv[1]))
stage._compile_one(plan, toolchain, force=False, draft=None)
"""


def test_sigkill_mid_compile_then_rerun_leaves_no_temporary(pair, monkeypatch):
    """A build killed inside trtllm-build leaves its temporary engine dir; the next build of that engine removes it
    (trtllm-build is faked on this CPU host: the rerun writes a FABRICATED engine)."""
    import os
    import pickle
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import pipeline.stages.compile.stage as stage

    plan = pair.target
    out = Path(plan.output_dir)
    arg = pickle.dumps((plan, TOOLCHAIN)).hex()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_COMPILE, arg], cwd=Path(__file__).resolve().parents[3],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "paused", proc.stderr.read()[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".tmp-engine-")] and not out.exists()

    def fake_build(argv, log_path):
        write_fabricated_engine(Path(argv[argv.index("--output_dir") + 1]), plan)
        return 0.1

    monkeypatch.setattr(stage, "run_trtllm_build", fake_build)
    res = _compile_one(plan, TOOLCHAIN, force=False, draft=None)
    assert res.status == "built" and res.manifest.problems(out, full=True) == []
    assert [p.name for p in out.parent.iterdir() if p.name.startswith((".tmp-", ".old-"))] == []
