"""Target GPUs the spec knows. Known so that a wrong GPU is rejected with a reason."""

from __future__ import annotations

from dataclasses import dataclass

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
