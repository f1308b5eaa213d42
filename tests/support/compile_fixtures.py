"""Fabricated inputs for the compile-stage tests: checkpoint configs and engine directories written by the tests.

Everything here is named FABRICATED: these are not real TensorRT-LLM outputs. They exist so the pure plan, the
verification and the manifest code can be tested on a CPU machine; the real build is tested by the `gpu` test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.trtllm_rules import KV_QUANT_ALGO, QUANT_ALGO, TRTLLM_DTYPE, compute_dtype

FABRICATED_NOTE = "FABRICATED by the test suite: not a real TensorRT-LLM artifact\n"


def fabricated_tokenizer(vocab_size: int, *, variant: str = "shared") -> dict[str, Any]:
    """A tokenizer.json-shaped dict; `variant` changes the vocabulary (a different tokenizer)."""
    vocab = {f"{variant}-tok{i}" if variant != "shared" else f"tok{i}": i for i in range(min(vocab_size, 64))}
    return {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}}


def write_fabricated_checkpoint(
    directory: Path, *, precision: str, kv_cache: str, tp: int = 1, pp: int = 1, vocab_size: int = 128256,
    dtype: str | None = None, tokenizer_variant: str = "shared", tokenizer_extra: dict | None = None,
    manifest_key: str | None = "fabricated-checkpoint-key",
) -> Path:
    """Write a FABRICATED checkpoint dir: config.json (+ tokenizer/, manifest.json); no weights at all. `dtype`
    defaults to the precision's compute dtype (what calibrate exports)."""
    directory = Path(directory)
    (directory / "tokenizer").mkdir(parents=True, exist_ok=True)
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": dtype or TRTLLM_DTYPE[compute_dtype(precision)],
        "vocab_size": vocab_size,
        "quantization": {"quant_algo": QUANT_ALGO[precision], "kv_cache_quant_algo": KV_QUANT_ALGO[kv_cache]},
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
        "_fabricated": FABRICATED_NOTE.strip(),
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "FABRICATED.txt").write_text(FABRICATED_NOTE)
    tok = fabricated_tokenizer(vocab_size, variant=tokenizer_variant)
    (directory / "tokenizer" / "tokenizer.json").write_text(json.dumps(tok))
    (directory / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(tokenizer_extra or {}))
    if manifest_key:
        (directory / "manifest.json").write_text(json.dumps({"key": manifest_key, "_fabricated": True}))
    return directory


def write_fabricated_engine(
    directory: Path, plan, *, version: str = "1.2.1", ranks: int | None = None, build_config: dict | None = None,
    empty_rank: int | None = None,
) -> Path:
    """Write a FABRICATED engine dir shaped like trtllm-build 1.2.1 output, from what `plan` expects."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bc = json.loads(json.dumps(build_config if build_config is not None else plan.expected_build_config))
    bc["kv_cache_type"] = "PAGED"  # TensorRT-LLM writes the enum name
    bc.setdefault("lora_config", {})
    config = {
        "version": version,
        "pretrained_config": {"architecture": "LlamaForCausalLM",
                              "mapping": {"world_size": plan.world_size, "tp_size": plan.tp, "pp_size": plan.pp}},
        "build_config": bc,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=4))
    for i in range(plan.world_size if ranks is None else ranks):
        data = b"" if i == empty_rank else f"FABRICATED engine bytes, rank {i}\n".encode()
        (directory / f"rank{i}.engine").write_bytes(data)
    (directory / "timing.cache").write_bytes(b"FABRICATED timing cache\n")
    return directory
