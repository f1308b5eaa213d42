"""The PyTorch-runtime repository (`llmapi` Triton model): its config.pbtxt and model.yaml against the 1.2-line
upstream contract table, packaging rules and caching, install-repo's path rewriting, and the reference model's
dequantization of ModelOpt's HF export formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.core.errors import PackageError
from pipeline.core.spec import resolve_spec
from pipeline.stages.package import llmapi_yaml, pbtxt
from pipeline.stages.package.install import install_repo
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import LlmApiOptions, llm_api_options
from pipeline.stages.package.llmapi_package import package_llmapi_repo
from pipeline.stages.package.render import templates_root
from tests.support import llmapi_contract_table as table
from tests.support.llmapi_fixtures import hf_reference_module, fabricated_fp8_export


@pytest.fixture(scope="module")
def exports(tiny_models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exports")
    return {"target": fabricated_fp8_export(tiny_models["tiny-llama"], root / "t" / "hf_checkpoint"),
            "draft": fabricated_fp8_export(tiny_models["tiny-llama-draft"], root / "d" / "hf_checkpoint")}


def _package(tmp_path, exports, *, target="reference", draft=True, **spec_overrides):
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto" if draft else None, target=target,
                        runtime="pytorch", **spec_overrides)
    draft_dir = exports["draft"] if draft else None
    inputs = PackageInputs(checkpoint=exports["target"], draft_checkpoint=draft_dir, output=tmp_path / "repos",
                           build_id="tiny-llama-fp8-abc")
    return spec, package_llmapi_repo(spec, inputs, options=llm_api_options(spec, draft_dir=draft_dir))


def _tensors(tensors) -> dict[str, dict]:
    from tritonclient.grpc import model_config_pb2

    return {t.name: {"type": model_config_pb2.DataType.Name(t.data_type), "dims": list(t.dims),
                     "optional": bool(getattr(t, "optional", False))} for t in tensors}


# ------------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("target", ["trtllm", "reference"])
def test_config_matches_the_upstream_llmapi_contract(tmp_path, exports, target):
    _, res = _package(tmp_path, exports, target=target)
    cfg = pbtxt.read(res.path / "tensorrt_llm" / "config.pbtxt")
    assert cfg.name == table.MODEL_NAME and cfg.backend == table.BACKEND
    assert _tensors(cfg.input) == table.rows(table.INPUTS)
    assert _tensors(cfg.output) == table.rows(table.OUTPUTS)
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, 2)]  # KIND_CPU == 2
    assert cfg.max_batch_size == table.TRITON_MAX_BATCH_SIZE
    assert sorted(p.name for p in res.path.iterdir() if p.is_dir()) == ["tensorrt_llm"]


def test_model_yaml_keys_and_values(tmp_path, exports):
    spec, res = _package(tmp_path, exports)
    data = llmapi_yaml.read(res.path / llmapi_yaml.MODEL_YAML)
    for key in table.MODEL_YAML_REQUIRED:
        assert key in data
    assert set(data["triton_config"]) == table.TRITON_CONFIG_KEYS
    assert data["triton_config"]["max_batch_size"] == table.TRITON_MAX_BATCH_SIZE
    assert data["backend"] == table.BACKEND_VALUE
    llm = {k: v for k, v in data.items() if k not in ("model", "backend", "triton_config", "tokenizer")}
    options = LlmApiOptions.from_mapping(llm, what="model.yaml")  # every LLM key is one our typed model knows
    assert options.max_batch_size == spec.max_batch_size and options.max_seq_len == spec.max_seq_len
    assert options.kv_cache_config.dtype == "fp8" and options.kv_cache_config.enable_block_reuse is True
    assert options.speculative_config.decoding_type == "DraftTarget"
    assert options.speculative_config.max_draft_len == spec.draft_len
    base = (res.path / llmapi_yaml.MODEL_YAML).parent
    assert (base / data["model"]).resolve() == exports["target"].resolve()
    assert (base / options.speculative_config.speculative_model_dir).resolve() == exports["draft"].resolve()
    cfg = pbtxt.read(res.path / "tensorrt_llm" / "config.pbtxt")
    assert cfg.model_transaction_policy.decoupled is data["triton_config"]["decoupled"] is True


def test_target_files_and_manifest(tmp_path, exports):
    _, gpu = _package(tmp_path / "g", exports, target="trtllm")
    _, ref = _package(tmp_path / "r", exports, target="reference")
    root = templates_root("llmapi") / "tensorrt_llm" / "1"
    assert (gpu.path / "tensorrt_llm/1/model.py").read_bytes() == (root / "model_trtllm.py").read_bytes()
    assert (ref.path / "tensorrt_llm/1/model.py").read_bytes() == (root / "model_reference.py").read_bytes()
    assert not (gpu.path / "tensorrt_llm/1/hf_reference.py").exists()
    assert gpu.path.name == "tiny-llama-fp8-abc" and ref.path.name == "tiny-llama-fp8-abc-reference"
    assert ref.manifest.runtime == "pytorch" and ref.manifest.models == ["tensorrt_llm"]
    gpu_params = pbtxt.read(gpu.path / "tensorrt_llm/config.pbtxt").parameters
    assert not gpu_params  # upstream's config carries no parameters; the reference adds its own two
    assert set(pbtxt.read(ref.path / "tensorrt_llm/config.pbtxt").parameters) == {"reference_dtype",
                                                                                   "tokens_per_block"}


def test_no_draft_and_unary_spec(tmp_path, exports):
    _, res = _package(tmp_path, exports, draft=False, decoupled=False)
    data = llmapi_yaml.read(res.path / llmapi_yaml.MODEL_YAML)
    assert "speculative_config" not in data and data["triton_config"]["decoupled"] is False
    assert pbtxt.read(res.path / "tensorrt_llm/config.pbtxt").model_transaction_policy.decoupled is False


# ------------------------------------------------------------------------------------------------ rules, caching
def test_cached_then_rebuilt_on_change(tmp_path, exports):
    _, first = _package(tmp_path, exports)
    _, again = _package(tmp_path, exports)
    assert first.built and again.status == "cached"
    _, other = _package(tmp_path, exports, max_batch_size=4)
    assert other.built and "max_batch_size: 4" in (other.path / llmapi_yaml.MODEL_YAML).read_text()


def test_refusals(tmp_path, exports):
    spec = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", target="reference", runtime="pytorch")
    opts = llm_api_options(spec, draft_dir=exports["draft"])
    with pytest.raises(PackageError, match="disagree"):
        package_llmapi_repo(spec, PackageInputs(checkpoint=exports["target"], draft_checkpoint=None,
                                                output=tmp_path / "a"), options=opts)
    with pytest.raises(PackageError, match="no config.json"):
        package_llmapi_repo(spec, PackageInputs(checkpoint=tmp_path, draft_checkpoint=exports["draft"],
                                                output=tmp_path / "b"), options=opts)
    nvfp4 = tmp_path / "nvfp4"
    shutil.copytree(exports["target"], nvfp4)
    (nvfp4 / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    with pytest.raises(PackageError, match="NVFP4.*--target trtllm"):
        package_llmapi_repo(spec, PackageInputs(checkpoint=nvfp4, draft_checkpoint=exports["draft"],
                                                output=tmp_path / "c"), options=opts)
    other_tok = tmp_path / "other-draft"
    shutil.copytree(exports["draft"], other_tok)
    (other_tok / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}')
    with pytest.raises(PackageError, match="different tokenizer"):
        package_llmapi_repo(spec, PackageInputs(checkpoint=exports["target"], draft_checkpoint=other_tok,
                                                output=tmp_path / "d"), options=opts)
    assert not any((tmp_path / d).exists() and any((tmp_path / d).iterdir()) for d in "abcd")


# ------------------------------------------------------------------------------------------------ install
def test_install_makes_model_yaml_paths_absolute(tmp_path, exports):
    _, res = _package(tmp_path, exports)
    installed = install_repo(res.path, tmp_path / "installed")
    data = llmapi_yaml.read(installed.path / llmapi_yaml.MODEL_YAML)
    assert data["model"] == str(exports["target"].resolve())
    assert data["speculative_config"]["speculative_model_dir"] == str(exports["draft"].resolve())
    assert installed.paths["tensorrt_llm"]["model"] == data["model"]
    assert "../" in (res.path / llmapi_yaml.MODEL_YAML).read_text()  # the packaged copy keeps relative paths
    with pytest.raises(PackageError, match="not engines"):
        install_repo(res.path, tmp_path / "x", engine_dir=exports["target"])


def test_install_refuses_a_missing_checkpoint(tmp_path, exports):
    src = tmp_path / "src"
    shutil.copytree(exports["target"], src / "hf_checkpoint")
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference", runtime="pytorch")
    inputs = PackageInputs(checkpoint=src / "hf_checkpoint", draft_checkpoint=None, output=tmp_path / "repos")
    res = package_llmapi_repo(spec, inputs, options=llm_api_options(spec, draft_dir=None))
    shutil.rmtree(src)
    with pytest.raises(PackageError, match="model .* does not exist"):
        install_repo(res.path, tmp_path / "installed")


# ------------------------------------------------------------------------------------------------ dequantization
def _hf_reference():
    return hf_reference_module("hf_reference_under_test")


def test_dequantize_modelopt_formats():
    import torch
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    ref = _hf_reference()
    w = torch.randn(8, 256)
    # INT4 AWQ as ModelOpt 0.37 packs it: per-group (128) scales, two int4 per uint8 along the output dim.
    scale = w.reshape(8, 2, 128).abs().amax(-1) / 7
    packed = pack_int4_in_uint8(w, scale)
    expect = (w / scale.repeat_interleave(128, 1)).round().clamp(-8, 7) * scale.repeat_interleave(128, 1)
    got = ref.dequantize("x.weight", packed, {"x.weight_scale": scale})
    assert torch.allclose(got, expect, atol=1e-6)
    pre = torch.rand(256) + 0.5
    got = ref.dequantize("x.weight", packed, {"x.weight_scale": scale, "x.pre_quant_scale": pre})
    assert torch.allclose(got, expect * pre, atol=1e-5)
    # FP8 per-tensor
    s = w.abs().max() / 448
    fp8 = (w / s).to(torch.float8_e4m3fn)
    assert torch.allclose(ref.dequantize("x.weight", fp8, {"x.weight_scale": s}), fp8.float() * s)
    assert (ref.dequantize("x.weight", fp8, {"x.weight_scale": s}) - w).abs().max() < 0.07 * w.abs().max()
    with pytest.raises(ValueError, match="without weight_scale"):
        ref.dequantize("x.weight", fp8, {})
    # W4A8 AWQ: the per-group dequantized values are FP8 multiples of weight_scale_2
    s2 = (expect.abs().max() / 448).reshape(())
    got = ref.dequantize("x.weight", packed, {"x.weight_scale": scale, "x.weight_scale_2": s2})
    assert torch.equal(got, (expect / s2).to(torch.float8_e4m3fn).float() * s2)
    assert not torch.equal(got, expect)
    with pytest.raises(ValueError, match="NVFP4"):
        ref.dequantize("x.weight", packed, {"x.weight_scale": scale.to(torch.float8_e4m3fn)})


def test_reference_loads_the_fp8_export_close_to_the_original(tiny_models, exports):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = _hf_reference()
    model = ref.load_model(str(exports["target"]), torch.float32)
    orig = AutoModelForCausalLM.from_pretrained(tiny_models["tiny-llama"], torch_dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(exports["target"])("Once upon a time there was a cat", return_tensors="pt")
    with torch.no_grad():
        a, b = model(**ids).logits, orig(**ids).logits
    assert not torch.equal(a, b)  # FP8 weights really are rounded
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


def test_validation_catches_model_yaml_drift(tmp_path, exports):
    from pipeline.stages.package import validate_repo

    _, res = _package(tmp_path, exports)
    copy = tmp_path / "copy"
    shutil.copytree(res.path, copy)
    path = copy / llmapi_yaml.MODEL_YAML
    data = llmapi_yaml.read(path)
    data["triton_config"]["decoupled"] = False
    llmapi_yaml.write(path, data)
    with pytest.raises(PackageError, match="differs from config.pbtxt"):
        validate_repo(copy)
    path.write_text("model: [unclosed")
    with pytest.raises(PackageError, match="not valid YAML"):
        validate_repo(copy)


def test_serve_command_per_target(tmp_path, exports, monkeypatch):
    from pipeline.serving.serve import build_command
    from pipeline.stages.package.launch_plan import Endpoints

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    _, gpu = _package(tmp_path / "g", exports, target="trtllm")
    _, ref = _package(tmp_path / "r", exports, target="reference")
    ports = Endpoints(http_port=1, grpc_port=2, metrics_port=3)
    cmd = build_command(gpu.path, ports, shm_prefix="p-", binary="/opt/tritonserver/bin/tritonserver", world_size=2)
    # TP 2: two MPI processes, each `trtllm-llmapi-launch tritonserver` (launch_triton_server.py
    # --trtllm_llmapi_launch); the LLM API spawns no workers of its own under MGMN
    assert cmd.flavour == "gpu-ngc" and cmd.argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert cmd.argv.count("trtllm-llmapi-launch") == 2 and cmd.argv.count("/opt/tritonserver/bin/tritonserver") == 2
    assert "--disable-auto-complete-config" in cmd.argv  # LLM spawns its own workers; config.pbtxt is complete
    assert "TRTLLM_ORCHESTRATOR" not in cmd.env
    assert build_command(ref.path, ports, shm_prefix="p-").flavour == "cpu-pytriton"


# ------------------------------------------------------------------------------------------------ verify
def test_verify_checks_the_hf_checkpoint_the_repo_names(tmp_path, exports):
    """verify of a runtime-pytorch repository hashes the checkpoint its model.yaml points to (issue 22)."""
    from pipeline.core.artifacts import file_table, write_manifest
    from pipeline.core.errors import HashMismatchError
    from pipeline.ops.release_verify import verify

    ckpts = {}
    for role in ("target", "draft"):
        ckpts[role] = shutil.copytree(exports[role], tmp_path / role / "hf_checkpoint", copy_function=shutil.copy2)
        write_manifest(ckpts[role], {"key": f"k-{role}", "files": file_table(ckpts[role])})
    _, res = _package(tmp_path, ckpts)
    report = verify(res.path, check_host=False)
    repo_files = len(res.manifest.files)
    ckpt_files = sum(len(file_table(d)) for d in ckpts.values())
    assert report.ok and report.files_checked == repo_files + ckpt_files and not report.notes
    weights = ckpts["target"] / "model.safetensors"
    with open(weights, "r+b") as f:  # same size: only the hash can tell
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(HashMismatchError, match=r"hf_checkpoint/model.safetensors") as exc:
        verify(res.path, check_host=False)
    assert exc.value.exit_code == 3 and "\n" not in str(exc.value)
    # A checkpoint without a manifest is reported as not hash-checked, never silently passed.
    (ckpts["target"] / "manifest.json").unlink()
    assert any("not hash-checked" in n for n in verify(res.path, check_host=False).notes)
