"""Reference `tensorrt_llm` model (Triton Python backend, CPU): the tensorrtllm backend's tensor contract served by
PyTorch from an HF-format model dir or an exported TensorRT-LLM checkpoint (dequantized by
`pipeline.stages.calibrate.checkpoint.load_checkpoint_as_hf`). Only used for `--target reference` (CPU tests, CI, debugging).

Serving: `execute()` validates each request, registers it and hands it to one scheduler thread, then returns None;
responses go through the request's response sender in decoupled and non-decoupled mode alike. The scheduler
interleaves one token step of every active sequence per round (in-flight, no head-of-line blocking), checks client
cancellation and `stop` requests (same request id) at least every 50 ms, and finishes a cancelled request with the
tokens it has, as the C++ backend does.

Semantics follow the tensorrtllm backend: greedy when top_k == 1 or neither top_k nor top_p is set; `end_id` ends a sequence (not in
the output); stop words end it (included); `min_tokens` bans end_id until reached; bad words are banned;
`embedding_bias` is added to the logits; repetition/presence/frequency penalties, temperature, top-k/top-p (with
top_p_min/decay/reset_ids), `seed`. `streaming` (decoupled only) sends the new tokens as they come;
non-streaming output holds the prompt unless `exclude_input_in_output`. `num_return_sequences` = n independent
samples: one response per sequence with `sequence_index` when decoupled (as the C++ backend sends them), or one
response with the n sequences on the beam axis when not. `beam_width` > 1 is refused per request, as is a
sampling value that is not finite or outside the tensorrtllm backend's bounds, and every count over the build's
ceiling (request_limits.py, shared with preprocessing and the BLS: num_return_sequences <= max_batch_size, word lists,
a finite embedding bias of vocab size, logits size).
`draft_input_ids` (draft-target speculation) are verified in one forward pass: the accepted prefix plus one token.
Limits as configured (`max_input_len`, `max_seq_len`): a longer prompt, prompt + output over the limit, or
request_output_len <= 0 is an error response. Inputs that need another engine (LoRA, prompt tables, multimodal,
encoder-decoder, guided decoding, lookahead, context-phase params, draft logits) are refused per request.

Prefix caching (`enable_kv_cache_reuse`, on unless "false"): a block pool of `max_tokens_in_paged_kv_cache` /
`tokens_per_block` blocks (empty: max_batch_size x ceil(max_seq_len / tokens_per_block)). After a prompt's prefill
its full blocks (`tokens_per_block` tokens each) are stored with their per-layer K/V, keyed by a hash chain over the
token prefix; a finished sequence stores its remaining full blocks. A new prompt reuses the longest chain of stored
blocks within its first len - 1 tokens (at least one token is always computed, as in the C++ KV-cache manager):
the past is rebuilt from the blocks and only the rest of the prompt is run. Blocks are reference-counted while a
sequence uses them; unused ones stay cached and are evicted least-recently-used (leaves first) when a new block
needs a slot. Requests asking for context logits are prefilled in full. Per request, as the C++ backend reports
them for the context phase: `kv_cache_reused_blocks` (blocks reused), `kv_cache_alloc_total_blocks` (context blocks
taken from the pool), `kv_cache_alloc_new_blocks` (those that never held data). Triton's metrics endpoint shows
`nv_trt_llm_kv_cache_block_metrics` (gauge, `kv_cache_block_type` = max | free | used | tokens_per | reused |
fraction, exactly the C++ backend's; reused = blocks reused since load), the KvCacheStats fields the C++ backend
does not export in a family of their own, `nv_trt_llm_reference_kv_cache_metrics` (gauge, same label: alloc_total |
alloc_new | missed (totals since load) | cache_hit_rate (reused / (reused + missed))), and
`nv_trt_llm_context_token_metrics` (gauge, reference backend only, `context_token_type` = computed | reused: prompt
tokens run through the model / served from the cache since load).
The C++ backend's other families come under the same names, kinds and labels (`BackendMetrics`): request counts
per scheduler round, in-flight batcher and general gauges, runtime (CPU) memory, the disaggregated-serving counters
(0), and per finished request the `nv_llm_input_token_len` / `nv_llm_output_token_len` histograms (prompt tokens,
generated tokens of all its sequences) that the Prometheus rules of `invoke deploy` read.
"""

import collections
import copy
import json
import math
import os
import queue
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from request_limits import (
    SAMPLING_BOUNDS,
    Limits,
    RequestError,
    check_bias,
    check_ceilings,
    check_sampling,
    check_word_tokens,
)

# Every exchange with the server from this model's threads (response senders, cancellation polls, custom metrics)
# goes through this lock: Triton 2.51's Python backend can crash the server (boost::interprocess::lock_exception in
# libtriton_python.so) when threads of one model do them concurrently.
_IPC = threading.RLock()

CANCEL_POLL_S = 0.05
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

# Inputs that need an engine feature the reference backend does not have: input -> feature.
UNSUPPORTED = {
    "lora_task_id": "LoRA", "lora_weights": "LoRA", "lora_config": "LoRA",
    "prompt_embedding_table": "prompt tuning",
    "encoder_input_features": "encoder-decoder models", "encoder_output_lengths": "encoder-decoder models",
    "cross_attention_mask": "multimodal cross attention", "skip_cross_attn_blocks": "multimodal cross attention",
    "mrope_rotary_cos_sin": "multimodal mrope", "mrope_position_deltas": "multimodal mrope",
    "guided_decoding_guide_type": "guided decoding", "guided_decoding_guide": "guided decoding",
    "lookahead_window_size": "lookahead decoding", "lookahead_ngram_size": "lookahead decoding",
    "lookahead_verification_set_size": "lookahead decoding",
    "context_phase_params": "disaggregated serving",
    "draft_logits": "draft-logits acceptance",
}


# ------------------------------------------------------------------------------------------------ parsing helpers
def _param(config, key, default=""):
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value == "" or value.startswith("${") else value


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on", "t")


def _get(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _present(arr):
    """A non-empty tensor (an empty string counts as absent, like the C++ backend's unknown guide type)."""
    if arr is None or arr.size == 0:
        return False
    if arr.dtype == np.object_:
        return any(bytes(v) if not isinstance(v, str) else v for v in arr.reshape(-1))
    return True


def _row(arr, b, batch):
    """Row `b` of a batched input (batch dim first), or the whole tensor if it is not batched."""
    if arr is None:
        return None
    if arr.ndim >= 1 and arr.shape[0] == batch:
        return arr[b]
    return arr


def _scalar(arr, b, batch, default=None):
    row = _row(arr, b, batch)
    return default if row is None or row.size == 0 else row.reshape(-1)[0].item()


def word_list(arr):
    """TRT-LLM word list [2, n] (flat ids; end offsets padded with -1) -> list of token sequences; [2, 0] -> []."""
    if arr is None or arr.size == 0:
        return []
    arr = arr.reshape(2, -1)
    ids, offsets = arr[0].tolist(), [o for o in arr[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


def load_model(path, dtype_name):
    """HF-format dir (config.json with `architectures`) or an exported TRT-LLM checkpoint dir."""
    import torch

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if "architectures" in cfg:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    else:
        from pipeline.stages.calibrate.checkpoint import load_checkpoint_as_hf

        model = load_checkpoint_as_hf(path)
    return model.to(getattr(torch, dtype_name)).eval()


# ------------------------------------------------------------------------------------------------ prefix cache
class Block:
    """One stored KV block: its chain key, parent key, tokens and per-layer (K, V) slices."""

    __slots__ = ("key", "parent", "tokens", "kv", "refs")

    def __init__(self, key, parent, tokens, kv):
        self.key, self.parent, self.tokens, self.kv, self.refs = key, parent, tokens, kv, 0


class BlockPool:
    """Block-level prefix cache with the C++ KV-cache manager's accounting, over `capacity` block slots.

    A slot is empty (never used, or released without a key), in use by live sequences (their private blocks and
    the stored blocks they reference), or cached (a stored block no sequence uses: reusable, evictable LRU). A block
    allocated from a never-used slot counts as new (`alloc_new`), as in the C++ block manager.
    Only the scheduler thread calls it.
    """

    def __init__(self, capacity, tokens_per_block, enabled):
        self.capacity, self.tpb, self.enabled = max(1, capacity), tokens_per_block, enabled
        self.blocks = collections.OrderedDict()  # key -> Block, least recently used first
        self.private = 0  # slots held by live sequences outside the cache
        self.fresh = self.capacity  # empty slots that never held data (taken first, as the C++ free queue does)
        self.totals = dict.fromkeys(("reused_blocks", "missed_blocks", "alloc_total_blocks", "alloc_new_blocks",
                                     "context_tokens", "reused_tokens"), 0)
        self.overcommitted = False

    @staticmethod
    def chain(parent, tokens):
        return hash((parent, tokens))

    def _keys(self, tokens, blocks):
        keys, parent = [], None
        for i in range(blocks):
            chunk = tuple(tokens[i * self.tpb:(i + 1) * self.tpb])
            parent = self.chain(parent, chunk)
            keys.append((parent, chunk))
        return keys

    def empty(self):
        """Slots holding no reusable data (every slot is empty, private to a sequence, or a stored block)."""
        return max(0, self.capacity - self.private - len(self.blocks))

    def used(self):
        return self.private + sum(1 for b in self.blocks.values() if b.refs > 0)

    def _touch(self, keys):
        for key in reversed(keys):  # the chain's root ends most recent: leaves are evicted first
            self.blocks.move_to_end(key)

    def _alloc(self):
        """Take one slot: (True when it never held data). Evicts the least recently used cached block if needed."""
        if self.empty() > 0:
            self.private += 1
            new, self.fresh = self.fresh > 0, max(0, self.fresh - 1)
            return new
        for key, block in self.blocks.items():
            if block.refs == 0:
                del self.blocks[key]
                self.private += 1
                return False
        if not self.overcommitted:
            self.overcommitted = True
            pb_utils.Logger.log_warn(f"reference KV pool: all {self.capacity} blocks in use; allocating beyond it "
                                     "(raise max_tokens_in_paged_kv_cache)")
        self.private += 1
        return True

    def acquire(self, holder, tokens, reuse):
        """Context blocks for prompt `tokens`: returns the reused Blocks; records the per-request counts."""
        hit = []
        if self.enabled and reuse:
            parent = None
            for key, chunk in self._keys(tokens, (len(tokens) - 1) // self.tpb):
                block = self.blocks.get(key)
                if block is None or block.parent != parent or block.tokens != chunk:
                    break
                hit.append(block)
                parent = block.key
        for block in hit:
            block.refs += 1
        self._touch([b.key for b in hit])
        holder.keys = [b.key for b in hit]
        need = -(-len(tokens) // self.tpb) - len(hit)
        new = sum(self._alloc() for _ in range(need))
        holder.private = need
        holder.kv_stats = {"reused": len(hit), "alloc_total": need, "alloc_new": new}
        t = self.totals
        t["reused_blocks"] += len(hit)
        t["missed_blocks"] += need
        t["alloc_total_blocks"] += need
        t["alloc_new_blocks"] += new
        t["reused_tokens"] += len(hit) * self.tpb
        t["context_tokens"] += len(tokens) - len(hit) * self.tpb
        return hit

    def grow(self, holder, length):
        """Generation: one more slot whenever the sequence's length enters a new block."""
        if getattr(holder, "keys", None) is None:
            return
        for _ in range(-(-length // self.tpb) - len(holder.keys) - holder.private):
            self._alloc()
            holder.private += 1

    def store(self, holder, tokens, layers):
        """Store the full blocks of `tokens` (per-layer (K, V) covering at least them) that `holder` does not
        reference yet, continuing its chain; a block already stored by another sequence is shared instead."""
        if not self.enabled or getattr(holder, "keys", None) is None:
            return
        full = len(tokens) // self.tpb
        keys = self._keys(tokens, full)
        if [k for k, _ in keys[: len(holder.keys)]] != holder.keys:
            return  # the holder's chain is not a prefix of these tokens
        for i in range(len(holder.keys), full):
            key, chunk = keys[i]
            parent = holder.keys[-1] if holder.keys else None
            block = self.blocks.get(key)
            if block is not None and (block.parent != parent or block.tokens != chunk):
                return  # a hash collision: keep the stored block, stop the chain here
            if holder.private > 0:  # the holder's slot for this block: becomes the stored block, or is freed
                holder.private -= 1
                self.private -= 1
            if block is None:
                a, b = i * self.tpb, (i + 1) * self.tpb
                block = Block(key, parent, chunk, [(k[:, :, a:b].clone(), v[:, :, a:b].clone()) for k, v in layers])
                self.blocks[key] = block
            block.refs += 1
            holder.keys.append(key)
        self._touch(holder.keys)

    def release(self, holder):
        """A finished sequence: its stored blocks stay cached (unreferenced), its private slots become empty."""
        keys = getattr(holder, "keys", None)
        if keys is None:
            return
        for key in keys:
            block = self.blocks.get(key)
            if block is not None:
                block.refs -= 1
        self.private -= holder.private
        holder.keys, holder.private = None, 0
        excess = self.private + len(self.blocks) - self.capacity  # after an overcommit: back within the pool
        for key in [k for k, b in self.blocks.items() if b.refs == 0][:max(0, excess)]:
            del self.blocks[key]

    @staticmethod
    def past(blocks):
        """A DynamicCache holding the concatenated K/V of `blocks`."""
        import torch
        from transformers.cache_utils import DynamicCache

        layers = zip(*(b.kv for b in blocks))
        return DynamicCache(ddp_cache_data=[(torch.cat([k for k, _ in layer], dim=2),
                                             torch.cat([v for _, v in layer], dim=2)) for layer in layers])


def cache_layers(past):
    """Per-layer (K, V) tensors [batch, heads, tokens, dim] of an HF cache."""
    if hasattr(past, "layers"):
        return [(layer.keys, layer.values) for layer in past.layers]
    return [(k, v) for k, v in past.to_legacy_cache()]


class KvCacheMetrics:
    """The block pool on Triton's metrics endpoint; a no-op where metric families cannot be created."""

    CPP_TYPES = ("max", "free", "used", "tokens_per", "reused", "fraction")  # the C++ backend's labels
    STATS_TYPES = ("alloc_total", "alloc_new", "missed", "cache_hit_rate")  # KvCacheStats fields it does not export

    def __init__(self, model, version):
        labels = {"model": model, "version": str(version)}
        self.families, self.block, self.tokens = [], None, None
        try:
            block = pb_utils.MetricFamily(name="nv_trt_llm_kv_cache_block_metrics",
                                          description="TRT LLM KV cache block metrics",
                                          kind=pb_utils.MetricFamily.GAUGE)
            stats = pb_utils.MetricFamily(name="nv_trt_llm_reference_kv_cache_metrics",
                                          description="KV cache statistics the C++ backend does not export "
                                                      "(reference backend)",
                                          kind=pb_utils.MetricFamily.GAUGE)
            tokens = pb_utils.MetricFamily(name="nv_trt_llm_context_token_metrics",
                                           description="prompt tokens run through the model or served from the "
                                                       "prefix cache, since load (reference backend)",
                                           kind=pb_utils.MetricFamily.GAUGE)
        except Exception as exc:  # noqa: BLE001 (metrics disabled or unsupported: serve without them)
            pb_utils.Logger.log_warn(f"{model}: no KV-cache metrics ({exc})")
            return
        self.families = [block, stats, tokens]
        self.block = {t: (block if t in self.CPP_TYPES else stats).Metric(labels=dict(labels, kv_cache_block_type=t))
                      for t in self.CPP_TYPES + self.STATS_TYPES}
        self.tokens = {t: tokens.Metric(labels=dict(labels, context_token_type=t)) for t in ("computed", "reused")}

    def update(self, pool):
        if self.block is None:
            return
        used = pool.used()
        t = pool.totals
        seen = t["reused_blocks"] + t["missed_blocks"]
        values = {"max": pool.capacity, "free": max(0, pool.capacity - used), "used": used,
                  "tokens_per": pool.tpb, "reused": t["reused_blocks"], "fraction": used / pool.capacity,
                  "alloc_total": t["alloc_total_blocks"], "alloc_new": t["alloc_new_blocks"],
                  "missed": t["missed_blocks"], "cache_hit_rate": t["reused_blocks"] / seen if seen else 0.0}
        with _IPC:
            for name, value in values.items():
                self.block[name].set(value)
            self.tokens["computed"].set(t["context_tokens"])
            self.tokens["reused"].set(t["reused_tokens"])

    def close(self):
        self.block = self.tokens = None
        self.families = []


class BackendMetrics:
    """The C++ tensorrtllm backend's other metric families (its custom_metrics_reporter), same names, kinds and labels:
    request counts, runtime memory, in-flight batcher and general gauges, the disaggregated-serving counters and the
    per-request input/output token histograms. Values the reference backend has no counterpart for stay 0 (GPU and
    pinned memory, micro batch id, paused requests, KV-cache transfers). A no-op where families cannot be created."""

    TOKEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]  # the C++ backend's buckets

    def __init__(self, model, version, max_requests):
        self.labels = {"model": model, "version": str(version)}
        self.families, self.gauges, self.tokens = [], {}, {}
        self.iteration = 0
        try:
            self._create(max_requests)
        except Exception as exc:  # noqa: BLE001 (metrics disabled or unsupported: serve without them)
            pb_utils.Logger.log_warn(f"{model}: no request/token metrics ({exc})")
            self.families, self.gauges, self.tokens = [], {}, {}

    def _family(self, name, description, kind):
        family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
        self.families.append(family)
        return family

    def _create(self, max_requests):
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        groups = (("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type",
                   ("active", "max", "scheduled", "context", "waiting"), gauge),
                  ("nv_trt_llm_runtime_memory_metrics", "TRT LLM runtime memory metrics", "memory_type",
                   ("cpu", "gpu", "pinned"), gauge),
                  ("nv_trt_llm_disaggregated_serving_metrics", "TRT LLM disaggregated serving metrics",
                   "disaggregated_serving_type", ("kv_cache_transfer_ms", "request_count"), counter),
                  ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics",
                   "inflight_batcher_specific_metric",
                   ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"), gauge),
                  ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type",
                   ("timestamp", "iteration_counter"), gauge))
        for name, description, label, values, kind in groups:
            family = self._family(name, description, kind)
            for value in values:
                metric = family.Metric(labels=dict(self.labels, **{label: value}))
                if kind == gauge:
                    self.gauges[f"{label}={value}"] = metric
        for name, kind in (("nv_llm_output_token_len", "total_output_tokens"),
                           ("nv_llm_input_token_len", "total_input_tokens")):
            family = self._family(name, "TRT LLM response metrics", pb_utils.MetricFamily.HISTOGRAM)
            self.tokens[kind] = family.Metric(labels=dict(self.labels, response_metric_type=kind),
                                              buckets=self.TOKEN_BUCKETS)
        with _IPC:
            self.gauges["request_type=max"].set(max_requests)

    def iteration_stats(self, *, active, waiting, context, context_tokens):
        """One scheduler round's counts (the C++ backend reports them per iteration)."""
        if not self.gauges:
            return
        self.iteration += 1
        import resource

        values = {"request_type=active": active + waiting, "request_type=scheduled": active,
                  "request_type=context": context, "request_type=waiting": waiting,
                  "inflight_batcher_specific_metric=total_context_tokens": context_tokens,
                  "inflight_batcher_specific_metric=generation_requests": active - context,
                  "general_type=iteration_counter": self.iteration, "general_type=timestamp": time.time_ns() // 1000,
                  "memory_type=cpu": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        with _IPC:
            for key, value in values.items():
                self.gauges[key].set(value)

    def request_done(self, input_tokens, output_tokens):
        """A finished request's prompt and generated tokens (all of its sequences), as the C++ backend observes."""
        if self.tokens:
            with _IPC:
                self.tokens["total_input_tokens"].observe(input_tokens)
                self.tokens["total_output_tokens"].observe(output_tokens)

    def close(self):
        self.gauges, self.tokens = {}, {}
        self.families = []


# ------------------------------------------------------------------------------------------------ request state
class Job:
    """One Triton request: its response sender, flags and the sequences it produces."""

    def __init__(self, request, triton_id, arrival):
        self.request = request
        self.sender = request.get_response_sender()
        self.triton_id = triton_id
        self.arrival = arrival
        self.seqs = []
        self.open = 0  # sequences not finished yet
        self.cancelled = False
        self.closed = False
        self.next_cancel_check = 0.0
        self.lock = threading.Lock()

    def client_cancelled(self, now):
        """Poll the client's cancellation (rate-limited: each poll is an IPC round trip)."""
        if self.sender is None or now < self.next_cancel_check:
            return False
        self.next_cancel_check = now + CANCEL_POLL_S
        try:
            with _IPC:
                return bool(self.sender.is_cancelled() or self.request.is_cancelled())
        except Exception as exc:  # noqa: BLE001 (a sender that cannot be asked is treated as alive)
            pb_utils.Logger.log_warn(f"tensorrt_llm reference: cannot poll cancellation ({exc})")
            self.next_cancel_check = now + 60
            return False

    def send(self, response, final):
        """Send one response; the final one closes and drops the sender (errors after a client cancel are ignored).

        Dropping the sender and request right away releases them in the backend now, not whenever the garbage
        collector reaches this job (a late release during unload can stall the model's shutdown).
        """
        with self.lock:
            if self.closed:
                return
            self.closed = final
            try:
                with _IPC:
                    self.sender.send(response, flags=FINAL if final else 0)
            except Exception as exc:  # noqa: BLE001 (cancelled clients reject late responses)
                pb_utils.Logger.log_warn(f"tensorrt_llm reference: response not delivered ({exc})")
            if final:
                self.sender = self.request = None

    def fail(self, message):
        self.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), True)


class Seq:
    """One output sequence of a job (one batch row x one of num_return_sequences)."""

    def __init__(self, job, opts, batch_index, seq_index, gen):
        self.job, self.opts, self.batch_index, self.seq_index, self.gen = job, opts, batch_index, seq_index, gen
        self.prompt = opts["prompt"]
        self.out, self.logprobs, self.gen_logits = [], [], []
        self.sent = 0  # tokens already streamed
        self.past = None
        self.logits = None  # logits for the next token (after prefill)
        self.context_logits = None
        self.top_p = opts["top_p"]
        self.done = False
        self.scheduled = self.first = self.last = 0
        self.accepted = 0
        self.keys, self.private = None, 0  # prefix-cache blocks referenced / pool slots held (BlockPool)
        self.kv_stats = None  # the row's context-phase block counts


# ------------------------------------------------------------------------------------------------ the model
class TritonPythonModel:
    def initialize(self, args):
        import torch

        # Target and draft stubs share the host's cores with tritonserver and the other python models: half the
        # usable cores each (1 on a 2-core host), one inter-op thread. Oversubscribed, they starve the stubs'
        # 300 ms health thread, and Triton 2.51 fails a request with "Stub process '<model>' is not healthy" when a
        # stub misses its ~1 s health window while the server waits for its response (python_backend r24.10,
        # StubLauncher::ReceiveMessageFromStub; the window is hard-coded).
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, min(4, cores // 2)))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process (parallel work has started)
            pass
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        path = _param(config, "gpt_model_path")
        if not path:
            raise pb_utils.TritonModelException(f"{self.name}: parameter gpt_model_path is empty; set the model dir")
        if not os.path.isabs(path):
            path = os.path.normpath(os.path.join(args["model_repository"], path))
        self.model = load_model(path, _param(config, "reference_dtype", "float32"))
        hf = self.model.config
        self.vocab = int(hf.vocab_size)
        self.max_seq_len = int(_param(config, "max_seq_len", "0") or 0) or int(hf.max_position_embeddings)
        self.max_input_len = int(_param(config, "max_input_len", "0") or 0) or self.max_seq_len - 1
        self.exclude_input = _truthy(_param(config, "exclude_input_in_output", "false"))
        self.tokens_per_block = int(_param(config, "tokens_per_block", "32"))
        self.max_beam_width = int(_param(config, "max_beam_width", "1"))
        self.limits = Limits.from_config(config, vocab_size=self.vocab, max_seq_len=self.max_seq_len,
                                         max_input_len=self.max_input_len, max_beam_width=self.max_beam_width)
        pool_tokens = int(_param(config, "max_tokens_in_paged_kv_cache", "0") or 0)
        per_seq = -(-self.max_seq_len // self.tokens_per_block)
        blocks = pool_tokens // self.tokens_per_block or max(1, int(config.get("max_batch_size", 0) or 1)) * per_seq
        self.pool = BlockPool(blocks, self.tokens_per_block,
                              _truthy(_param(config, "enable_kv_cache_reuse", "true")))
        self.kv_metrics = KvCacheMetrics(self.name, args.get("model_version", "1"))
        self.kv_metrics.update(self.pool)
        self.stats = BackendMetrics(self.name, args.get("model_version", "1"),
                                    max(1, int(config.get("max_batch_size", 0) or 1)))
        self.last_counts = None
        self.incoming = queue.Queue()
        self.jobs_by_id = {}  # triton request id -> set of running jobs (for `stop`)
        self.jobs_lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._loop, name=f"{self.name}-scheduler", daemon=True)
        self.thread.start()

    def finalize(self):
        self.running = False
        self.incoming.put(None)
        self.thread.join(timeout=10)
        self.kv_metrics.close()
        self.stats.close()

    # -------------------------------------------------------------------------------------------- execute
    def execute(self, requests):
        now = time.time_ns()
        for request in requests:
            job = Job(request, request.request_id() or "", now)
            try:
                if _scalar(_get(request, "stop"), 0, 1, False):
                    self._stop(job)
                    continue
                self._prepare(job)
            except RequestError as exc:
                job.fail(f"{self.name}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 (one bad request must not fail the others)
                job.fail(f"{self.name}: {type(exc).__name__}: {exc}")
                continue
            if job.triton_id:
                with self.jobs_lock:
                    self.jobs_by_id.setdefault(job.triton_id, set()).add(job)
            self.incoming.put(job)
        return None

    def _stop(self, job):
        """`stop` = true: cancel the running request(s) with this request id; answer with an empty response."""
        if not job.triton_id:
            raise RequestError("stop needs the request id of the request to cancel; send it as the request id")
        with self.jobs_lock:
            for running in self.jobs_by_id.get(job.triton_id, ()):
                running.cancelled = True
        job.send(pb_utils.InferenceResponse(output_tensors=[]), True)

    def _prepare(self, job):
        """Validate a request and create its sequences (raises RequestError with a one-line reason)."""
        request = job.request
        for name, feature in UNSUPPORTED.items():
            if _present(_get(request, name)):
                raise RequestError(f"input '{name}' ({feature}) is not supported by the reference backend; "
                                   "serve the model with the tensorrtllm backend (--target trtllm)")
        ids = _get(request, "input_ids")
        if ids is None or ids.size == 0:
            raise RequestError("input_ids is not present in the request; send the prompt token ids")
        out_len = _get(request, "request_output_len")
        if out_len is None or out_len.size == 0:
            raise RequestError("request_output_len is not present in the request; send the number of new tokens")
        ids = ids.reshape(1, -1) if ids.ndim == 1 else ids
        batch = ids.shape[0]
        if batch > 1 and not self.decoupled:
            raise RequestError(f"batch size {batch} > 1 needs a decoupled model; send one prompt per request")
        streaming = bool(_scalar(_get(request, "streaming"), 0, batch, False))
        if streaming and not self.decoupled:
            raise RequestError("streaming is only supported if the model is decoupled; send streaming=false")
        inputs = {name: _get(request, name) for name in (
            "input_lengths", "draft_input_ids", "end_id", "stop_words_list", "bad_words_list", "embedding_bias",
            "beam_width", "temperature", "runtime_top_k", "runtime_top_p", "runtime_top_p_min",
            "runtime_top_p_decay", "runtime_top_p_reset_ids", "repetition_penalty", "min_tokens",
            "presence_penalty", "frequency_penalty", "seed", "return_log_probs", "return_context_logits",
            "return_generation_logits", "return_perf_metrics", "return_num_input_tokens",
            "return_num_output_tokens", "exclude_input_in_output", "num_return_sequences", "len_penalty",
            "beam_search_diversity_rate")}
        inputs["request_output_len"] = out_len
        import torch

        for b in range(batch):
            opts = self._options(ids[b], inputs, b, batch, streaming)
            for s in range(opts["n"]):
                gen = torch.Generator().manual_seed((opts["seed"] + s) % 2**64)
                job.seqs.append(Seq(job, opts, b if batch > 1 else None, s, gen))
        job.open = len(job.seqs)

    def _options(self, row_ids, inputs, b, batch, streaming):
        """Per-row request options, validated against the model's limits."""
        def scalar(name, default):
            return _scalar(inputs[name], b, batch, default)

        length = int(scalar("input_lengths", row_ids.size))
        prompt = [int(t) for t in row_ids.reshape(-1)[:length]]
        max_new = int(scalar("request_output_len", 0))
        if not prompt:
            raise RequestError("input_ids is empty; send at least one prompt token")
        if len(prompt) > self.max_input_len:
            raise RequestError(f"prompt length ({len(prompt)}) exceeds maximum input length ({self.max_input_len}); "
                               "shorten the prompt")
        if max_new <= 0:
            raise RequestError(f"request_output_len must be > 0, got {max_new}; ask for at least one token")
        if len(prompt) + max_new > self.max_seq_len:
            raise RequestError(f"prompt length + request_output_len ({len(prompt)} + {max_new}) exceeds maximum "
                               f"sequence length ({self.max_seq_len}); lower request_output_len")
        if any(t < 0 or t >= self.vocab for t in prompt):
            raise RequestError(f"input_ids hold a token id outside the vocabulary [0, {self.vocab}); "
                               "tokenize with the model's tokenizer")
        check_sampling({name: scalar(name, None) for name in SAMPLING_BOUNDS})
        beam = int(scalar("beam_width", 1) or 1)
        if beam != 1:
            raise RequestError(f"beam_width {beam} is not supported by the reference backend (max_beam_width 1); "
                               "send beam_width 1 or use num_return_sequences")
        n = int(scalar("num_return_sequences", 1) or 1)
        check_ceilings(self.limits, beam_width=beam, num_return_sequences=n, request_output_len=max_new,
                       input_len=len(prompt), min_tokens=scalar("min_tokens", None),
                       logits=bool(scalar("return_generation_logits", False) or scalar("return_context_logits", False)))
        for name in ("stop_words_list", "bad_words_list"):
            row = _row(inputs[name], b, batch)
            if row is not None:
                check_word_tokens(name, row.size // 2, self.limits)
        draft_row = _row(inputs["draft_input_ids"], b, batch)
        draft = [int(t) for t in draft_row.reshape(-1)] if draft_row is not None else []
        bias_row = _row(inputs["embedding_bias"], b, batch)
        bias = None
        if bias_row is not None and bias_row.size:
            check_bias("embedding_bias", bias_row.reshape(-1).tolist(), self.limits, exact=True)
            bias = torch_tensor(bias_row.reshape(-1))
        exclude = scalar("exclude_input_in_output", None)
        end_id = scalar("end_id", None)
        return {
            "prompt": prompt,
            "max_new": max_new,
            "n": n,
            "draft": draft,
            "streaming": streaming,
            "exclude": self.exclude_input if exclude is None else bool(exclude),
            "end_id": -1 if end_id is None else int(end_id),
            "top_k": int(scalar("runtime_top_k", 0) or 0),
            "top_p": float(scalar("runtime_top_p", 0.0) or 0.0),
            "top_p_min": float(scalar("runtime_top_p_min", 0.0) or 0.0),
            "top_p_decay": float(scalar("runtime_top_p_decay", 1.0) or 1.0),
            "top_p_reset": scalar("runtime_top_p_reset_ids", None),
            "temperature": float(scalar("temperature", 1.0) or 1.0),
            "seed": int(scalar("seed", 0) or 0),
            "min_tokens": int(scalar("min_tokens", 0) or 0),
            "repetition_penalty": float(scalar("repetition_penalty", 1.0) or 1.0),
            "presence_penalty": float(scalar("presence_penalty", 0.0) or 0.0),
            "frequency_penalty": float(scalar("frequency_penalty", 0.0) or 0.0),
            "stop_words": word_list(_row(inputs["stop_words_list"], b, batch)),
            "bad_words": word_list(_row(inputs["bad_words_list"], b, batch)),
            "bias": bias,
            "log_probs": bool(scalar("return_log_probs", False)),
            "context_logits": bool(scalar("return_context_logits", False)),
            "generation_logits": bool(scalar("return_generation_logits", False)),
            "perf": bool(scalar("return_perf_metrics", False)),
            "num_input_tokens": bool(scalar("return_num_input_tokens", False)),
            "num_output_tokens": bool(scalar("return_num_output_tokens", False)),
        }

    # -------------------------------------------------------------------------------------------- scheduler
    def _loop(self):
        """Round-robin one token step over every active sequence; new requests join between rounds."""
        active = []
        while self.running:
            try:
                self._admit(active, block=not active)
                self._report_round(active)
                now = time.monotonic()
                for seq in list(active):
                    job = seq.job
                    if not job.cancelled and job.client_cancelled(now):
                        job.cancelled = True
                    if job.cancelled:
                        self._finish(seq, cancelled=True)
                    elif not job.closed:
                        self._step_guarded(seq)
                    if seq.done or job.closed:
                        seq.done = True
                        active.remove(seq)
                        if seq.keys is not None:  # a failed request's blocks go back to the pool
                            self.pool.release(seq)
                            self.kv_metrics.update(self.pool)
                        if job.closed or job.open == 0:
                            self._forget(job)
            except Exception as exc:  # noqa: BLE001 (the scheduler must survive anything)
                pb_utils.Logger.log_error(f"{self.name} scheduler: {type(exc).__name__}: {exc}")
        pending = [seq.job for seq in active]
        while not self.incoming.empty():
            pending.append(self.incoming.get_nowait())
        for job in pending:
            if job is not None:
                job.fail(f"{self.name}: the model is unloading; retry the request")

    def _admit(self, active, block):
        try:
            job = self.incoming.get(timeout=0.5) if block else self.incoming.get_nowait()
        except queue.Empty:
            return
        while job is not None:
            scheduled = time.time_ns()
            for seq in job.seqs:
                seq.scheduled = scheduled
            active.extend(job.seqs)
            try:
                job = self.incoming.get_nowait()
            except queue.Empty:
                return

    def _report_round(self, active):
        """The round's request counts on the metrics endpoint, when they changed (each update is an IPC call)."""
        prefill = [seq for seq in active if seq.logits is None and not seq.done]
        counts = (len(active), self.incoming.qsize(), len(prefill))
        if counts != self.last_counts:
            self.last_counts = counts
            self.stats.iteration_stats(active=counts[0], waiting=counts[1], context=counts[2],
                                       context_tokens=sum(len(seq.prompt) for seq in prefill))

    def _forget(self, job):
        with self.jobs_lock:
            jobs = self.jobs_by_id.get(job.triton_id)
            if jobs is not None:
                jobs.discard(job)
                if not jobs:
                    del self.jobs_by_id[job.triton_id]

    def _step_guarded(self, seq):
        try:
            self._step(seq)
        except Exception as exc:  # noqa: BLE001 (fail this request, keep serving the others)
            seq.job.fail(f"{self.name}: generation failed: {type(exc).__name__}: {exc}")

    # -------------------------------------------------------------------------------------------- generation
    def _forward(self, ids, past):
        import torch

        with torch.no_grad():
            res = self.model(input_ids=torch.tensor([ids], dtype=torch.long), past_key_values=past, use_cache=True)
        return res.logits[0], res.past_key_values

    def _cached_forward(self, seq, tokens, context):
        """Forward `tokens` (the prompt, then any draft tokens) reusing the prefix cache for the prompt's stored
        blocks; stores the prompt's full blocks. Returns (logits of the computed tokens, past, tokens skipped)."""
        hit = self.pool.acquire(seq, context, reuse=not seq.opts["context_logits"])
        cached = None
        if hit:
            try:
                cached = BlockPool.past(hit)
            except Exception as exc:  # noqa: BLE001 (a cache layout this code cannot rebuild: prefill in full)
                pb_utils.Logger.log_warn(f"{self.name}: prefix cache disabled ({type(exc).__name__}: {exc})")
                self.pool.release(seq)
                self.pool.enabled = False
                hit = self.pool.acquire(seq, context, reuse=False)
        skip = len(hit) * self.tokens_per_block
        logits, past = self._forward(tokens[skip:], cached)
        if self.pool.enabled:
            try:
                self.pool.store(seq, context, cache_layers(past))
            except Exception as exc:  # noqa: BLE001 (caching is an optimisation: never fail a request for it)
                pb_utils.Logger.log_warn(f"{self.name}: prefix cache disabled ({type(exc).__name__}: {exc})")
                self.pool.enabled = False
        self.kv_metrics.update(self.pool)
        return logits, past, skip

    def _prefill(self, seq):
        """Run the prompt once per batch row (reusing cached prefix blocks); the row's other sequences
        (num_return_sequences) get a KV copy."""
        logits, past, _ = self._cached_forward(seq, seq.prompt, seq.prompt)
        context = logits.float().numpy() if seq.opts["context_logits"] else None
        for other in seq.job.seqs:
            if other.opts is seq.opts and other.logits is None:
                other.logits, other.context_logits, other.kv_stats = logits[-1], context, seq.kv_stats
                other.past = past if other is seq else copy.deepcopy(past)

    def _step(self, seq):
        """Produce the next token (or, with draft tokens, the whole verified block) of `seq`."""
        if seq.opts["draft"]:
            self._verify_draft(seq)
            return
        if seq.logits is None:
            self._prefill(seq)
        token = self._emit(seq, seq.logits)
        if token is None:
            return
        seq.logits, seq.past = self._forward([token], seq.past)
        seq.logits = seq.logits[-1]
        self.pool.grow(seq, len(seq.prompt) + len(seq.out))

    def _verify_draft(self, seq):
        """Target pass over prompt + draft: the longest agreeing prefix plus one token of the target's own."""
        draft, prompt = seq.opts["draft"], seq.prompt
        logits, _, skip = self._cached_forward(seq, prompt + draft, prompt)
        if seq.opts["context_logits"]:
            seq.context_logits = logits[: len(prompt)].float().numpy()
        logits = logits[len(prompt) - 1 - skip:]
        for i in range(len(draft) + 1):
            token = self._emit(seq, logits[i])
            if token is None:
                return
            if i >= len(draft) or token != draft[i]:
                break
            seq.accepted += 1
        self._finish(seq)

    def _emit(self, seq, logits):
        """Pick, record and stream one token; returns it, or None when the sequence finished."""
        o = seq.opts
        token, lp, raw = self._pick(seq, logits)
        now = time.time_ns()
        seq.first = seq.first or now
        seq.last = now
        if token == o["end_id"]:
            self._finish(seq)
            return None
        seq.out.append(token)
        seq.logprobs.append(lp)
        if o["generation_logits"]:
            seq.gen_logits.append(raw)
        if o["top_p_reset"] is not None and token == int(o["top_p_reset"]):
            seq.top_p = o["top_p"]
        elif o["top_p_decay"] != 1.0:
            seq.top_p = max(seq.top_p * o["top_p_decay"], o["top_p_min"])
        if o["streaming"] and len(seq.out) - seq.sent > 1:  # one token behind: the last travels with the final
            self._send_chunk(seq, final=False)
        if len(seq.out) >= o["max_new"] or self._stopped(seq):
            self._finish(seq)
            return None
        return token

    def _stopped(self, seq):
        history = seq.prompt + seq.out
        return any(len(w) <= len(history) and history[-len(w):] == w for w in seq.opts["stop_words"])

    def _pick(self, seq, logits):
        """Next token from 1-D `logits` -> (token, logprob, raw logits row as float32 numpy)."""
        import torch

        o = seq.opts
        raw = logits.float().numpy() if o["generation_logits"] else None
        logits = logits.double().clone()
        if o["bias"] is not None:
            logits += o["bias"].to(logits.dtype)
        history = seq.prompt + seq.out
        if o["repetition_penalty"] != 1.0 or o["presence_penalty"] or o["frequency_penalty"]:
            counts = torch.bincount(torch.tensor(history, dtype=torch.long), minlength=logits.numel())
            counts = counts[: logits.numel()].to(logits.dtype)
            mask = counts > 0
            rp = o["repetition_penalty"]
            if rp != 1.0:
                logits[mask] = torch.where(logits[mask] > 0, logits[mask] / rp, logits[mask] * rp)
            logits -= o["presence_penalty"] * mask.to(logits.dtype) + o["frequency_penalty"] * counts
        for word in o["bad_words"]:
            if len(word) == 1 or history[-(len(word) - 1):] == word[:-1]:
                if 0 <= word[-1] < logits.numel():
                    logits[word[-1]] = -math.inf
        if len(seq.out) < o["min_tokens"] and 0 <= o["end_id"] < logits.numel():
            logits[o["end_id"]] = -math.inf
        top_k, top_p = o["top_k"], seq.top_p
        if top_k == 1 or (top_k <= 0 and top_p <= 0.0):  # greedy, as TensorRT-LLM's top_k=1 / no sampling
            token = int(torch.argmax(logits))
            return token, float(torch.log_softmax(logits, dim=-1)[token]), raw
        scaled = logits / max(o["temperature"], 1e-6)
        logprobs = torch.log_softmax(scaled, dim=-1)
        if top_k > 1:
            kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
            scaled[scaled < kth] = -math.inf
        if 0.0 < top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = torch.cumsum(probs, dim=-1) - probs >= top_p
            scaled[order[drop]] = -math.inf
        token = int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=seq.gen))
        return token, float(logprobs[token]), raw

    # -------------------------------------------------------------------------------------------- responses
    def _finish(self, seq, cancelled=False):
        """Mark `seq` done and deliver what the C++ backend would: its final response(s)."""
        if seq.done:
            return
        seq.done = True
        if seq.past is not None and seq.keys is not None:  # keep the generated tokens' full blocks for reuse
            try:
                layers = cache_layers(seq.past)
                self.pool.store(seq, (seq.prompt + seq.out)[: layers[0][0].shape[2]], layers)
            except Exception as exc:  # noqa: BLE001 (caching is an optimisation: never fail a request for it)
                pb_utils.Logger.log_warn(f"{self.name}: generated blocks not cached ({type(exc).__name__}: {exc})")
        self.pool.release(seq)
        self.kv_metrics.update(self.pool)
        seq.past = seq.logits = None  # free the KV cache now
        job = seq.job
        job.open -= 1
        last = job.open == 0
        if cancelled:
            pb_utils.Logger.log_info(f"{self.name}: request '{job.triton_id}' cancelled after {len(seq.out)} tokens")
        if last:
            self.stats.request_done(sum(len(s.prompt) for s in job.seqs if s.seq_index == 0),
                                    sum(len(s.out) for s in job.seqs))
        if seq.opts["streaming"]:
            self._send_chunk(seq, final=last)
        elif self.decoupled:
            job.send(self._response([seq], whole=True), last)
        elif last:
            job.send(self._response(job.seqs, whole=True), True)

    def _send_chunk(self, seq, final):
        """Streaming: the tokens produced since the last chunk (all but the newest unless final)."""
        end = len(seq.out) if seq.done else len(seq.out) - 1
        start, seq.sent = seq.sent, max(seq.sent, end)
        seq.job.send(self._response([seq], whole=False, span=(start, end)), final)

    def _response(self, seqs, whole, span=None):
        """Build one response for `seqs` (several only on the beam axis of a non-decoupled num_return_sequences)."""
        first = seqs[0]
        o = first.opts
        rows, lps = [], []
        for seq in seqs:
            start, end = span if span else (0, len(seq.out))
            tokens = seq.out[start:end]
            if whole and not o["exclude"]:
                tokens = seq.prompt + tokens
            rows.append(tokens)
            lps.append(seq.logprobs[start:end])
        width = max(len(r) for r in rows)
        ids = np.full((1, len(rows), width), -1, dtype=np.int32)
        for i, r in enumerate(rows):
            ids[0, i, : len(r)] = r
        tensors = [
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", np.array([[len(r) for r in rows]], dtype=np.int32)),
        ]
        if o["log_probs"]:
            lp_width = max(len(x) for x in lps)
            lp = np.full((1, len(lps), lp_width), -1, dtype=np.float32)
            for i, x in enumerate(lps):
                lp[0, i, : len(x)] = x
            tensors.append(pb_utils.Tensor("output_log_probs", lp))
            cum = [float(sum(seq.logprobs[: (span[1] if span else len(seq.out))])) for seq in seqs]
            tensors.append(pb_utils.Tensor("cum_log_probs", np.array([cum], dtype=np.float32)))
        if o["context_logits"] and first.context_logits is not None and (whole or span[0] == 0):
            tensors.append(pb_utils.Tensor("context_logits", first.context_logits[None].astype(np.float32)))
        if o["generation_logits"]:
            tensors.append(pb_utils.Tensor("generation_logits", self._gen_logits(seqs, span)))
        if first.batch_index is not None:
            tensors.append(pb_utils.Tensor("batch_index", np.array([[first.batch_index]], dtype=np.int32)))
        if o["n"] > 1 and len(seqs) == 1:
            tensors.append(pb_utils.Tensor("sequence_index", np.array([[first.seq_index]], dtype=np.int32)))
        if o["num_input_tokens"]:
            tensors.append(pb_utils.Tensor("num_input_tokens", np.array([[len(first.prompt)]], dtype=np.int32)))
        if o["num_output_tokens"]:  # as the C++ backend: the tokens of this response's output_ids (all beams)
            total = sum(len(r) for r in rows)
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([[total]], dtype=np.int32)))
        if o["perf"]:
            tensors.extend(self._perf(first))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _gen_logits(self, seqs, span):
        """[1, beams, tokens, vocab] (non-streaming) or [1, tokens, 1, vocab] (streaming chunk)."""
        if span is not None:
            seq = seqs[0]
            rows = seq.gen_logits[span[0]: span[1]]
            arr = np.stack(rows) if rows else np.zeros((0, self.vocab), dtype=np.float32)
            return arr[None, :, None, :].astype(np.float32)
        width = max(len(s.gen_logits) for s in seqs)
        arr = np.zeros((1, len(seqs), width, self.vocab), dtype=np.float32)
        for i, s in enumerate(seqs):
            if s.gen_logits:
                arr[0, i, : len(s.gen_logits)] = np.stack(s.gen_logits)
        return arr

    def _perf(self, seq):
        kv = seq.kv_stats or {"reused": 0, "alloc_total": 0, "alloc_new": 0}  # none: cancelled before its prefill
        draft = len(seq.opts["draft"])
        values = [
            ("kv_cache_alloc_new_blocks", np.int32, kv["alloc_new"]),
            ("kv_cache_reused_blocks", np.int32, kv["reused"]),
            ("kv_cache_alloc_total_blocks", np.int32, kv["alloc_total"]),
            ("arrival_time_ns", np.int64, seq.job.arrival),
            ("first_scheduled_time_ns", np.int64, seq.scheduled),
            ("first_token_time_ns", np.int64, seq.first),
            ("last_token_time_ns", np.int64, seq.last),
            ("acceptance_rate", np.float32, seq.accepted / draft if draft else 0.0),
            ("total_accepted_draft_tokens", np.int32, seq.accepted),
            ("total_draft_tokens", np.int32, draft),
        ]
        return [pb_utils.Tensor(name, np.array([[v]], dtype=dtype)) for name, dtype, v in values]


def torch_tensor(arr):
    import torch

    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
