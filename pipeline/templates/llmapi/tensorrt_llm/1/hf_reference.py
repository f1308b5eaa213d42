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
Speculation (`speculative_config` DraftTarget or NGram): greedy requests only, while the number of active requests
is at most `max_concurrency` (when set): the draft model (DraftTarget), or the tokens that followed an earlier
occurrence of the sequence's last up-to-`max_matching_ngram_size` tokens (NGram, `NGramPool`), propose up to
`max_draft_len` tokens; the target verifies them in one forward pass and keeps the agreeing prefix plus its own next
token, so the output is the target's own greedy output.
"""

import collections
import dataclasses
import glob
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
    draft-target speculation's (`speculative_config`; 0 draft tokens: no speculation).
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


class Engine:
    """In-flight generation on CPU for the reference model; `on_step(seq, final)` is called after each step."""

    def __init__(self, model, tokenizer, settings, *, draft=None, on_step=None):
        self.model, self.tokenizer, self.draft = model, tokenizer, draft
        self.max_batch_size, self.max_seq_len = max(1, settings.max_batch_size), settings.max_seq_len
        self.k, self.max_concurrency = settings.max_draft_len, settings.max_concurrency
        n = settings.max_matching_ngram_size
        self.ngram = NGramPool(self.k, n) if draft is None and n > 0 and self.k > 0 else None
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
        speculate = ((self.draft is not None or self.ngram is not None) and self.k > 0 and seq.greedy
                     and (self.max_concurrency is None or len(self.active) <= self.max_concurrency))
        if speculate:
            return self._speculate(seq)
        logits, seq.cache = self._forward(self.model, seq.tokens[-1:], seq.cache)
        return self._append(seq, [choose(logits[-1], seq)])

    def _prefill(self, seq) -> bool:
        seq.perf["first_scheduled_time_ns"] = time.monotonic_ns()
        blocks, metrics = self.prefix.lookup(seq.prompt)
        seq.perf.update(metrics)
        start = len(blocks) * self.prefix.tpb
        cache = PrefixCache.as_cache(blocks) if blocks else DynamicCache()
        logits, cache = self._forward(self.model, seq.prompt[start:], cache)
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
