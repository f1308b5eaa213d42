"""FABRICATED exported Hugging Face checkpoints for llmapi packaging and serving tests: a real HF model dir (the
generated tiny models) re-saved the way ModelOpt's unified HF export stores FP8 weights (float8_e4m3fn weight +
per-tensor `weight_scale`, `k_proj.k_scale` / `v_proj.v_scale`, `hf_quant_config.json`). No `input_scale`: without
calibration there is no honest activation scale (tests/stages/package/test_llmapi_real_export.py covers real exports)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FP8_MAX = 448.0
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fabricated_fp8_export(src: Path, dest: Path) -> Path:
    """`src` (an HF model dir with tokenizer) as an FP8 weight + FP8 KV export in `dest`."""
    import torch
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dest / f.name)
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(f))
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if key.endswith(".weight") and len(parts) > 2 and parts[-2] in _LINEAR:
            scale = value.float().abs().max().clamp(min=1e-12) / FP8_MAX
            out[key] = (value.float() / scale).to(torch.float8_e4m3fn)
            out[key[: -len("weight")] + "weight_scale"] = scale.reshape(())
            if parts[-2] in ("k_proj", "v_proj"):
                out[key[: -len("weight")] + f"{parts[-2][0]}_scale"] = torch.tensor(1.0)
        else:
            out[key] = value.contiguous()
    save_file(out, str(dest / "model.safetensors"))
    config = json.loads((dest / "config.json").read_text())
    quant = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    config["quantization_config"] = {"quant_method": "modelopt", **quant}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.37.0"},
                                                           "quantization": quant}, indent=2))
    return dest


def hf_reference_module(name: str = "hf_reference_under_test"):
    """The reference backend's engine module (`templates/llmapi/tensorrt_llm/1/hf_reference.py`), loaded as the
    Triton python backend loads it: from its file, outside the package."""
    import importlib.util

    from pipeline.stages.package.render import templates_root

    path = templates_root("llmapi") / "tensorrt_llm" / "1" / "hf_reference.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
