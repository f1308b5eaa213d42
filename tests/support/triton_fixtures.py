"""FABRICATED inputs for packaging tests: a tokenizer, a TRT-LLM checkpoint dir and a TensorRT-LLM 1.2.1-shaped
engine dir (config.json + rank files). None of them can be served; they exist to render and validate repositories."""

from __future__ import annotations

import json
from pathlib import Path


def fake_tokenizer(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (d / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return d


def fabricated_checkpoint(d: Path) -> Path:
    """A stand-in TRT-LLM checkpoint dir (config + rank0 file + tokenizer/): enough to package, not to serve."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "dtype": "bfloat16",
                                               "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}))
    (d / "rank0.safetensors").write_bytes(b"fabricated")
    fake_tokenizer(d / "tokenizer")
    return d


def fabricated_engine(d: Path, *, max_batch_size: int, world: int, max_draft_len: int = 0,
                      paged_context_fmha: bool = True) -> Path:
    """A FABRICATED TensorRT-LLM 1.2 engine dir: config.json shaped like Engine.save's + empty rank files."""
    d.mkdir(parents=True)
    build = {
        "max_batch_size": max_batch_size, "max_beam_width": 1, "max_input_len": 4096,
        "max_seq_len": 8192 + max_draft_len, "max_num_tokens": 8192, "max_draft_len": max_draft_len,
        "speculative_decoding_mode": 2 if max_draft_len else 1, "kv_cache_type": "PAGED",
        "plugin_config": {"use_paged_context_fmha": paged_context_fmha, "tokens_per_block": 32,
                          "context_fmha": True},
    }
    pretrained = {"architecture": "LlamaForCausalLM", "dtype": "bfloat16",
                  "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
                  "mapping": {"world_size": world, "tp_size": world, "pp_size": 1}}
    (d / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": pretrained,
                                               "build_config": build}))
    for r in range(world):
        (d / f"rank{r}.engine").write_bytes(b"fabricated engine")
    return d
