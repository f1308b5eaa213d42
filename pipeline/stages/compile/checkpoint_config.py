"""Read (or derive) the TensorRT-LLM checkpoint `config.json` the compile plan needs — never the weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.architectures import checkpoint_fields
from pipeline.core.artifacts import read_config_json
from pipeline.core.errors import CompileError
from pipeline.core.registry import ModelEntry
from pipeline.core.trtllm_rules import KV_QUANT_ALGO, QUANT_ALGO, TRTLLM_DTYPE


@dataclass(frozen=True)
class CheckpointConfig:
    """The fields of a checkpoint's config.json that decide the engine build."""

    path: Path
    config: dict[str, Any]
    derived: bool = False  # True: not read from disk, derived from the spec (dry run before calibration)

    @property
    def architecture(self) -> str:
        return str(self.config.get("architecture", ""))

    @property
    def dtype(self) -> str:
        return str(self.config.get("dtype", "bfloat16"))

    @property
    def quant_algo(self) -> str | None:
        return (self.config.get("quantization") or {}).get("quant_algo")

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return (self.config.get("quantization") or {}).get("kv_cache_quant_algo")

    @property
    def tp(self) -> int:
        return int((self.config.get("mapping") or {}).get("tp_size", 1))

    @property
    def pp(self) -> int:
        return int((self.config.get("mapping") or {}).get("pp_size", 1))

    @property
    def world_size(self) -> int:
        return int((self.config.get("mapping") or {}).get("world_size", self.tp * self.pp))

    @property
    def vocab_size(self) -> int | None:
        return self.config.get("vocab_size")

    @property
    def num_experts(self) -> int:
        """MoE experts per layer (`moe.num_experts`, tensorrt_llm/layers/moe.py MoeConfig); 0 for a dense model."""
        return int((self.config.get("moe") or {}).get("num_experts", 0) or 0)


def read_checkpoint_config(ckpt_dir: Path) -> CheckpointConfig:
    """Load `<ckpt_dir>/config.json`.

    Raises:
        CompileError: the file is missing or is not a TensorRT-LLM checkpoint config.
    """
    path = Path(ckpt_dir) / "config.json"
    config = read_config_json(path, CompileError,
                              missing=f"checkpoint config {path} does not exist; run `invoke calibrate` for this spec "
                              "first or pass --checkpoint-dir DIR of an exported TensorRT-LLM checkpoint",
                              fix="re-export the checkpoint")
    if "architecture" not in config or "mapping" not in config:
        raise CompileError(
            f"{path} is not a TensorRT-LLM checkpoint config (needs 'architecture' and 'mapping'); "
            "pass the directory written by `invoke calibrate`"
        )
    return CheckpointConfig(Path(ckpt_dir), config)


def derived_checkpoint_config(
    ckpt_dir: Path, model: ModelEntry, *, precision: str, kv_cache: str, compute_dtype: str, tp: int, pp: int,
    awq_block_size: int = 128,
) -> CheckpointConfig:
    """What calibrate will export for this spec (used by dry runs when no checkpoint exists yet)."""
    a = model.architecture
    quant: dict[str, Any] = {"quant_algo": QUANT_ALGO[precision], "kv_cache_quant_algo": KV_QUANT_ALGO[kv_cache]}
    if precision in ("int4_awq", "w4a8_awq"):
        quant["group_size"] = awq_block_size
    mapping: dict[str, Any] = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    if a.is_moe:  # ModelOpt 0.37 exports experts TP-sharded (tensorrt_llm_utils.py)
        mapping.update(moe_tp_size=tp, moe_ep_size=1)
    config = {
        **checkpoint_fields(a),
        "dtype": TRTLLM_DTYPE[compute_dtype],
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "vocab_size": a.vocab_size,
        "max_position_embeddings": a.max_position_embeddings,
        "quantization": quant,
        "mapping": mapping,
    }
    return CheckpointConfig(Path(ckpt_dir), config, derived=True)


def check_matches_spec(
    ckpt: CheckpointConfig, model: ModelEntry, *, role: str, precision: str, kv_cache: str, tp: int, pp: int,
    compute_dtype: str | None = None,
) -> None:
    """The checkpoint must be what the spec asks for: quantization, KV dtype, compute dtype (when given: the
    precision's, `trtllm_rules.COMPUTE_DTYPE`), TP×PP mapping, vocabulary.

    Raises:
        CompileError: naming the first field that differs and how to fix it.
    """
    where = f"{role} checkpoint {ckpt.path}"
    want_q, want_kv = QUANT_ALGO[precision], KV_QUANT_ALGO[kv_cache]
    if ckpt.quant_algo != want_q:
        raise CompileError(
            f"{where} has quant_algo={ckpt.quant_algo}, but the spec asks for {precision} ({want_q}); "
            "re-run `invoke calibrate` with this spec or pass the matching --checkpoint-dir"
        )
    if ckpt.kv_cache_quant_algo != want_kv:
        raise CompileError(
            f"{where} has kv_cache_quant_algo={ckpt.kv_cache_quant_algo}, but the spec asks for kv_cache={kv_cache} "
            f"({want_kv}); re-run `invoke calibrate` with this spec"
        )
    if compute_dtype is not None and ckpt.dtype != TRTLLM_DTYPE[compute_dtype]:
        raise CompileError(
            f"{where} has dtype={ckpt.dtype}, but {precision} computes in {TRTLLM_DTYPE[compute_dtype]}; "
            "re-run `invoke calibrate` with this spec"
        )
    if (ckpt.tp, ckpt.pp) != (tp, pp) or ckpt.world_size != tp * pp:
        raise CompileError(
            f"{where} is mapped tp={ckpt.tp} pp={ckpt.pp} (world {ckpt.world_size}), but the spec asks for "
            f"tp={tp} pp={pp}; an engine's TP×PP is fixed by its checkpoint: re-export with "
            + (f"--draft-tp {tp}" if role == "draft" else f"--tp {tp} --pp {pp}")
        )
    if ckpt.vocab_size is not None and ckpt.vocab_size != model.architecture.vocab_size:
        raise CompileError(
            f"{where} has vocab_size={ckpt.vocab_size}, but {model.name} has {model.architecture.vocab_size}; "
            "it was exported from another model"
        )
