"""CPU stand-in for tensorrt_llm.LLM (PyTorch runtime) behind the reference LLM-API model: loads the exported
Hugging Face checkpoint with transformers (ModelOpt's quantized weights dequantized), and generates with in-flight
scheduling, block prefix caching and draft-target speculation, reporting the metrics the LLM API reports.

Weights (ModelOpt unified HF export): FP8 (`float8_e4m3fn` weight x `weight_scale`), INT4 AWQ (two signed 4-bit
values per uint8 along the output dim, x per-group `weight_scale`; W4A8 also rounded to FP8 multiples of
`weight_scale_2`), INT8 (x per-channel `weight_scale`); an AWQ `pre_quant_scale` is folded into the weight's
columns, or (with FP8 activations) applied to the input. FP8 activations are simulated: a linear with an `input_scale` rounds its input to FP8 multiples of it
(static per-tensor, as the FP8 GEMM does); KV-cache quantization is not (`k_scale`, `v_scale` are dropped).

Scheduling: at most `max_batch_size` sequences are active; each round runs one step of each (prefill, one token, or
one speculative step). Prefix caching (`kv_cache_config.enable_block_reuse`, default on): after a prefill the
prompt's full blocks of `tokens_per_block` tokens are kept with their K/V, keyed by a hash chain over the prefix; a
new prompt reuses the longest chain within its first len - 1 tokens. Per request: reused blocks, missed blocks
(context blocks not found), blocks allocated (total / never used before) and hit rate = reused / (reused + missed).
Speculation (`speculative_config` DraftTarget, NGram or Eagle): greedy requests only, while the number of active
requests is at most `max_concurrency` (when set): the draft model (DraftTarget), the tokens that followed an earlier
occurrence of the sequence's last up-to-`max_matching_ngram_size` tokens (NGram, `NGramPool`), or an EAGLE-3 head's
linear chain over the target's captured hidden states (Eagle, `Eagle3Head`) propose up to `max_draft_len` tokens;
the target verifies them in one forward pass and keeps the agreeing prefix plus its own next token, so the output is
the target's own greedy output. An EAGLE-3 head's context starts where the target ran for the request (after the
prompt blocks reused from the prefix cache, whose hidden states are not kept).
"""

import collections
import dataclasses
import glob
import json
import math
import os
import threading
import time

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

_DROPPED = (".input_scale", ".k_scale", ".v_scale", ".k_bias", ".v_bias", "_amax")
FP8_MAX = 448.0


# ------------------------------------------------------------------------------------------------ loading
def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[out/2, in] uint8 (low nibble = row 2i, high = row 2i+1) -> [out, in] signed int values as float."""
    p = packed.to(torch.int16)
    low, high = p & 0x0F, (p >> 4) & 0x0F
    vals = torch.stack([low, high], dim=1).reshape(-1, packed.shape[1])
    return torch.where(vals >= 8, vals - 16, vals).float()


def dequantize(name: str, weight: torch.Tensor, tensors: dict) -> torch.Tensor:
    """The float weight `name` stands for: quantized values x their scales (and any pre_quant_scale folded in)."""
    base = name[: -len("weight")]
    scale = tensors.get(base + "weight_scale")
    scale_2 = tensors.get(base + "weight_scale_2")
    if weight.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8) and scale is None:
        raise ValueError(f"{name}: quantized weight without weight_scale")
    if weight.dtype == torch.float8_e4m3fn or weight.dtype == torch.int8:
        s = scale.float()
        w = weight.float() * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))
    elif weight.dtype == torch.uint8:
        if scale.dtype == torch.float8_e4m3fn:
            raise ValueError(f"{name}: FP4 block weights (NVFP4) are not supported by the reference backend")
        w = _unpack_int4(weight)
        w = w * scale.float().repeat_interleave(w.shape[1] // scale.shape[1], dim=1)
        if scale_2 is not None:  # W4A8: the per-group scales are themselves FP8 multiples of weight_scale_2
            s2 = scale_2.float()
            w = (w / s2).to(torch.float8_e4m3fn).float() * s2
    else:
        w = weight.float()
    pre = tensors.get(base + "pre_quant_scale")
    if pre is not None and base + "input_scale" not in tensors:  # y = (x * s) W^T = x (W * s)^T
        w = w * pre.float().reshape(1, -1)  # (with an input_scale, the activation hook applies it before FP8)
    return w


def _read_tensors(path: str) -> dict:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"{path} holds no *.safetensors")
    tensors = {}
    for f in files:
        with safe_open(f, framework="pt") as st:
            for key in st.keys():
                tensors[key] = st.get_tensor(key)
    return tensors


def load_model(path: str, dtype: torch.dtype):
    """The checkpoint at `path` as a transformers causal LM in `dtype` (eval mode), weights dequantized."""
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    tensors = _read_tensors(path)
    state = {}
    for key, value in tensors.items():
        if key.endswith(_DROPPED) or key.endswith(("weight_scale", "weight_scale_2", "pre_quant_scale")):
            continue
        state[key] = (dequantize(key, value, tensors) if key.endswith("weight") else value.float()).to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint does not match {type(model).__name__} "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if tied:
        model.tie_weights()
    _fp8_activation_hooks(model, tensors)
    return model.eval()


def _fp8_activation_hooks(model, tensors: dict) -> None:
    """Round the input of every linear that has an `input_scale` to FP8 (E4M3) multiples of that scale, after its
    AWQ `pre_quant_scale` (which the scale was calibrated on)."""
    modules = dict(model.named_modules())
    for key, scale in tensors.items():
        name = key[: -len(".input_scale")]
        if not key.endswith(".input_scale") or name not in modules:
            continue
        s = scale.float().reshape(())
        pre = tensors.get(name + ".pre_quant_scale")
        pre = pre.float() if pre is not None else None

        def hook(_module, args, s=s, pre=pre):
            x = args[0].float() if pre is None else args[0].float() * pre
            q = (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s
            return (q.to(args[0].dtype), *args[1:])

        modules[key[: -len(".input_scale")]].register_forward_pre_hook(hook)


# ------------------------------------------------------------------------------------------------ prefix cache
class PrefixCache:
    """Blocks of `tokens_per_block` prompt tokens with their per-layer K/V, keyed by a hash chain; LRU eviction."""

    def __init__(self, tokens_per_block: int, capacity: int, enabled: bool):
        self.tpb, self.capacity, self.enabled = tokens_per_block, max(1, capacity), enabled
        self.blocks = collections.OrderedDict()  # chain key -> [(k, v) per layer]
        self.slots_used = 0  # slots that ever held a block (a new block beyond it takes a never-used slot)

    def _keys(self, ids):
        keys, key = [], None
        for i in range(len(ids) // self.tpb):
            key = hash((key, tuple(ids[i * self.tpb:(i + 1) * self.tpb])))
            keys.append(key)
        return keys

    def lookup(self, ids):
        """(reused K/V blocks, per-request KV metrics) for a prompt `ids`."""
        found = []
        if self.enabled:
            for key in self._keys(ids[:-1]):
                if key not in self.blocks:
                    break
                self.blocks.move_to_end(key)
                found.append(self.blocks[key])
        context_blocks = math.ceil(len(ids) / self.tpb)
        reused = len(found)
        missed = context_blocks - reused
        new = min(missed, max(0, self.capacity - self.slots_used))
        self.slots_used += new
        metrics = {"reused_blocks": reused, "missed_blocks": missed, "alloc_total_blocks": missed,
                   "alloc_new_blocks": new, "kv_cache_hit_rate": reused / context_blocks if context_blocks else 0.0}
        return found, metrics

    def store(self, ids, legacy_past):
        """Keep the full blocks of `ids` whose K/V `legacy_past` ((k, v) per layer) holds."""
        if not self.enabled:
            return
        for i, key in enumerate(self._keys(ids)):
            if key in self.blocks:
                continue
            lo, hi = i * self.tpb, (i + 1) * self.tpb
            self.blocks[key] = [(k[:, :, lo:hi].clone(), v[:, :, lo:hi].clone()) for k, v in legacy_past]
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)

    @staticmethod
    def as_cache(blocks):
        layers = zip(*blocks)
        return DynamicCache(ddp_cache_data=[(torch.cat([k for k, _ in layer], dim=2),
                                             torch.cat([v for _, v in layer], dim=2)) for layer in layers])


# ------------------------------------------------------------------------------------------------ sequences
class Sequence:
    """One request's state: tokens, caches, sampling, metrics."""

    def __init__(self, handle, prompt_ids, sampling, eos_id):
        self.handle, self.prompt = handle, list(prompt_ids)
        self.tokens = list(prompt_ids)
        self.sampling = sampling
        self.eos_id = eos_id
        self.max_tokens = int(sampling.get("max_tokens") or 32)
        self.cache = None  # target DynamicCache holding tokens[:-1] once prefilled
        self.draft_cache, self.draft_len = None, 0
        self.head_state = None  # EAGLE-3: HeadState once prefilled
        self.logprob = 0.0
        self.finish_reason = None
        self.stop_reason = None
        self.cancelled = False
        seed = sampling.get("seed")
        self.generator = torch.Generator().manual_seed(int(seed) if seed is not None else 0)
        self.perf = {"arrival_time_ns": time.monotonic_ns(), "total_draft_tokens": 0,
                     "total_accepted_draft_tokens": 0, "acceptance_rate": 0.0}

    @property
    def generated(self):
        return self.tokens[len(self.prompt):]

    @property
    def greedy(self):
        s = self.sampling
        if s.get("temperature") == 0 or s.get("top_k") == 1:
            return True
        return s.get("temperature") is None and s.get("top_k") is None and s.get("top_p") is None


def _penalize(logits, seq):
    s = seq.sampling
    if not seq.generated or not (s.get("presence_penalty") or s.get("frequency_penalty")):
        return logits
    ids = torch.tensor(seq.generated)
    counts = torch.zeros_like(logits).scatter_add_(0, ids, torch.ones(len(ids), dtype=logits.dtype))
    logits = logits - float(s.get("frequency_penalty") or 0) * counts
    return logits - float(s.get("presence_penalty") or 0) * (counts > 0).to(logits.dtype)


def choose(logits, seq) -> int:
    """Next token of `seq` from the last position's logits (greedy or temperature / top-k / top-p sampling)."""
    logits = _penalize(logits.float(), seq)
    logprobs = torch.log_softmax(logits, dim=-1)
    if seq.greedy:
        token = int(torch.argmax(logits))
    else:
        s = seq.sampling
        scaled = logits / max(float(s.get("temperature") or 1.0), 1e-5)
        top_k = int(s.get("top_k") or 0)
        if top_k > 0:
            kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        top_p = s.get("top_p")
        if top_p is not None and 0 < float(top_p) < 1:
            probs, order = torch.sort(torch.softmax(scaled, dim=-1), descending=True)
            drop = probs.cumsum(0) - probs > float(top_p)
            scaled[order[drop]] = float("-inf")
        token = int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=seq.generator))
    seq.logprob += float(logprobs[token])
    return token


# ------------------------------------------------------------------------------------------------ engine
@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The LLM arguments the engine honours (model.yaml; `tokens_per_block` from config.pbtxt).

    `block_reuse`: prefix caching (`kv_cache_config.enable_block_reuse`); `max_draft_len`, `max_concurrency`: the
    speculation's (`speculative_config`; 0 draft tokens: no speculation).
    """

    max_batch_size: int
    max_seq_len: int
    tokens_per_block: int
    block_reuse: bool
    max_draft_len: int = 0
    max_concurrency: int | None = None
    max_matching_ngram_size: int = 0  # NGram speculation (no draft model) when > 0


class NGramPool:
    """Prompt-lookup drafting as TensorRT-LLM's PyTorch NGram drafter does it with its defaults (every continuation
    kept, the oldest proposed, one pool for all requests): each run of up to `n` tokens seen so far maps to the
    up-to-`k` tokens that followed it; a step proposes what followed the longest run that ends the sequence now.
    At most `MAX_RUNS` runs are kept (the oldest go first)."""

    MAX_RUNS = 1 << 16

    def __init__(self, k, n):
        self.k, self.n = k, n
        self.follow = {}  # run of tokens -> continuations, oldest first, each as long as any seen after the run
        self.indexed = {}  # id(sequence) -> first position whose runs may still change

    def propose(self, seq, limit):
        """Up to `limit` draft tokens for `seq`, after indexing the runs of its tokens not indexed yet."""
        tokens = seq.tokens
        if limit <= 0 or len(tokens) < 2:
            return []
        start = self.indexed.get(id(seq), 0)
        for size in range(min(self.n, len(tokens) - 1), 0, -1):
            for i in range(start, len(tokens) - size):
                run, after = tuple(tokens[i:i + size]), tuple(tokens[i + size:i + size + self.k])
                known = self.follow.get(run)
                if not known or len(after) > len(known[0]):
                    self.follow.pop(run, None)
                    self.follow[run] = [after]
                elif len(after) == len(known[0]) and after not in known:
                    known.append(after)
        while len(self.follow) > self.MAX_RUNS:
            del self.follow[next(iter(self.follow))]
        # a continuation shorter than k may still grow: index again from where one could
        self.indexed[id(seq)] = max(0, len(tokens) - (self.k + self.n - 1))
        for size in range(min(self.n, len(tokens) - 1), 0, -1):
            known = self.follow.get(tuple(tokens[-size:]))
            if known:
                return list(known[0][:limit])
        return []

    def forget(self, seq):
        self.indexed.pop(id(seq), None)


# ------------------------------------------------------------------------------------------------ EAGLE-3
def _rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x, positions, head_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.double()[:, None] * inv
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
    half = head_dim // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class HeadState:
    """One sequence's EAGLE-3 context: its target features fused by fc (positions `start`.. of those the target
    has run) and the head's K/V of the entries already fed (position p: fused features of p, embedding of p + 1)."""

    def __init__(self, start):
        self.start, self.fed = start, 0
        self.pending = []  # fused feature rows not fed to the head yet
        self.k = self.v = None  # [kv heads, entries, head_dim]


class Eagle3Head:
    """An EAGLE-3 head as TensorRT-LLM 1.2's `Eagle3ForCausalLM` runs it on the PyTorch backend: one decoder layer
    reading concat(input_layernorm(embedding of the newest token), hidden_norm(hidden)) (2H), `norm`, `lm_head` over
    the draft vocabulary, draft ids mapped to target ids by `d2t`. The first draft's hidden is fc(the target's
    outputs of the captured layers at the last position the target has run); each further draft of the linear chain
    reads the head's own output hidden state (before `norm`). Embeddings are the target's (the head's own only when
    its `target_hidden_size` differs); `lm_head` is the target's when the head has none.
    """

    def __init__(self, config, tensors, target, layers, dtype):
        self.layers = list(layers)
        self.h, self.heads = config["hidden_size"], config["num_attention_heads"]
        self.kv = config.get("num_key_value_heads") or self.heads
        self.hd = config.get("head_dim") or self.h // self.heads
        self.eps, self.theta = float(config.get("rms_norm_eps", 1e-6)), float(config.get("rope_theta", 10000.0))
        w = {k.removeprefix("model."): v for k, v in tensors.items()}

        def get(name, shape):
            if name not in w:
                raise ValueError(f"the EAGLE-3 head has no {name}")
            if tuple(w[name].shape) != tuple(shape):
                raise ValueError(f"the EAGLE-3 head's {name} is {list(w[name].shape)}, expected {list(shape)}")
            return w[name].to(dtype)

        th = target.config.hidden_size
        vocab, draft_vocab = target.config.vocab_size, int(config["draft_vocab_size"])
        n = len(self.layers)
        if n > 1 or "fc.weight" in w:
            fc = w.get("fc.weight")
            if fc is not None and tuple(fc.shape) != (self.h, n * th):
                raise ValueError(f"the EAGLE-3 head's fc.weight is {list(fc.shape)}, but {n} captured layers of "
                                 f"hidden size {th} give [{self.h}, {n * th}]: set eagle3_layers_to_capture to the "
                                 "layers the head was trained on")
            self.fc = get("fc.weight", (self.h, n * th))
        else:
            self.fc = None
        m = "midlayer."
        self.w_in, self.w_hid = get(m + "input_layernorm.weight", (self.h,)), get(m + "hidden_norm.weight", (self.h,))
        self.w_post, self.w_norm = get(m + "post_attention_layernorm.weight", (self.h,)), get("norm.weight", (self.h,))
        q, kvd = self.heads * self.hd, self.kv * self.hd
        a = m + "self_attn."
        self.wq, self.wk = get(a + "q_proj.weight", (q, 2 * self.h)), get(a + "k_proj.weight", (kvd, 2 * self.h))
        self.wv, self.wo = get(a + "v_proj.weight", (kvd, 2 * self.h)), get(a + "o_proj.weight", (self.h, q))
        inter = config["intermediate_size"]
        self.wg = get(m + "mlp.gate_proj.weight", (inter, self.h))
        self.wu = get(m + "mlp.up_proj.weight", (inter, self.h))
        self.wd = get(m + "mlp.down_proj.weight", (self.h, inter))
        if config.get("target_hidden_size", self.h) == self.h and th == self.h:
            self.embed = target.get_input_embeddings().weight.detach().to(dtype)
        else:
            self.embed = get("embed_tokens.weight", (vocab, self.h))
        if "lm_head.weight" in w:
            self.lm_head = get("lm_head.weight", (draft_vocab, self.h))
        elif draft_vocab == vocab:
            self.lm_head = target.get_output_embeddings().weight.detach().to(dtype)
        else:
            raise ValueError(f"the EAGLE-3 head has no lm_head.weight and its draft_vocab_size {draft_vocab} is not "
                             f"the target's vocab_size {vocab} (the target's lm_head cannot stand in)")
        if "d2t" in w:
            if tuple(w["d2t"].shape) != (draft_vocab,):
                raise ValueError(f"the EAGLE-3 head's d2t is {list(w['d2t'].shape)}, expected [{draft_vocab}]")
            self.draft_to_target = torch.arange(draft_vocab) + w["d2t"].long()
        elif draft_vocab == vocab:
            self.draft_to_target = torch.arange(vocab)
        else:
            raise ValueError(f"the EAGLE-3 head has no d2t to map its {draft_vocab} draft ids to the target's {vocab}")
        if int(self.draft_to_target.min()) < 0 or int(self.draft_to_target.max()) >= vocab:
            raise ValueError(f"the EAGLE-3 head's d2t maps draft ids outside the target vocabulary [0, {vocab})")
        self.captured = {}
        for i in self.layers:
            target.model.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, i):
        def keep(_module, _args, output):
            self.captured[i] = output[0] if isinstance(output, tuple) else output
        return keep

    def record(self, seq, rows):
        """After a target forward over `seq`: keep the fused features of its first `rows` positions."""
        feats = torch.cat([self.captured[i][0, :rows] for i in self.layers], dim=-1).to(self.w_in.dtype)
        seq.head_state.pending.append(feats @ self.fc.T if self.fc is not None else feats)

    def _layer(self, state, embeds, hidden, first):
        """Feed entries at positions first.. (head K/V appended to `state`); returns their output hidden states."""
        t = embeds.shape[0]
        x = torch.cat([_rms(embeds, self.w_in, self.eps), _rms(hidden, self.w_hid, self.eps)], dim=-1)
        pos = torch.arange(first, first + t)
        q = _rotate((x @ self.wq.T).view(t, self.heads, self.hd).transpose(0, 1), pos, self.hd, self.theta)
        k = _rotate((x @ self.wk.T).view(t, self.kv, self.hd).transpose(0, 1), pos, self.hd, self.theta)
        v = (x @ self.wv.T).view(t, self.kv, self.hd).transpose(0, 1)
        state.k = k if state.k is None else torch.cat([state.k, k], dim=1)
        state.v = v if state.v is None else torch.cat([state.v, v], dim=1)
        rep = self.heads // self.kv
        keys, values = state.k.repeat_interleave(rep, 0), state.v.repeat_interleave(rep, 0)
        s = q @ keys.transpose(1, 2) / math.sqrt(self.hd)
        before = keys.shape[1] - t
        visible = torch.arange(keys.shape[1])[None, :] <= before + torch.arange(t)[:, None]
        a = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) @ values
        out = hidden + a.transpose(0, 1).reshape(t, -1) @ self.wo.T
        y = _rms(out, self.w_post, self.eps)
        return out + (torch.nn.functional.silu(y @ self.wg.T) * (y @ self.wu.T)) @ self.wd.T

    def _draft(self, out):
        return int(self.draft_to_target[int(torch.argmax(_rms(out, self.w_norm, self.eps) @ self.lm_head.T))])

    def propose(self, seq, k):
        """A linear chain of `k` draft tokens after `seq.tokens` (target ids)."""
        state, tokens = seq.head_state, seq.tokens
        first = state.start + state.fed
        hidden = torch.cat(state.pending)
        state.pending, state.fed = [], state.fed + hidden.shape[0]
        embeds = self.embed[torch.tensor(tokens[first + 1:first + 1 + hidden.shape[0]])]
        with torch.no_grad():
            out = self._layer(state, embeds, hidden, first)[-1:]
            proposal = [self._draft(out)]
            for j in range(1, k):
                out = self._layer(state, self.embed[proposal[-1:]], out, first + hidden.shape[0] - 1 + j)
                proposal.append(self._draft(out))
        state.k, state.v = state.k[:, :state.fed], state.v[:, :state.fed]  # drop the chain's entries
        return proposal


def load_eagle3(spec, target, dtype, resolve=os.path.abspath):
    """The EAGLE-3 head a `speculative_config` (`decoding_type: Eagle`) names, checked as TensorRT-LLM 1.2 checks
    it; `resolve` turns its directory into a path. Raises ValueError (one line) on a config it would refuse."""
    where = "speculative_config (Eagle)"
    name = spec.get("speculative_model") or spec.get("speculative_model_dir")
    if not name:
        raise ValueError(f"{where}: EAGLE3 draft model must be specified: set speculative_model (or "
                         "speculative_model_dir) to the EAGLE-3 head's directory")
    if not spec.get("max_draft_len") or int(spec["max_draft_len"]) <= 0:
        raise ValueError(f"{where}: max_draft_len is required for Eagle (a positive number of draft tokens)")
    if not isinstance(spec.get("eagle3_one_model", True), bool):
        raise ValueError(f"{where}: eagle3_one_model must be true or false")
    path = resolve(str(name))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{where}: {path} holds no config.json; point speculative_model at the EAGLE-3 head")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if not config.get("draft_vocab_size"):
        raise ValueError(f"{where}: {path}/config.json has no draft_vocab_size, so it is not an EAGLE-3 head "
                         "(TensorRT-LLM would load it as a plain model); use an EAGLE-3 head or DraftTarget")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{where}: {path} has {config['num_hidden_layers']} decoder layers; the reference backend "
                         "runs EAGLE-3 heads of one layer")
    n_layers = target.config.num_hidden_layers
    layers = spec.get("eagle3_layers_to_capture")
    if layers is None:
        if n_layers <= 5:
            raise ValueError(f"{where}: Not enough hidden layers for default EAGLE3 capture (the target has "
                             f"{n_layers}); set eagle3_layers_to_capture to the layers the head was trained on")
        layers = (1, n_layers // 2 - 1, n_layers - 4)
    layers = sorted(set(int(i) for i in layers))
    if not layers or layers[0] < 0 or layers[-1] >= n_layers:
        raise ValueError(f"{where}: eagle3_layers_to_capture {layers} must name layers of the target "
                         f"(0..{n_layers - 1})")
    return Eagle3Head(config, _read_tensors(path), target, layers, dtype)


class Engine:
    """In-flight generation on CPU for the reference model; `on_step(seq, final)` is called after each step."""

    def __init__(self, model, tokenizer, settings, *, draft=None, eagle=None, on_step=None):
        self.model, self.tokenizer, self.draft, self.eagle = model, tokenizer, draft, eagle
        self.max_batch_size, self.max_seq_len = max(1, settings.max_batch_size), settings.max_seq_len
        self.k, self.max_concurrency = settings.max_draft_len, settings.max_concurrency
        n = settings.max_matching_ngram_size
        self.ngram = NGramPool(self.k, n) if draft is None and eagle is None and n > 0 and self.k > 0 else None
        capacity = self.max_batch_size * math.ceil(settings.max_seq_len / settings.tokens_per_block)
        self.prefix = PrefixCache(settings.tokens_per_block, capacity, settings.block_reuse)
        self.on_step = on_step
        self.waiting, self.active = collections.deque(), []
        self.cv = threading.Condition()
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, seq):
        if len(seq.prompt) + seq.max_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({len(seq.prompt)} tokens) + max_tokens ({seq.max_tokens}) exceeds "
                             f"max_seq_len {self.max_seq_len}")
        with self.cv:
            self.waiting.append(seq)
            self.cv.notify()

    def shutdown(self):
        with self.cv:
            self.running = False
            self.cv.notify()
        self.thread.join(timeout=10)

    def _loop(self):
        while True:
            with self.cv:
                while self.running and not self.waiting and not self.active:
                    self.cv.wait(0.05)
                if not self.running:
                    return
                while self.waiting and len(self.active) < self.max_batch_size:
                    self.active.append(self.waiting.popleft())
                batch = list(self.active)
            for seq in batch:
                try:
                    done = self._step(seq)
                except Exception as exc:  # one failing request never stops the others
                    seq.finish_reason, seq.stop_reason, done = "error", str(exc), True
                self.on_step(seq, done)
                if done:
                    if self.ngram is not None:
                        self.ngram.forget(seq)
                    with self.cv:
                        self.active.remove(seq)

    def _forward(self, model, ids, cache):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids], dtype=torch.long), past_key_values=cache, use_cache=True)
        return out.logits[0], out.past_key_values

    def _step(self, seq) -> bool:
        if seq.cancelled:
            seq.finish_reason = "cancelled"
            return True
        if seq.cache is None:
            return self._prefill(seq)
        drafter = self.draft is not None or self.ngram is not None or self.eagle is not None
        speculate = (drafter and self.k > 0 and seq.greedy
                     and (self.max_concurrency is None or len(self.active) <= self.max_concurrency))
        if speculate:
            return self._speculate(seq)
        logits, seq.cache = self._forward(self.model, seq.tokens[-1:], seq.cache)
        if self.eagle is not None:
            self.eagle.record(seq, 1)
        return self._append(seq, [choose(logits[-1], seq)])

    def _prefill(self, seq) -> bool:
        seq.perf["first_scheduled_time_ns"] = time.monotonic_ns()
        blocks, metrics = self.prefix.lookup(seq.prompt)
        seq.perf.update(metrics)
        start = len(blocks) * self.prefix.tpb
        cache = PrefixCache.as_cache(blocks) if blocks else DynamicCache()
        logits, cache = self._forward(self.model, seq.prompt[start:], cache)
        if self.eagle is not None:  # the head's context starts where the target ran (after reused blocks)
            seq.head_state = HeadState(start)
            self.eagle.record(seq, len(seq.prompt) - start)
        self.prefix.store(seq.prompt, cache.to_legacy_cache())
        seq.cache = cache
        return self._append(seq, [choose(logits[-1], seq)])

    def _draft_model_proposal(self, seq):
        if seq.draft_cache is None:
            seq.draft_cache, seq.draft_len = DynamicCache(), 0
        proposal, feed = [], seq.tokens[seq.draft_len:]
        for _ in range(self.k):
            logits, seq.draft_cache = self._forward(self.draft, feed, seq.draft_cache)
            proposal.append(int(torch.argmax(logits[-1])))
            feed = proposal[-1:]
        return proposal

    def _speculate(self, seq) -> bool:
        if self.draft is not None:
            proposal = self._draft_model_proposal(seq)
        elif self.eagle is not None:
            proposal = self.eagle.propose(seq, self.k)
        else:  # n-gram: never past the request's last token (upstream drafts within the sequence's length)
            proposal = self.ngram.propose(seq, min(self.k, seq.max_tokens - len(seq.generated) - 1))
            if not proposal:
                logits, seq.cache = self._forward(self.model, seq.tokens[-1:], seq.cache)
                return self._append(seq, [choose(logits[-1], seq)])
        n = len(seq.tokens)
        logits, seq.cache = self._forward(self.model, [seq.tokens[-1], *proposal], seq.cache)
        accepted = []
        for i in range(len(proposal) + 1):
            token = choose(logits[i], seq)
            accepted.append(token)
            if i == len(proposal) or token != proposal[i]:
                break
        a = len(accepted) - 1
        seq.cache.crop(n - 1 + len(accepted))
        if self.eagle is not None:
            self.eagle.record(seq, len(accepted))
        if self.draft is not None:
            seq.draft_len = min(seq.draft_cache.get_seq_length(), n + a)
            seq.draft_cache.crop(seq.draft_len)
        seq.perf["total_draft_tokens"] += len(proposal)
        seq.perf["total_accepted_draft_tokens"] += a
        seq.perf["acceptance_rate"] = seq.perf["total_accepted_draft_tokens"] / seq.perf["total_draft_tokens"]
        return self._append(seq, accepted)

    def _append(self, seq, new_tokens) -> bool:
        now = time.monotonic_ns()
        seq.perf.setdefault("first_token_time_ns", now)
        seq.perf["last_token_time_ns"] = now
        for token in new_tokens:
            if token == seq.eos_id:
                seq.finish_reason = "stop"
                return True
            seq.tokens.append(token)
            stop = self._stop_hit(seq)
            if stop is not None:
                seq.finish_reason, seq.stop_reason = "stop", stop
                return True
            if len(seq.generated) >= seq.max_tokens:
                seq.finish_reason = "length"
                return True
        return False

    def _stop_hit(self, seq):
        for stop in seq.sampling.get("stop") or ():
            if stop and stop in self.text(seq):
                return stop
        return None

    def text(self, seq) -> str:
        """The generated text so far (special tokens skipped), cut before a stop string that ended it."""
        text = self.tokenizer.decode(seq.generated, skip_special_tokens=True)
        if seq.stop_reason and isinstance(seq.stop_reason, str) and seq.stop_reason in text:
            text = text[: text.index(seq.stop_reason)]
        return text
