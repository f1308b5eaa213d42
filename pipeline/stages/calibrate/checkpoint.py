"""Load an exported TensorRT-LLM checkpoint back into its transformers class (Llama, Mistral, Mixtral, Qwen2,
Qwen3; CPU, no GPU needed).

ModelOpt's legacy exporter writes `config.json` + `rank{i}.safetensors` (i < tp*pp) in TensorRT-LLM's naming
(`transformer.layers.N.attention.qkv`, `mlp.fc/gate/proj`, ...), with quantized weights and their scales. This
module reads every rank, dequantizes each linear layer with its own scales (FP8, INT8-SmoothQuant, INT4-AWQ,
W4A8-AWQ; AWQ/SmoothQuant `prequant_scaling_factor` honoured), merges the tensor-parallel shards, stitches the
pipeline stages back together and loads the result into the stock transformers class of the checkpoint's
`architecture` — no hand-written forward. Qwen2's q/k/v biases (`attention.qkv.bias`, split like the weight) and
Qwen3's per-head norms (`attention.q_layernorm` / `k_layernorm`, TensorRT-LLM 1.2.1's `models/qwen/convert.py`
names) map back to `self_attn.{q,k,v}_proj.bias` and `self_attn.{q,k}_norm`. Mixture-of-experts layers
(TensorRT-LLM 1.2.1 `layers/moe.py`, named as `models/llama/convert.py` writes them) hold `mlp.router` (float32,
never quantized), `mlp.fc` = [up (w3); gate (w1)] stacked per expert [E, 2*I/tp, H] and `mlp.proj` [E, H, I/tp],
with one weight scale per expert and one activation scale for all experts.

With `activation_quant=True`, quantized activations (FP8 / INT8 per-tensor, after the pre-quant scale) are
simulated with forward pre-hooks on the linear layers, so the model reproduces the engine's arithmetic except for
the KV cache, which stays in the compute dtype. The calibrate stage uses this loader for its round-trip check and
the CPU reference backend serves the model it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.architectures import BY_HF_ARCHITECTURE
from pipeline.core.artifacts import read_config_json
from pipeline.core.errors import PipelineError
from pipeline.core.safetensors_file import load_safetensors

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel

# checkpoint `architecture`s this loader rebuilds (one fused QKV per layer; a gated MLP or Mixtral's experts)
LOADABLE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
                          "Qwen3ForCausalLM")
SUPPORTED_QUANT_ALGOS = (None, "FP8", "W8A8_SQ_PER_CHANNEL", "W4A16_AWQ", "W4A8_AWQ")
RENORMALIZE = 1  # MoeConfig.ExpertScaleNormalizationMode.RENORMALIZE: softmax, top-k, renormalize (HF Mixtral)
_LINEARS = {  # TensorRT-LLM name -> (HF module path inside a decoder layer, parallel style)
    "attention.qkv": ("self_attn.qkv", "column"),
    "attention.dense": ("self_attn.o_proj", "row"),
    "mlp.fc": ("mlp.gate_proj", "column"),  # TRT-LLM's GatedMLP: act(fc(x)) * gate(x)
    "mlp.gate": ("mlp.up_proj", "column"),
    "mlp.proj": ("mlp.down_proj", "row"),
}
_ACTIVATION_KINDS = {"FP8": "fp8", "W4A8_AWQ": "fp8", "W8A8_SQ_PER_CHANNEL": "int8"}  # quant_algo -> activations
_QK_NORMS = {"attention.q_layernorm": "self_attn.q_norm", "attention.k_layernorm": "self_attn.k_norm"}
_LAYER_RE = re.compile(r"^transformer\.layers\.(\d+)\.(.+)$")


class CheckpointError(PipelineError):
    """A TensorRT-LLM checkpoint directory is missing files, inconsistent or in an unsupported format."""


@dataclass
class _Linear:
    """One dequantized linear layer of one rank (weight in float32, optional activation quantization)."""

    weight: torch.Tensor
    act_scale: torch.Tensor | None = None
    prequant: torch.Tensor | None = None


@dataclass
class LoadedCheckpoint:
    """What `read_checkpoint` returns: the TRT-LLM config and merged full-precision HF tensors."""

    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    # HF linear module -> (activation kind "fp8"/"int8" or None, activation scale, pre-quant scale)
    activation_quant: dict[str, tuple[str | None, torch.Tensor | None, torch.Tensor | None]] = field(
        default_factory=dict
    )


def read_config(ckpt_dir: Path) -> dict[str, Any]:
    """Read and sanity-check a checkpoint's `config.json`."""
    path = Path(ckpt_dir) / "config.json"
    cfg = read_config_json(path, CheckpointError,
                           missing=f"{path} does not exist; point at a TensorRT-LLM checkpoint directory",
                           fix="re-run `invoke calibrate --force`")
    arch = cfg.get("architecture")
    if arch not in LOADABLE_ARCHITECTURES:
        raise CheckpointError(f"{path}: architecture {arch!r} is not supported; loadable: "
                              f"{', '.join(LOADABLE_ARCHITECTURES)}")
    algo = (cfg.get("quantization") or {}).get("quant_algo")
    if algo not in SUPPORTED_QUANT_ALGOS:
        raise CheckpointError(f"{path}: quant_algo {algo!r} is not supported; use one of {SUPPORTED_QUANT_ALGOS[1:]}")
    return cfg


def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """ModelOpt's packing: int8 [out/2, in], low nibble = row 2j, high nibble = row 2j+1 (signed 4-bit)."""
    import torch

    b = packed.view(torch.uint8).to(torch.int16)
    low, high = b & 0x0F, (b >> 4) & 0x0F
    low = torch.where(low > 7, low - 16, low)
    high = torch.where(high > 7, high - 16, high)
    out = torch.stack([low, high], dim=1)  # [out/2, 2, in]
    return out.reshape(-1, packed.shape[-1]).float()


def _fp8_round(x: torch.Tensor) -> torch.Tensor:
    import torch

    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def dequant_linear(w: dict[str, torch.Tensor], algo: str | None, prefix: str) -> _Linear:
    """Dequantize one linear of one rank from its tensors (`weight`, `*_scaling_factor`)."""
    weight = w.get("weight")
    if weight is None:
        raise CheckpointError(f"{prefix}.weight is missing from the checkpoint; re-export it")
    wsf = w.get("weights_scaling_factor")
    act = w.get("activation_scaling_factor")
    pqs = w.get("prequant_scaling_factor")
    pqs = pqs.float() if pqs is not None else None
    if algo is None or weight.element_size() >= 2:
        return _Linear(weight.float())
    if wsf is None:
        raise CheckpointError(f"{prefix}.weights_scaling_factor is missing for quant_algo {algo}; re-export")
    if algo == "FP8":
        deq = weight.float() * wsf.float()
    elif algo == "W8A8_SQ_PER_CHANNEL":
        deq = weight.float() * wsf.float().reshape(-1, 1)
    elif algo in ("W4A16_AWQ", "W4A8_AWQ"):
        q = _unpack_int4(weight)
        groups = wsf.shape[-1]
        if q.shape[0] != wsf.shape[0] or q.shape[1] % groups:
            raise CheckpointError(f"{prefix}: weight {tuple(q.shape)} does not match scales {tuple(wsf.shape)}")
        deq = q * wsf.float().repeat_interleave(q.shape[1] // groups, dim=1)
        wsf2 = w.get("weights_scaling_factor_2")
        if algo == "W4A8_AWQ" and wsf2 is not None:
            # The second (FP8, per-tensor) weight quantizer: values are FP8-representable multiples of wsf2.
            deq = _fp8_round(deq / wsf2.float()) * wsf2.float()
    else:  # pragma: no cover - read_config filters
        raise CheckpointError(f"quant_algo {algo} is not supported")
    return _Linear(deq, act.float() if act is not None else None, pqs)


def _split_layers(weights: dict[str, torch.Tensor]) -> tuple[dict[int, dict[str, torch.Tensor]], dict]:
    layers: dict[int, dict[str, torch.Tensor]] = {}
    other = {}
    for name, t in weights.items():
        m = _LAYER_RE.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = t
        else:
            other[name] = t
    return layers, other


def _linear_tensors(layer: dict[str, torch.Tensor], key: str) -> dict[str, torch.Tensor]:
    pre = key + "."
    return {k[len(pre) :]: v for k, v in layer.items() if k.startswith(pre)}


def _merge(parts: list[torch.Tensor], style: str) -> torch.Tensor:
    import torch

    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts, dim=0 if style == "column" else 1)


def _on_every_rank(parts: list[torch.Tensor | None], what: str) -> list[torch.Tensor]:
    """`parts` when every tensor-parallel rank holds the tensor; raise when only some do."""
    present = [p for p in parts if p is not None]
    if len(present) != len(parts):
        raise CheckpointError(f"{what} is missing on some tensor-parallel ranks; the checkpoint is inconsistent")
    return present


def _same(parts: list[torch.Tensor], what: str) -> torch.Tensor:
    import torch

    for p in parts[1:]:
        if p.shape != parts[0].shape or not torch.equal(p, parts[0]):
            raise CheckpointError(f"{what} differs between tensor-parallel ranks; the checkpoint is inconsistent")
    return parts[0]


def _check_rank_files(ckpt_dir: Path, cfg: dict[str, Any]) -> tuple[int, int]:
    """(tp, pp) of the checkpoint's mapping, once every rank file is present."""
    mapping = cfg.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    world = int(mapping.get("world_size", tp * pp))
    if world != tp * pp:
        raise CheckpointError(f"{ckpt_dir}/config.json: mapping world_size {world} != tp_size {tp} x pp_size {pp}")
    missing = [f"rank{r}.safetensors" for r in range(world) if not (ckpt_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise CheckpointError(f"{ckpt_dir}: missing {', '.join(missing)} (expected {world} rank files); re-export")
    return tp, pp


def _merge_qkv(parts: list[torch.Tensor], cfg: dict[str, Any], tp: int, gid: int) -> dict[str, torch.Tensor]:
    """Split each rank's fused QKV weight (or bias) into q/k/v and concatenate across ranks (replicated KV heads
    once)."""
    import torch

    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    head = int(cfg.get("head_size") or cfg["hidden_size"] // heads)
    q_rows, kv_rows = heads // tp * head, max(1, kv_heads // tp) * head
    qs, ks, vs = [], [], []
    for x in parts:
        if x.shape[0] != q_rows + 2 * kv_rows:
            raise CheckpointError(
                f"layer {gid} qkv has {x.shape[0]} rows per rank, expected "
                f"{q_rows + 2 * kv_rows} (heads {heads}, kv heads {kv_heads}, tp {tp})"
            )
        q, k, v = x.split([q_rows, kv_rows, kv_rows], dim=0)
        qs.append(q)
        ks.append(k)
        vs.append(v)
    rep = max(1, tp // kv_heads)  # tp > kv heads: each kv head is replicated on `rep` ranks
    return {"q_proj": torch.cat(qs), "k_proj": torch.cat(ks[::rep]), "v_proj": torch.cat(vs[::rep])}


def _merge_layer(layer_parts: list[dict[str, torch.Tensor]], gid: int, cfg: dict[str, Any], tp: int,
                 sd: dict[str, torch.Tensor], act_q: dict[str, tuple]) -> None:
    """Dequantize and merge one decoder layer's per-rank tensors into `sd` (and activation quant into `act_q`)."""
    algo = (cfg.get("quantization") or {}).get("quant_algo")
    act_kind = _ACTIVATION_KINDS.get(algo) if algo is not None else None
    hf = f"model.layers.{gid}"
    for trt, hf_name in (("input_layernorm", "input_layernorm"), ("post_layernorm", "post_attention_layernorm")):
        sd[f"{hf}.{hf_name}.weight"] = _same([lp[f"{trt}.weight"].float() for lp in layer_parts], f"layer {gid} {trt}")
    moe = "mlp.router.weight" in layer_parts[0]
    if moe:
        _merge_moe(layer_parts, gid, cfg, sd, act_q, act_kind)
    for trt, (hf_mod, style) in _LINEARS.items():
        if moe and trt.startswith("mlp."):
            continue
        lins = [dequant_linear(_linear_tensors(lp, trt), algo, f"layers.{gid}.{trt}") for lp in layer_parts]
        pqs = None
        if lins[0].prequant is not None:
            what = f"layer {gid} {trt} prequant_scaling_factor"
            prequants = _on_every_rank([x.prequant for x in lins], what)
            pqs = _merge(prequants, "column") if style == "row" else _same(prequants, what)
        act = lins[0].act_scale
        if act is not None:
            what = f"layer {gid} {trt} activation_scaling_factor"
            act = _same(_on_every_rank([x.act_scale for x in lins], what), what)
        if trt == "attention.qkv":
            merged = _merge_qkv([x.weight for x in lins], cfg, tp, gid)
        else:
            merged = {hf_mod.split(".")[1]: _merge([x.weight for x in lins], style)}
        parent = hf_mod.split(".")[0]
        for name, wt in merged.items():
            key = f"{hf}.{parent}.{name}"
            if pqs is not None or (act is not None and act_kind):
                act_q[key] = (act_kind if act is not None else None, act, pqs)
            sd[f"{key}.weight"] = wt
    _merge_biases(layer_parts, gid, cfg, tp, sd)
    for trt, hf_name in _QK_NORMS.items():
        if f"{trt}.weight" in layer_parts[0]:
            sd[f"{hf}.{hf_name}.weight"] = _same([lp[f"{trt}.weight"].float() for lp in layer_parts],
                                                 f"layer {gid} {trt}")


def _merge_biases(layer_parts: list[dict[str, torch.Tensor]], gid: int, cfg: dict[str, Any], tp: int,
                  sd: dict[str, torch.Tensor]) -> None:
    """The linears' biases (Qwen2's q/k/v): column-parallel ones concatenated across ranks, row-parallel ones
    replicated (added once after the all-reduce)."""
    for trt, (hf_mod, style) in _LINEARS.items():
        found = [lp.get(f"{trt}.bias") for lp in layer_parts]
        if found[0] is None:
            continue
        parts = [p.float() for p in _on_every_rank(found, f"layer {gid} {trt}.bias")]
        parent, name = hf_mod.split(".")
        if trt == "attention.qkv":
            merged = _merge_qkv(parts, cfg, tp, gid)
        else:
            merged = {name: _merge(parts, style) if style == "column" else _same(parts, f"layer {gid} {trt}.bias")}
        for proj, b in merged.items():
            sd[f"model.layers.{gid}.{parent}.{proj}.bias"] = b


def _expert_linears(parts: list[dict[str, torch.Tensor]], algo: str | None, prefix: str, expert: int,
                    experts: int) -> list[_Linear]:
    """Expert `expert` of a stacked MoE linear, dequantized on each rank: the weight and its per-expert scales are
    indexed, the activation scale is one for all experts."""
    out = []
    for w in parts:
        one = {k: v[expert] if k != "activation_scaling_factor" and v.dim() and v.shape[0] == experts else v
               for k, v in w.items()}
        out.append(dequant_linear(one, algo, f"{prefix}[{expert}]"))
    return out


def _check_moe_config(cfg: dict[str, Any], gid: int) -> int:
    """The number of experts of a MoE checkpoint whose layout this loader reads (experts TP-sharded, renormalized)."""
    moe, mapping = cfg.get("moe") or {}, cfg.get("mapping") or {}
    if int(mapping.get("moe_ep_size", 1)) != 1:
        raise CheckpointError(f"layer {gid}: moe_ep_size {mapping['moe_ep_size']} (experts split across ranks) is "
                              "not readable here; ModelOpt exports experts TP-sharded (moe_ep_size 1)")
    if int(moe.get("normalization_mode", RENORMALIZE)) != RENORMALIZE or not moe.get("num_experts"):
        raise CheckpointError(f"layer {gid}: moe config {moe} is not Mixtral's (experts, top_k, RENORMALIZE)")
    return int(moe["num_experts"])


def _merge_moe(layer_parts: list[dict[str, torch.Tensor]], gid: int, cfg: dict[str, Any],
               sd: dict[str, torch.Tensor], act_q: dict[str, tuple], act_kind: str | None) -> None:
    """One MoE layer into HF Mixtral names: router -> `block_sparse_moe.gate`; per expert, fc = [w3; w1] per rank
    (each half TP-sharded by rows), proj = w2 (TP-sharded by columns)."""
    import torch

    experts = _check_moe_config(cfg, gid)
    algo = (cfg.get("quantization") or {}).get("quant_algo")
    hf = f"model.layers.{gid}.block_sparse_moe"
    sd[f"{hf}.gate.weight"] = _same([lp["mlp.router.weight"].float() for lp in layer_parts], f"layer {gid} router")
    fc = [_linear_tensors(lp, "mlp.fc") for lp in layer_parts]
    proj = [_linear_tensors(lp, "mlp.proj") for lp in layer_parts]
    for e in range(experts):
        fcs = _expert_linears(fc, algo, f"layers.{gid}.mlp.fc", e, experts)
        if sum(x.weight.shape[0] for x in fcs) != 2 * int(cfg["intermediate_size"]):
            raise CheckpointError(f"layer {gid} mlp.fc expert {e}: {[tuple(x.weight.shape) for x in fcs]} per rank is "
                                  f"not [w3; w1] of intermediate_size {cfg['intermediate_size']}; re-export")
        halves = [x.weight.chunk(2, dim=0) for x in fcs]  # [w3 rows, w1 rows] of this rank
        projs = _expert_linears(proj, algo, f"layers.{gid}.mlp.proj", e, experts)
        tensors = {"w1": (torch.cat([h[1] for h in halves]), fcs), "w3": (torch.cat([h[0] for h in halves]), fcs),
                   "w2": (torch.cat([x.weight for x in projs], dim=1), projs)}
        for name, (weight, lins) in tensors.items():
            key = f"{hf}.experts.{e}.{name}"
            sd[f"{key}.weight"] = weight
            if lins[0].act_scale is not None and act_kind:
                what = f"{key} activation_scaling_factor"
                act_q[key] = (act_kind, _same(_on_every_rank([x.act_scale for x in lins], what), what), None)


def _merge_stage_globals(split: list, cfg: dict[str, Any], tp: int, sd: dict[str, torch.Tensor]) -> None:
    """The embedding, final norm and LM head a pp stage holds (first / last stage), merged across its TP ranks."""
    import torch

    emb = [s[1].get("transformer.vocab_embedding.weight") for s in split]
    if emb[0] is not None:
        sharded = cfg.get("use_parallel_embedding") and tp > 1
        dim = int(cfg.get("embedding_sharding_dim", 0))
        sd["model.embed_tokens.weight"] = (
            torch.cat([e.float() for e in emb], dim=dim) if sharded else _same([e.float() for e in emb], "embedding")
        )
    if "transformer.ln_f.weight" in split[0][1]:
        sd["model.norm.weight"] = split[0][1]["transformer.ln_f.weight"].float()
    heads = [s[1].get("lm_head.weight") for s in split]
    if heads[0] is not None:
        sd["lm_head.weight"] = torch.cat([h.float() for h in heads], dim=0)


def _check_complete(ckpt_dir: Path, cfg: dict[str, Any], sd: dict[str, torch.Tensor], layers: int) -> None:
    if layers != int(cfg["num_hidden_layers"]):
        raise CheckpointError(
            f"{ckpt_dir}: found {layers} layers across pp stages, config says {cfg['num_hidden_layers']}"
        )
    for need in ("model.embed_tokens.weight", "model.norm.weight"):
        if need not in sd:
            raise CheckpointError(f"{ckpt_dir}: tensor for {need} is missing from every rank; re-export")
    if "lm_head.weight" not in sd and not cfg.get("share_embedding_table"):
        raise CheckpointError(f"{ckpt_dir}: lm_head.weight is missing from every rank; re-export")


def read_checkpoint(ckpt_dir: str | Path) -> LoadedCheckpoint:
    """Read every rank of a checkpoint, dequantize and merge it into HF `LlamaForCausalLM` tensor names.

    Raises:
        CheckpointError: a rank file is missing, a tensor is missing or shapes are inconsistent.
    """
    ckpt_dir = Path(ckpt_dir)
    cfg = read_config(ckpt_dir)
    tp, pp = _check_rank_files(ckpt_dir, cfg)
    fix = "re-run `invoke build --force calibrate`"
    # rank = pp_rank * tp + tp_rank (TensorRT-LLM Mapping); each pp stage numbers its layers from 0.
    ranks = [[load_safetensors(ckpt_dir / f"rank{p * tp + t}.safetensors", fix=fix) for t in range(tp)]
             for p in range(pp)]
    sd: dict[str, torch.Tensor] = {}
    act_q: dict[str, tuple[str | None, torch.Tensor | None, torch.Tensor | None]] = {}
    offset = 0
    for p, stage in enumerate(ranks):
        split = [_split_layers(w) for w in stage]
        local_ids = sorted(split[0][0])
        for t in range(1, tp):
            if sorted(split[t][0]) != local_ids:
                raise CheckpointError(f"pp stage {p}: tensor-parallel ranks hold different layers")
        for lid in local_ids:
            _merge_layer([s[0][lid] for s in split], offset + lid, cfg, tp, sd, act_q)
        offset += len(local_ids)
        _merge_stage_globals(split, cfg, tp, sd)
    _check_complete(ckpt_dir, cfg, sd, offset)
    return LoadedCheckpoint(cfg, sd, act_q)


def hf_config_from(cfg: dict[str, Any]):
    """The transformers config (of the checkpoint `architecture`'s own class) equivalent to a TensorRT-LLM
    checkpoint config (`MixtralConfig` for a `moe` checkpoint: LLaMAConfig with `moe`, its `swiglu` is HF's silu).
    Biases: QWenConfig's `attn_bias` / `mlp_bias` where written, else ModelOpt's `bias`."""
    from transformers import CONFIG_MAPPING

    heads = int(cfg["num_attention_heads"])
    shape: dict[str, Any] = dict(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_size") or cfg["hidden_size"] // heads),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(cfg.get("norm_epsilon", 1e-5)),
        rope_theta=float(cfg.get("rotary_base", 10000.0)),
    )
    if (moe := cfg.get("moe") or {}).get("num_experts"):
        return CONFIG_MAPPING["mixtral"](
            **shape, hidden_act="silu", tie_word_embeddings=bool(cfg.get("share_embedding_table", False)),
            sliding_window=None, num_local_experts=int(moe["num_experts"]), num_experts_per_tok=int(moe["top_k"]),
            architectures=["MixtralForCausalLM"],
        )
    fam = BY_HF_ARCHITECTURE[cfg["architecture"]]  # read_config admits LOADABLE_ARCHITECTURES only
    rope = cfg.get("rotary_scaling")
    if isinstance(rope, dict):
        rope = dict(rope)
        rope.setdefault("rope_type", rope.get("type"))
    bias = bool(cfg.get("bias", False))
    return CONFIG_MAPPING[fam.hf_model_type](
        **shape,
        hidden_act=cfg.get("hidden_act", "silu"),
        rope_scaling=rope or None,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", cfg.get("share_embedding_table", False))),
        attention_bias=bool(cfg.get("attn_bias", bias)),
        mlp_bias=bool(cfg.get("mlp_bias", bias)),
        architectures=[fam.hf_architecture],
    )


def activation_hook(kind: str, scale: torch.Tensor, prequant: torch.Tensor | None):
    """Forward pre-hook: pre-quant scale, then per-tensor FP8 (saturating) or INT8 fake quantization."""
    import torch

    maxbound = 448.0 if kind == "fp8" else 127.0
    amax = scale.float() * maxbound

    def hook(_module, args):
        x = args[0]
        y = x.float()
        if prequant is not None:
            y = y * prequant.to(y.device)
        inv = maxbound / amax.to(y.device)  # same arithmetic as ModelOpt's fake quantizer
        if kind == "fp8":
            y = (y * inv).to(torch.float8_e4m3fn).float() * (1 / inv)
        else:
            y = torch.round(y * inv).clamp(-128, 127) / inv
        return (y.to(x.dtype), *args[1:])

    return hook


def load_checkpoint_as_hf(
    ckpt_dir: str | Path, *, dtype: torch.dtype | None = None, activation_quant: bool = True
) -> PreTrainedModel:
    """Load an exported TensorRT-LLM checkpoint (all ranks merged, dequantized) as its transformers class.

    Args:
        ckpt_dir: directory with `config.json` and `rank{i}.safetensors`.
        dtype: parameter dtype of the returned model (default float32).
        activation_quant: simulate the checkpoint's FP8/INT8 activation quantization with forward pre-hooks.

    Raises:
        CheckpointError: the directory is not a complete, supported checkpoint.
    """
    import torch

    dtype = dtype or torch.float32
    loaded = read_checkpoint(ckpt_dir)
    return assemble_model(hf_config_from(loaded.config), loaded.state_dict, loaded.activation_quant,
                          dtype=dtype, activation_quant=activation_quant, source=ckpt_dir)


def assemble_model(hf_cfg, state_dict: dict[str, torch.Tensor], act_q: dict[str, tuple], *, dtype,
                   activation_quant: bool, source: str | Path) -> PreTrainedModel:
    """The stock transformers causal LM of `hf_cfg` (`LlamaForCausalLM`, `MixtralForCausalLM`, ...) holding
    dequantized HF-named tensors, with activation quantization simulated by
    forward pre-hooks (`act_q`: module -> (kind, scale, pre-quant scale); a pre-quant scale without a hook is folded
    into the weight).

    Raises:
        CheckpointError: the tensors do not map onto the model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg)
    sd = dict(state_dict)
    hooks = {}
    for name, (kind, scale, prequant) in act_q.items():
        if activation_quant and kind:
            hooks[name] = activation_hook(kind, scale, prequant)
        elif prequant is not None:  # y = (x * s) W^T = x (W * s)^T
            sd[f"{name}.weight"] = sd[f"{name}.weight"] * prequant.reshape(1, -1)
    sd = {k: v.to(dtype) for k, v in sd.items()}
    if hf_cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if hf_cfg.tie_word_embeddings else set())
    missing, extra = expected - set(sd), set(sd) - expected
    if missing or extra:
        raise CheckpointError(
            f"{source}: tensors do not map onto {type(model).__name__} (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(extra)[:3]})"
        )
    model.load_state_dict(sd, strict=False, assign=True)
    if hf_cfg.tie_word_embeddings:
        model.tie_weights()
    # Rotary buffers were created on the meta device: rebuild them on CPU.
    rotary = model.model.rotary_emb
    inv_freq, rotary.attention_scaling = rotary.rope_init_fn(rotary.config, torch.device("cpu"))
    rotary.register_buffer("inv_freq", inv_freq, persistent=False)
    rotary.original_inv_freq = inv_freq
    for name, hook in hooks.items():
        model.get_submodule(name).register_forward_pre_hook(hook)
    model.eval()
    return model
