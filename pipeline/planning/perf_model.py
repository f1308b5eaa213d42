"""Serving-time estimate for one TP group under continuous (in-flight) batching: TTFT, TPOT and output tok/s.

Each engine step costs GEMMs (weights read at an achieved fraction of HBM bandwidth, or FLOPs at an achieved
fraction of the precision's tensor-core peak that grows with the GEMM's size, whichever is slower), attention
(decode: the batch's KV read; prefill: causal FLOPs plus the kernel's floor per layer), the per-token element-wise
work every rank repeats (norms, residuals), two all-reduces per layer at TP > 1 (bytes over the link plus a latency
per peer that large messages pay) and a fixed cost per layer (launches, small kernels).
A serving cycle of D = 1 + (output - 1) / tokens-per-step steps holds one mixed step per request (its prompt beside
the decoding requests) and decode-only steps for the rest; beyond D requests the rest queue (`estimate`).
Speculation turns K + 1 verified tokens into the expected accepted tokens per step, at the cost of K drafting steps:
a draft model's (draft-target), an EAGLE-3 head's (`Eagle3HeadCost`: one decoder layer on the target's hidden
states) or none (n-gram: a host-side lookup); a prefix hit skips the reused blocks' prefill.

The constants (`CALIBRATION`) are fitted to NVIDIA AIConfigurator 0.12's TensorRT-LLM database for H100 SXM and H200
(tests/data/aiconfigurator_0.12.json, refitted with scripts/fit_perf_model.py, checked on held-out points by
benchmarks/planner_accuracy.py); on other GPUs they scale with that GPU's bandwidth and peaks, uncalibrated. INT4
weight-only GEMMs have no AIConfigurator data on Hopper: they use the BF16 compute efficiency with 4-bit weight
reads, an extrapolation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.core.gpus import GPU
from pipeline.core.registry import Architecture

HIT_RATIO_WARNING = 0.6  # a prefix-cache hit ratio below it: the prompt template usually varies before the shared part
LINEAR_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8_sq": 1.0, "int4_awq": 0.5, "w4a8_awq": 0.5}
# GEMM math runs in FP8 for fp8/w4a8 (FP8 activations), INT8 for SmoothQuant, else 16-bit (AWQ dequantizes).
GEMM_MATH = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8_sq": "fp8", "int4_awq": "bf16", "w4a8_awq": "fp8"}
KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
# Per-GPU one-direction GPU-to-GPU bandwidth (GB/s): NVLink 4 on SXM, NVLink bridge on NVL, else PCIe.
INTERCONNECT_GB_S = {"h100-sxm": 450.0, "h200": 450.0, "h100-nvl": 300.0, "h100-pcie": 64.0, "l40s": 32.0,
                     "a100": 300.0}


def kv_bytes_per_token(arch: Architecture, kv_dtype: str, *, tp: int = 1) -> int:
    """KV bytes per token: 2 (K,V) x layers x kv heads (per TP rank, at least 1) x head_dim x dtype bytes."""
    return 2 * arch.num_layers * max(1, arch.num_kv_heads // tp) * arch.head_dim * KV_BYTES[kv_dtype]


@dataclass(frozen=True)
class Calibration:
    """Achieved fractions of peak and fixed costs, fitted to AIConfigurator 0.12 (H100 SXM and H200, TensorRT-LLM)."""

    hbm_efficiency: float  # achieved fraction of HBM bandwidth for weight and KV reads (H100; other GPUs too)
    hbm_efficiency_h200: float  # the same on H200 (HBM3e at 4.8 TB/s reaches a smaller share)
    gemm_efficiency_fp8: float  # achieved fraction of the FP8 dense peak in prefill-sized GEMMs
    gemm_efficiency_bf16: float
    gemm_half_gflop: float  # per-layer GEMM work (GFLOP, one GPU) at which GEMMs reach half their efficiency
    context_attention_floor_us: float  # context FMHA time per layer that does not shrink with its FLOPs
    attention_efficiency: float  # context attention FLOPs, fraction of the FMHA dtype's peak
    allreduce_bw_factor: float  # achieved all-reduce bandwidth over the link's one-direction bandwidth (NVLink SHARP
    # reduces in the switch, so it may exceed the ring's share)
    allreduce_latency_us: float  # fixed cost per peer (TP - 1) of one large all-reduce (steps, synchronisation) ...
    allreduce_latency_half_mb: float  # ... reached halfway at this message size (small ones take a low-latency path)
    layer_overhead_us: float  # launches and small kernels per layer per step
    elementwise_passes: float  # reads + writes of a token's 16-bit hidden state per layer that TP does not split
    ttft_queue_base: float  # TTFT = one mixed step x min(queue_max, base + per_prefill x other prompts in flight)
    ttft_queue_per_prefill: float
    ttft_queue_max: float


CALIBRATION = Calibration(
    hbm_efficiency=0.8616, hbm_efficiency_h200=0.8336, gemm_efficiency_fp8=0.6754, gemm_efficiency_bf16=0.7853,
    gemm_half_gflop=11.767, context_attention_floor_us=62.2936, attention_efficiency=0.4103,
    allreduce_bw_factor=1.3583, allreduce_latency_us=4.6294, allreduce_latency_half_mb=1.4426,
    layer_overhead_us=44.0825, elementwise_passes=22.6742, ttft_queue_base=1.8647, ttft_queue_per_prefill=0.0512,
    ttft_queue_max=3.9803)


@dataclass(frozen=True)
class EngineCost:
    """One engine's per-GPU cost terms (target or draft)."""

    arch: Architecture
    precision: str
    kv: str
    tp: int
    gpu: GPU

    def weight_bytes(self, tokens: float | None = None) -> float:
        """Weights read per step of `tokens` tokens on one GPU: quantized linears plus the 16-bit lm_head
        (vocab-parallel). MoE: only the experts that step's tokens route to (all of them when `tokens` is None)."""
        a = self.arch
        linear = a.linear_params if tokens is None else a.expert_linear_params_touched(tokens)
        return ((linear * LINEAR_BYTES[self.precision] + self.lm_head_params() * 2) / self.tp
                + self.replicated_params() * LINEAR_BYTES[self.precision])

    def token_params(self) -> float:
        """Linear parameters one token passes through, split by TP (MoE: its top-k experts)."""
        return float(self.arch.active_linear_params)

    def lm_head_params(self) -> float:
        return float(self.arch.vocab_size * self.arch.hidden_size)

    def replicated_params(self) -> float:
        """Linear parameters every TP rank holds whole (none in a model; an EAGLE-3 head's fc)."""
        return 0.0

    def drafting_ms(self, cal: Calibration, *, draft_len: int, decode_seqs: float, decode_len: float) -> float:
        """K autoregressive draft steps of `decode_seqs` sequences (this engine as a draft model)."""
        return draft_len * self.step_ms(cal, context_tokens=0, context_len=0, decode_seqs=decode_seqs,
                                        decode_len=decode_len)

    def kv_bytes_per_token(self) -> float:
        return kv_bytes_per_token(self.arch, self.kv, tp=self.tp)

    def step_ms(self, cal: Calibration, *, context_tokens: int, context_len: float, decode_seqs: float,
                decode_len: float, tokens_per_seq: int = 1) -> float:
        """One engine step: `context_tokens` prompt tokens (of sequences `context_len` long) plus `decode_seqs`
        decoding sequences at mean length `decode_len`, each verifying `tokens_per_seq` tokens."""
        a, g = self.arch, self.gpu
        bw = g.hbm_tb_s * 1e12 * (cal.hbm_efficiency_h200 if g.name == "h200" else cal.hbm_efficiency)
        math_fp8 = GEMM_MATH[self.precision] == "fp8" and g.has_fp8
        peak = (g.fp8_tflops if math_fp8 else g.bf16_tflops) * 1e12
        eff = cal.gemm_efficiency_fp8 if math_fp8 else cal.gemm_efficiency_bf16
        tokens = context_tokens + decode_seqs * tokens_per_seq
        logits = (1 if context_tokens else 0) + decode_seqs * tokens_per_seq
        flops = (2 * (self.token_params() * tokens + self.lm_head_params() * logits) / self.tp
                 + 2 * self.replicated_params() * tokens)
        # a small GEMM does not fill the GPU: efficiency rises with the work per layer, half of it at gemm_half_gflop
        per_layer = flops / a.num_layers / 1e9
        eff *= per_layer / (per_layer + cal.gemm_half_gflop) if per_layer else 1.0
        gemm_s = max(self.weight_bytes(tokens) / bw, flops / (peak * eff)) if flops else 0.0
        kv_s = decode_seqs * (decode_len + tokens_per_seq) * self.kv_bytes_per_token() / bw
        attn_peak = (g.fp8_tflops if self.kv == "fp8" and g.has_fp8 else g.bf16_tflops) * 1e12
        attn_flops = 2 * context_tokens * context_len * a.num_heads * a.head_dim * a.num_layers / self.tp
        attn_s = attn_flops / (attn_peak * cal.attention_efficiency)
        if context_tokens:  # the context FMHA kernel's own floor per layer, whatever few heads a rank holds
            attn_s += a.num_layers * cal.context_attention_floor_us * 1e-6
        # norms, residual adds, RoPE and activations touch every token's full hidden state on every rank: not split
        elementwise_s = tokens * a.num_layers * cal.elementwise_passes * a.hidden_size * 2 / bw
        return ((gemm_s + kv_s + attn_s + elementwise_s + self._allreduce_s(cal, tokens)) * 1e3
                + a.num_layers * cal.layer_overhead_us / 1e3)

    def _allreduce_s(self, cal: Calibration, tokens: float) -> float:
        """Two all-reduces per layer of the step's 16-bit hidden states (ring: 2(tp-1)/tp of the message) plus
        their fixed cost."""
        if self.tp == 1:
            return 0.0
        link = INTERCONNECT_GB_S.get(self.gpu.name, 64.0) * 1e9 * cal.allreduce_bw_factor
        message = tokens * self.arch.hidden_size * 2
        latency = (self.tp - 1) * cal.allreduce_latency_us * 1e-6 * message / (message + cal.allreduce_latency_half_mb * 1e6)
        return 2 * self.arch.num_layers * (2 * (self.tp - 1) / self.tp * message / link + latency)


@dataclass(frozen=True)
class Eagle3HeadCost(EngineCost):
    """An EAGLE-3 head drafting inside the target (TensorRT-LLM 1.2 `Eagle3DraftModel`): `arch` is the head's one
    decoder layer, whose attention takes 2H inputs (token embedding and hidden state concatenated); its lm_head
    predicts `draft_vocab_size` tokens; the first step of a chain also runs `fc`, fusing the `captured` target
    layers' hidden states (captured x H -> H, built without a TP mapping: every rank holds it whole) over the K + 1
    positions the target just verified. Weights in the head's own 16-bit dtype (`precision`), KV in the target's."""

    draft_vocab_size: int = 0
    captured: int = 3  # target layers whose hidden states the fc fuses (eagle3_layers_to_capture; default 3)
    first_step: bool = True  # this step runs the fc over the verified positions

    def token_params(self) -> float:
        a = self.arch
        h, q, kv = a.hidden_size, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        return float(a.num_layers * (2 * h * (q + 2 * kv) + q * h + 3 * h * a.intermediate_size))

    def lm_head_params(self) -> float:
        return float(self.arch.hidden_size * self.draft_vocab_size)

    def replicated_params(self) -> float:
        return float(self.captured * self.arch.hidden_size ** 2) if self.first_step else 0.0

    def weight_bytes(self, tokens: float | None = None) -> float:
        """Weights a step reads on one GPU (the fc only on the chain's first step)."""
        return ((self.token_params() * LINEAR_BYTES[self.precision] + self.lm_head_params() * 2) / self.tp
                + self.replicated_params() * LINEAR_BYTES[self.precision])

    def drafting_ms(self, cal: Calibration, *, draft_len: int, decode_seqs: float, decode_len: float) -> float:
        """The chain: a first step over the K + 1 verified positions (fc included), then K - 1 single-token steps."""
        first = self.step_ms(cal, context_tokens=0, context_len=0, decode_seqs=decode_seqs, decode_len=decode_len,
                             tokens_per_seq=draft_len + 1)
        rest = replace(self, first_step=False).step_ms(cal, context_tokens=0, context_len=0, decode_seqs=decode_seqs,
                                                       decode_len=decode_len)
        return first + (draft_len - 1) * rest


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding: the drafter (a draft engine or an EAGLE-3 head; None: drafts cost no forward pass, as
    n-gram's lookup), K proposed tokens and the acceptance rate per proposed token."""

    draft: EngineCost | None
    draft_len: int
    acceptance: float

    def tokens_per_step(self) -> float:
        return expected_tokens_per_step(self.acceptance, self.draft_len)


def expected_tokens_per_step(acceptance: float, draft_len: int) -> float:
    """Tokens one target step yields with speculation (the mean accepted length, the bonus token included):
    (1 - a^(K+1)) / (1 - a) (K + 1 at a = 1)."""
    if acceptance >= 1.0:
        return float(draft_len + 1)
    return (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class Estimate:
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    prefill_ms: float  # one request's prefill step alone (no queueing)
    decode_step_ms: float  # one decode-only step of the whole batch (target, plus a draft model's K steps)
    tokens_per_target_step: float


def estimate(target: EngineCost, *, input_len: int, output_len: int, batch: int, prefix_reused: int = 0,
             speculation: Speculation | None = None, cal: Calibration = CALIBRATION) -> Estimate:
    """TTFT, TPOT and output tok/s of `batch` concurrent requests of `input_len` + `output_len` tokens.

    One serving cycle (every request turning over once) takes D = 1 + (output_len - 1) / tokens-per-step steps:
    one mixed step per request (its prompt beside the decoding requests) and decode-only steps for the rest. A
    batch beyond D cannot all decode at once (one prompt per mixed step): D requests stay in flight, throughput
    holds at its value there and the rest queue, which adds to their TTFT. TTFT is a mixed step times a queueing
    factor that grows with the prompts waiting in a cycle.
    """
    if batch < 1:
        return Estimate(0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    new_tokens = max(1, input_len - prefix_reused)
    decode_len = input_len + output_len / 2
    per_step = speculation.tokens_per_step() if speculation else 1.0
    verify = speculation.draft_len + 1 if speculation else 1
    steps = 1.0 + max(output_len - 1, 0) / per_step  # the prefill's first token, then the decode steps
    active = min(float(batch), steps)

    def step(context: int, decoders: float) -> float:
        ms = target.step_ms(cal, context_tokens=context, context_len=input_len if context else 0,
                            decode_seqs=decoders, decode_len=decode_len, tokens_per_seq=verify)
        if speculation and speculation.draft is not None and decoders:
            ms += speculation.draft.drafting_ms(cal, draft_len=speculation.draft_len, decode_seqs=decoders,
                                                decode_len=decode_len)
        return ms

    prefill_ms = step(new_tokens, 0)
    mix_ms = step(new_tokens, active - 1)
    gen_ms = step(0, active)
    cycle_ms = active * mix_ms + (steps - active) * gen_ms
    mixed_seen = active - 1  # the other requests' prompts a request decodes beside
    tpot = (mixed_seen * mix_ms + (steps - active) * gen_ms) / max(steps - 1, 1e-9) / per_step if steps > 1 else 0.0
    tokens_per_s = active * output_len / cycle_ms * 1e3
    queue = min(cal.ttft_queue_max, cal.ttft_queue_base + cal.ttft_queue_per_prefill * (active - 1))
    ttft = mix_ms * queue
    if batch > active:  # the requests beyond the in-flight batch wait for a place (Little's law)
        ttft += (batch - active) * output_len / tokens_per_s * 1e3
    return Estimate(ttft_ms=ttft, tpot_ms=tpot, output_tokens_per_s=tokens_per_s, prefill_ms=prefill_ms,
                    decode_step_ms=gen_ms, tokens_per_target_step=per_step)
