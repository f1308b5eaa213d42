"""CPU calibration rate per core: the FLOP/s ModelOpt FP8 calibration sustains in float32 on this CPU, measured
on a randomly initialised model with a real Llama layer shape (llama-1b's: hidden 2048, MLP 8192), against the
figure the host check assumes (`pipeline.stages.resources.CPU_FLOPS_PER_CORE`).

Peer: a plain float32 forward of the same model over the same tokens (no quantizers) — the ratio shows what fake
quantization costs on top of the GEMMs.

    python benchmarks/cpu_calibration_rate.py [--layers 2] [--tokens 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512, help="calibration tokens per pass (calib_seq_len)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import modelopt.torch.quantization as mtq
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.core.registry import get_model
    from pipeline.stages.resources import CPU_FLOPS_PER_CORE
    from pipeline.stages.calibrate.recipes import quant_config

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    arch = get_model("llama-1b").architecture
    cfg = LlamaConfig(**{**arch.hf_config(), "num_hidden_layers": args.layers})
    model = LlamaForCausalLM(cfg).eval()
    params = sum(p.numel() for p in model.parameters() if p.dim() == 2) - arch.vocab_size * arch.hidden_size
    batch = torch.randint(0, arch.vocab_size, (1, args.tokens))
    flops = 2 * params * args.tokens * args.passes  # embeddings are a lookup; every other 2-D weight is a GEMM

    def loop(m) -> None:
        with torch.no_grad():
            for _ in range(args.passes):
                m(batch)

    plain = copy.deepcopy(model)
    t = time.perf_counter()
    loop(plain)
    plain_s = time.perf_counter() - t
    t = time.perf_counter()
    mtq.quantize(model, quant_config("fp8", "fp8"), loop)
    calib_s = time.perf_counter() - t
    rate = flops / calib_s / args.threads
    print(f"model: llama-1b shape, {args.layers} layers, {params / 1e6:.0f} M GEMM parameters, {args.tokens} tokens "
          f"x {args.passes} passes, {args.threads} thread(s)")
    print(f"plain float32 forward:   {plain_s:7.2f} s  {flops / plain_s / args.threads / 1e9:6.1f} GFLOP/s per core")
    print(f"ModelOpt FP8 calibrate:  {calib_s:7.2f} s  {rate / 1e9:6.1f} GFLOP/s per core "
          f"(x{calib_s / plain_s:.2f} the plain forward)")
    print(f"assumed by the host check: {CPU_FLOPS_PER_CORE / 1e9:.1f} GFLOP/s per core "
          f"(measured / assumed = {rate / CPU_FLOPS_PER_CORE:.2f})")


if __name__ == "__main__":
    main()
