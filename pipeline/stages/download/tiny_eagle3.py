"""Deterministic generator of a tiny EAGLE-3 head (`tiny-llama-eagle3`) for its generated target.

The head is written as the published EAGLE-3 heads are and as TensorRT-LLM 1.2's `Eagle3ForCausalLM` loads them:
config.json (`LlamaForCausalLM`, one decoder layer, `draft_vocab_size`) and one model.safetensors with `fc.weight`
[H, n*H] (fuses the n captured target layers), `midlayer.*` (one Llama decoder layer whose q/k/v read 2H:
concat(input_layernorm(embedding), hidden_norm(hidden))), `norm.weight`, `lm_head.weight` [draft_vocab, H], `d2t`
(int64: target id = draft id + d2t[draft id]) and `t2d` (bool over the target vocabulary). No `embed_tokens`: the head
uses the target's embedding.

Training distils the target (single-threaded, fixed seed, fixed steps, so the bytes are reproducible): the target
continues corpus prompts greedily; at every position t the head reads the target's captured layer outputs at t (fused
by fc) and the embedding of token t+1, and learns the target's greedy token t+2. Training-time test: the head's own
output hidden state (before `norm`) replaces fc(features) for `unroll - 1` further chained steps, each attending to
the true-feature entries of its anchor and to the chain's own earlier entries, as drafting does. The draft vocabulary
is the `draft_vocab_size` tokens the target predicts most often on that data.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, TypedDict

from pipeline.core.errors import DownloadError
from pipeline.core.registry import load_registry
from pipeline.core.stage_log import progress

EAGLE3_VERSION = "1"


class HeadSettings(TypedDict):
    """The head's data and training recipe."""

    seed: int
    prompts: int
    prompt_tokens: list[int]
    length: int
    steps: int
    batch_size: int
    window: int
    unroll: int
    step_decay: float
    lr: float
    warmup: int
    weight_decay: float
    init_std: float


# Recipe (part of the cache key); `unroll` = the registry's default draft length of the head.
HEAD_TRAIN: HeadSettings = {"seed": 4321, "prompts": 512, "prompt_tokens": [4, 8, 16, 32], "length": 64,
                            "steps": 300, "batch_size": 8, "window": 48, "unroll": 4, "step_decay": 0.8, "lr": 5e-3,
                            "warmup": 20, "weight_decay": 0.0, "init_std": 0.02}
HELDOUT_PROMPTS = 32  # the last prompts are held out to measure the head
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def head_target(name: str) -> str:
    entry = load_registry()[name]
    if entry.eagle3 is None:
        raise DownloadError(f"model '{name}' is not an EAGLE-3 head")
    return entry.eagle3.target_model


def head_key_fields(name: str, target_key: str) -> dict[str, Any]:
    """What the head's generation key adds to a model's: the head generator, its recipe and its target's key."""
    entry = load_registry()[name]
    assert entry.eagle3 is not None
    return {"eagle3_generator": EAGLE3_VERSION, "head_recipe": dict(HEAD_TRAIN), "target_key": target_key,
            "eagle3": entry.eagle3.model_dump()}


# ------------------------------------------------------------------------------------------------ the head
def _rope(positions, head_dim: int, theta: float):
    import torch

    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x, cos, sin):
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _build_head(config: dict[str, Any], n_capture: int):
    """The trainable head (module names = the checkpoint's keys)."""
    import torch
    from torch import nn

    h, heads, kv, hd = (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
                        config["head_dim"])

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"]))

    def linear(i: int, o: int) -> nn.Linear:
        return nn.Linear(i, o, bias=False)

    layer = nn.Module()
    layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm = RMSNorm(), RMSNorm(), RMSNorm()
    layer.self_attn = nn.Module()
    for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        setattr(layer.self_attn, proj, linear(2 * h, out))
    layer.self_attn.o_proj = linear(heads * hd, h)
    layer.mlp = nn.Module()
    inter = config["intermediate_size"]
    layer.mlp.gate_proj, layer.mlp.up_proj = linear(h, inter), linear(h, inter)
    layer.mlp.down_proj = linear(config["intermediate_size"], h)
    head = nn.Module()
    head.fc = linear(n_capture * h, h)
    head.midlayer, head.norm = layer, RMSNorm()
    head.lm_head = linear(h, config["draft_vocab_size"])
    return head


def _chain_forward(head, config: dict[str, Any], embeds, fused, steps: int):
    """Training-time test over a batch: `embeds` [B, T, H] (token p+1's embedding at position p), `fused` [B, T, H]
    (fc of the features at p). Returns the draft logits of each chained step j (1..steps), [B, T, V] each; step j at
    position p is the j-th draft of the chain anchored at p - j + 1 (invalid for p < j - 1)."""
    import torch

    layer, attn = head.midlayer, head.midlayer.self_attn
    b, t, _ = embeds.shape
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    cos, sin = _rope(torch.arange(t), hd, config["rope_theta"])
    e = layer.input_layernorm(embeds)
    pos = torch.arange(t)
    keys, values, outs = [], [], []
    hidden = fused
    for j in range(1, steps + 1):
        x = torch.cat([e, layer.hidden_norm(hidden)], dim=-1)
        q = _rotate(attn.q_proj(x).view(b, t, heads, hd).transpose(1, 2), cos, sin)
        k = _rotate(attn.k_proj(x).view(b, t, kv, hd).transpose(1, 2), cos, sin)
        keys.append(k.repeat_interleave(heads // kv, 1))
        values.append(attn.v_proj(x).view(b, t, kv, hd).transpose(1, 2).repeat_interleave(heads // kv, 1))
        scores, masks = [], []
        for i in range(1, j + 1):  # step 1: the anchor's context; steps 2..j: the chain's own entries
            scores.append(q @ keys[i - 1].transpose(-1, -2) / math.sqrt(hd))
            allowed = pos[None, :] <= pos[:, None] - (j - 1) if i == 1 else pos[None, :] == pos[:, None] - (j - i)
            masks.append(allowed)
        s = torch.cat(scores, dim=-1).masked_fill(~torch.cat(masks, dim=-1), float("-inf"))
        a = torch.softmax(s, dim=-1) @ torch.cat(values[:j], dim=2)
        out = hidden + attn.o_proj(a.transpose(1, 2).reshape(b, t, heads * hd))
        out = out + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(
            layer.post_attention_layernorm(out))) * layer.mlp.up_proj(layer.post_attention_layernorm(out)))
        outs.append(head.lm_head(head.norm(out)))
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # chain: position p reads p - 1
    return outs


# ------------------------------------------------------------------------------------------------ data
def _capture(model, layers: list[int]):
    """Forward hooks that keep the outputs of decoder `layers` (the residual stream after each) in a dict."""
    captured: dict[int, Any] = {}
    handles = []
    for i in layers:
        def hook(_module, _args, output, i=i):
            captured[i] = output[0] if isinstance(output, tuple) else output
        handles.append(model.model.layers[i].register_forward_hook(hook))
    return captured, handles


def _continue(target, prompts, length: int):
    """`prompts` [N, P] continued greedily by the target to `length` tokens."""
    import torch

    seqs = prompts
    with torch.no_grad():
        out = target(input_ids=seqs, use_cache=True)
        while seqs.shape[1] < length:
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            seqs = torch.cat([seqs, nxt], dim=1)
            out = target(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return seqs


def _greedy_data(target, tokenizer, settings: HeadSettings, layers: list[int]):
    """Corpus prompts of several lengths (the first tokens of successive calibration paragraphs), continued greedily
    by the target: (tokens [N, T], features [N, T, n*H], the target's greedy next token [N, T])."""
    import torch

    from pipeline.stages.download.tiny_corpus import as_chat, corpus_split

    calib, _ = corpus_split()
    texts = iter(calib)
    groups = []
    per_group = settings["prompts"] // len(settings["prompt_tokens"])
    for p in progress(settings["prompt_tokens"], desc="generate eagle3 head: target data", unit="group"):
        prompts: list[list[int]] = []
        while len(prompts) < per_group:
            ids = tokenizer(as_chat(next(texts)))["input_ids"]
            if len(ids) >= p:
                prompts.append(ids[:p])
        groups.append(_continue(target, torch.tensor(prompts, dtype=torch.long), settings["length"]))
    # interleave the groups so the held-out tail has every prompt length
    seqs = torch.stack(groups, dim=1).reshape(-1, settings["length"])
    with torch.no_grad():
        captured, handles = _capture(target, layers)
        try:
            greedy = target(input_ids=seqs).logits.argmax(-1)
            features = torch.cat([captured[i] for i in layers], dim=-1)
        finally:
            for handle in handles:
                handle.remove()
    return seqs, features, greedy


def _draft_vocab(greedy, size: int, vocab: int):
    """The `size` tokens the target predicts most often (ties: the lower id), in ascending id order."""
    import torch

    counts = torch.bincount(greedy.flatten(), minlength=vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


# ------------------------------------------------------------------------------------------------ training
def _init_head(head, target, draft_ids, settings: HeadSettings, n_capture: int) -> None:
    """Random small weights; fc starts as the last captured layer, lm_head/norm as the target's draft-vocab rows."""
    import torch

    g = torch.Generator().manual_seed(settings["seed"])
    for p in head.parameters():
        if p.dim() == 2:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * settings["init_std"])
    h = head.norm.weight.numel()
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, (n_capture - 1) * h:] = torch.eye(h)
        head.lm_head.weight.copy_(target.lm_head.weight[draft_ids].float())
        head.norm.weight.copy_(target.model.norm.weight.float())


def _losses(head, config, batch, t2d, settings: HeadSettings, embed):
    """Per-step cross entropies (step j predicts the target's greedy token at p + j + 1) and top-1 hits."""
    import torch

    tokens, features, greedy = batch
    embeds = embed(tokens[:, 1:])
    fused = head.fc(features[:, :-1])
    labels = t2d[greedy[:, 1:]]  # draft id of the target's next token after p + 1, -100 outside the draft vocab
    outs = _chain_forward(head, config, embeds, fused, settings["unroll"])
    losses, hits = [], []
    for j, logits in enumerate(outs, 1):
        lab = labels.clone()
        lab[:, : j - 1] = -100  # no anchor
        losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1),
                                                        ignore_index=-100))
        valid = lab >= 0
        hits.append(((logits.argmax(-1) == lab) & valid).sum().item() / max(1, valid.sum().item()))
    return losses, hits


def _train_head(head, config, data, t2d, embed, settings: HeadSettings, steps: int) -> float:
    """`steps` AdamW steps on random windows of `data` (tokens, features, greedy); returns the last loss."""
    import torch

    tokens = data[0]
    g = torch.Generator().manual_seed(settings["seed"])
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=settings["lr"],
                            weight_decay=settings["weight_decay"], betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < settings["warmup"]:
            return (step + 1) / settings["warmup"]
        frac = (step - settings["warmup"]) / max(1, steps - settings["warmup"])
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    w, n, length = settings["window"], tokens.shape[0], tokens.shape[1]
    weights = [settings["step_decay"] ** j for j in range(settings["unroll"])]
    loss_val = float("nan")
    for _ in progress(range(steps), desc="generate eagle3 head: training", unit="step"):
        rows = torch.randint(0, n, (settings["batch_size"],), generator=g)
        starts = torch.randint(0, length - w, (settings["batch_size"],), generator=g)
        batch = tuple(torch.stack([x[r, s:s + w] for r, s in zip(rows.tolist(), starts.tolist())])
                      for x in data)
        losses, _ = _losses(head, config, batch, t2d, settings, embed)
        loss = sum(wt * x for wt, x in zip(weights, losses)) / sum(weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = float(loss.detach())
    return loss_val


def _head_config(name: str, target_config: dict[str, Any]) -> dict[str, Any]:
    entry = load_registry()[name]
    assert entry.eagle3 is not None
    arch = entry.architecture
    if (arch.hidden_size, arch.vocab_size) != (target_config["hidden_size"], target_config["vocab_size"]):
        raise DownloadError(f"EAGLE-3 head '{name}': hidden/vocab {arch.hidden_size}/{arch.vocab_size} differ from "
                            f"its target's {target_config['hidden_size']}/{target_config['vocab_size']}; "
                            "fix the registry")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "num_hidden_layers": arch.num_layers, "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size, "vocab_size": arch.vocab_size,
        "draft_vocab_size": entry.eagle3.draft_vocab_size,
        "max_position_embeddings": arch.max_position_embeddings, "rope_theta": arch.rope_theta,
        "rms_norm_eps": target_config.get("rms_norm_eps", 1e-5), "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": False, "mlp_bias": False, "initializer_range": HEAD_TRAIN["init_std"],
        "bos_token_id": target_config["bos_token_id"], "eos_token_id": target_config["eos_token_id"],
        "pad_token_id": target_config["pad_token_id"], "torch_dtype": "bfloat16", "dtype": "bfloat16",
        "use_cache": True,
    }


def _agreement(head, config, data, t2d, embed) -> list[float]:
    """Top-1 agreement with the target of each chained draft step on `data` (all anchors, teacher forced)."""
    import torch

    with torch.no_grad():
        _, hits = _losses(head, config, data, t2d, HEAD_TRAIN, embed)
    return [round(h, 4) for h in hits]


def generate_head(name: str, out_dir: Path, target_dir: Path, *, steps: int | None = None) -> dict[str, Any]:
    """Write the EAGLE-3 head `name` for the generated target in `target_dir` into `out_dir`; returns manifest fields.

    Must run inside the deterministic-torch context of the caller (`tinymodel.generate_tiny_model`).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.stages.download.tiny_corpus import GENERATOR_VERSION

    entry = load_registry()[name]
    assert entry.eagle3 is not None
    settings = HEAD_TRAIN
    steps = settings["steps"] if steps is None else steps
    t0 = time.monotonic()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target_config = json.loads((target_dir / "config.json").read_text())
    layers = sorted(entry.eagle3.capture_layers or _default_capture(target_config["num_hidden_layers"], name))
    config = _head_config(name, target_config)
    tokens, features, greedy = _greedy_data(target, tokenizer, settings, layers)
    keep = tokens.shape[0] - HELDOUT_PROMPTS
    draft_ids = _draft_vocab(greedy[:keep], config["draft_vocab_size"], config["vocab_size"])
    t2d = torch.full((config["vocab_size"],), -100, dtype=torch.long)
    t2d[draft_ids] = torch.arange(len(draft_ids))
    torch.manual_seed(settings["seed"])
    head = _build_head(config, len(layers))
    _init_head(head, target, draft_ids, settings, len(layers))
    embed = target.get_input_embeddings().requires_grad_(False)
    train = (tokens[:keep], features[:keep], greedy[:keep])
    heldout = (tokens[keep:], features[keep:], greedy[keep:])
    head.train()
    loss = _train_head(head, config, train, t2d, embed, settings, steps) if steps else float("nan")
    head.eval()
    agreement = _agreement(head, config, heldout, t2d, embed)
    print(f"held-out top-1 agreement with the target per chained step: {agreement}")  # into the generation log
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    state["d2t"] = draft_ids - torch.arange(len(draft_ids))
    state["t2d"] = t2d >= 0
    out_dir = Path(out_dir)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for f in TOKENIZER_FILES:  # the target's tokenizer (the download stage checks every model dir has one)
        if (target_dir / f).is_file():
            shutil.copyfile(target_dir / f, out_dir / f)
    return {
        "name": name,
        "generator_version": GENERATOR_VERSION,
        "train_steps": steps,
        "final_train_loss": round(loss, 4),
        "heldout_perplexity_fp32": None,
        "seconds": round(time.monotonic() - t0, 1),
    }


def _default_capture(num_layers: int, name: str) -> tuple[int, ...]:
    if num_layers <= 5:
        raise DownloadError(f"EAGLE-3 head '{name}': its target has {num_layers} layers, too few for the default "
                            "capture (1, L/2-1, L-4); set eagle3.capture_layers in the registry")
    return (1, num_layers // 2 - 1, num_layers - 4)
