"""Target GPUs the spec knows. Known so that a wrong GPU is rejected with a reason."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline.core.errors import SpecError

GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    name: str
    sm: int  # compute capability x10 (90 = SM 9.0)
    memory_gib: float  # usable device memory
    hbm_tb_s: float  # HBM bandwidth, TB/s
    bf16_tflops: float  # dense
    fp8_tflops: float  # dense, 0 when the GPU has no FP8

    @property
    def has_fp8(self) -> bool:
        return self.sm >= 89


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("h100-sxm", 90, 79.6, 3.35, 989.0, 1979.0),
        GPU("h100-pcie", 90, 79.6, 2.0, 756.0, 1513.0),
        GPU("h100-nvl", 90, 93.0, 3.9, 835.0, 1671.0),
        GPU("h200", 90, 140.4, 4.8, 989.0, 1979.0),
        GPU("l40s", 89, 44.5, 0.864, 362.0, 733.0),
        GPU("a100", 80, 79.2, 2.039, 312.0, 0.0),
    )
}

# The engine path of this project is tuned and tested for Hopper (SM 90).
SUPPORTED_SM = 90


@dataclass(frozen=True)
class GPUPrice:
    """A default on-demand rental price of one GPU for cost figures, with where it comes from."""

    usd_per_hour: float
    source: str
    date: str


# Specialty-cloud on-demand rates (not hyperscaler list prices, not reserved or spot). The mercatus-ai figures are
# the midpoints of its "specialty" tier (May 2026); PCIe and NVL H100 have no quoted tier there: scaled, and said so.
_MERCATUS = "mercatus-ai.com/blog/cloud-gpu-pricing, specialty-cloud on-demand tier midpoint"
GPU_PRICES: dict[str, GPUPrice] = {
    "h100-sxm": GPUPrice(3.00, _MERCATUS + " ($2.50-3.50)", "2026-05"),
    "h100-pcie": GPUPrice(2.40, "estimate: H100 SXM's rate x 0.8 (PCIe part, 60 % of its HBM bandwidth)", "2026-05"),
    "h100-nvl": GPUPrice(3.00, "estimate: H100 SXM's rate (94 GB NVL part, no separate quote)", "2026-05"),
    "h200": GPUPrice(4.00, _MERCATUS + " ($3.50-4.50)", "2026-05"),
    "l40s": GPUPrice(0.79, "deploybase.ai/articles/l40s-vs-h100, on-demand", "2026-03"),
    "a100": GPUPrice(1.30, _MERCATUS + " (A100 80GB, $1.10-1.50)", "2026-05"),
}
PRICE_ENV = "PIPELINE_GPU_PRICE"


@dataclass(frozen=True)
class ChosenPrice:
    usd_per_hour: float
    source: str  # "--gpu-price / spec", "$PIPELINE_GPU_PRICE", or the table's source and date


def gpu_price(gpu: str, given: float | None = None) -> ChosenPrice:
    """$/GPU-hour for cost figures: the spec's (flag or file) value, else $PIPELINE_GPU_PRICE, else the table's.

    Raises:
        SpecError: $PIPELINE_GPU_PRICE is not a positive number.
    """
    if given is not None:
        return ChosenPrice(given, "--gpu-price / spec hardware.gpu_price_per_hour")
    if raw := os.environ.get(PRICE_ENV, "").strip():
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value <= 10_000:
            raise SpecError(f"${PRICE_ENV}={raw!r}: expected USD per GPU-hour in (0, 10000]; fix or unset it")
        return ChosenPrice(value, f"${PRICE_ENV}")
    p = GPU_PRICES[gpu]
    return ChosenPrice(p.usd_per_hour, f"default for {gpu}: {p.source} ({p.date})")
