"""The fake-quant model `export.export` leaves behind computes exactly what its TensorRT-LLM checkpoint re-loads to
(`checkpoint.load_checkpoint_as_hf`, float32 on CPU): FP8 weights dequantized with the stored scale `amax / 448`
(not the fake quantizer's `1 / (448 / amax)`), activations quantized with the amax the stored scale gives back.
A one-ulp difference in either is amplified by the FP8 activation rounding of every later linear (a random
llama-1b-shaped model's round trip: 7 % logit error after 4 layers), so the comparison is bit for bit.

Each case moves the calibrated amaxes of one kind to their nearest float32 neighbour where the two arithmetics
differ, so the case does not depend on the luck of the calibration."""

from __future__ import annotations

import pytest
import torch

from pipeline.stages.calibrate import export, recipes
from pipeline.stages.calibrate.checkpoint import load_checkpoint_as_hf

FP8_MAX = 448.0
IDS = torch.tensor([[1, 17, 250, 33, 400, 5, 64, 301, 12, 77, 2, 500]])


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _weight_scale_differs(a: torch.Tensor) -> bool:
    """The fake quantizer's dequantization scale is not the checkpoint's `amax / 448`."""
    return not torch.equal(1 / (FP8_MAX / a), a / FP8_MAX)


def _activation_scale_differs(a: torch.Tensor) -> bool:
    """The amax rebuilt from the stored scale dequantizes with another scale than the calibrated amax."""
    rebuilt = (a / FP8_MAX) * FP8_MAX
    return not torch.equal(1 / (FP8_MAX / a), 1 / (FP8_MAX / rebuilt))


def _unlucky(amax: torch.Tensor, differs) -> torch.Tensor:
    """The nearest float32 amax at or above `amax` where `differs`. An amax rebuilt from `amax / 448` can differ only
    where amax's mantissa is at least 448's (1.75): the quotient has a smaller one and so fewer significant digits."""
    a = amax.detach().float().reshape(())
    a = torch.maximum(a, 1.75 * 2 ** torch.floor(torch.log2(a)))
    while not differs(a):
        a = torch.nextafter(a, _f32(float("inf")))
    return a.reshape(amax.shape).to(amax.dtype)


def _quantized_llama(kind: str):
    """A random 2-layer Llama (tied embeddings, GQA 4:2, weights std 0.1), FP8-calibrated, with the amaxes of
    `kind` ("weight" or "input") moved to unlucky neighbours."""
    import modelopt.torch.quantization as mtq
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                         rope_theta=5e5, initializer_range=0.1, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config).eval()
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16).float()
    calib = torch.randint(0, config.vocab_size, (2, 16))
    mtq.quantize(model, recipes.quant_config("fp8", "bf16"), lambda m: m(calib))
    differs = _weight_scale_differs if kind == "weight" else _activation_scale_differs
    moved = 0
    for mod in model.modules():
        q = getattr(mod, f"{kind}_quantizer", None)
        if q is not None and q.is_enabled and q.amax is not None:
            q.amax = _unlucky(q.amax, differs)
            moved += 1
    assert moved == 2 * 7  # q, k, v, o, gate, up, down per layer
    return model


@pytest.mark.parametrize("kind", ["weight", "input"])
def test_exported_reference_is_what_the_checkpoint_reloads_to(kind, tmp_path):
    model = _quantized_llama(kind)
    reference = export.export(model, tmp_path, tp=1, pp=1, dtype=torch.bfloat16)
    loaded = load_checkpoint_as_hf(tmp_path)
    with torch.no_grad():
        want, got = reference(IDS).logits, loaded(IDS).logits
    assert torch.equal(got, want), f"max |diff| {(got - want).abs().max().item():.3g}"


def test_sixteen_bit_weights_stay_fake_quantized():
    """A bf16 weight (GPU calibration) cannot hold `code * scale`: it keeps the exporter's FP8 codes and its
    quantizer stays on, so the float32 copy of the round trip dequantizes it in float32."""
    import modelopt.torch.quantization as mtq

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)).to(torch.bfloat16)
    mtq.quantize(net, recipes.quant_config("fp8", "bf16"), lambda m: m(torch.randn(4, 64, dtype=torch.bfloat16)))
    lin = net[0]
    scale = lin.weight_quantizer.amax.float() / FP8_MAX
    codes = (lin.weight.float() / scale).to(torch.float8_e4m3fn).float()
    export.snap_fp8_weights(net)
    assert lin.weight_quantizer.is_enabled and lin.weight.dtype == torch.bfloat16
    assert torch.equal((lin.weight.float() / scale).to(torch.float8_e4m3fn).float(), codes)
