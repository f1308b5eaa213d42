"""Real ModelOpt 0.37 unified HF exports of the tiny Llama (FP8, INT4 AWQ, W4A8 AWQ): they package as llmapi
repositories, and the reference model's loader computes what `pipeline.stages.calibrate.hf_checkpoint` (the calibrate stage's
round-trip loader, written independently) computes from the same files."""

from __future__ import annotations


import pytest

from pipeline.core.spec import resolve_spec
from pipeline.stages.calibrate.hf_checkpoint import load_hf_checkpoint
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import llm_api_options
from pipeline.stages.package.llmapi_package import package_llmapi_repo

from tests.support.llmapi_fixtures import hf_reference_module

pytestmark = pytest.mark.slow
TEXTS = ["Once upon a time there was a little dog.", "The cat sat on the mat and looked at the bird."] * 4


def _hf_reference():
    return hf_reference_module("hf_reference_real_export")


def _export(src, out, precision, kv):
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.stages.calibrate.export_hf import copy_tokenizer, export
    from pipeline.stages.calibrate.recipes import quant_config

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()

    def forward_loop(m):
        for text in TEXTS:
            m(**tok(text, return_tensors="pt"))

    model = mtq.quantize(model, quant_config(precision, kv), forward_loop=forward_loop)
    export(model, out, dtype=torch.bfloat16)
    copy_tokenizer(src, out)
    return out


@pytest.mark.parametrize("precision, kv, algo", [("fp8", "fp8", "FP8"), ("int4_awq", "bf16", "W4A16_AWQ"),
                                                 ("w4a8_awq", "fp8", "W4A8_AWQ")])
def test_real_export_packages_and_loads_like_the_roundtrip_loader(tiny_models, tmp_path, precision, kv, algo):
    import torch
    from transformers import AutoTokenizer

    ckpt = _export(tiny_models["tiny-llama"], tmp_path / "hf_checkpoint", precision, kv)
    # 1.2.1's PyTorch backend has no FP8 attention for W4A8 weights: an FP8 KV cache then goes without KV reuse
    no_fmha = {"enable_kv_cache_reuse": False, "enable_chunked_context": False} if precision == "w4a8_awq" else {}
    spec = resolve_spec(model="tiny-llama", precision=precision, kv_cache=kv, target="reference", runtime="pytorch",
                        **no_fmha)
    repo = package_llmapi_repo(spec, PackageInputs(checkpoint=ckpt, draft_checkpoint=None, output=tmp_path / "repos"),
                               options=llm_api_options(spec, draft_dir=None))
    assert repo.built and repo.manifest.runtime == "pytorch"
    ids = AutoTokenizer.from_pretrained(ckpt)("Once upon a time there was a cat", return_tensors="pt")["input_ids"]
    ours = _hf_reference().load_model(str(ckpt), torch.float32)
    theirs = load_hf_checkpoint(ckpt, activation_quant=True)
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    assert torch.allclose(a, b, atol=1e-4), f"{algo}: max diff {(a - b).abs().max():.3g}"
