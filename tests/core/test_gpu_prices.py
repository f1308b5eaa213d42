"""Default $/GPU-hour per GPU type (pipeline.core.gpus.GPU_PRICES), overridable by flag/spec and environment."""

from __future__ import annotations

import re

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GPU_PRICES, GPUS, PRICE_ENV, gpu_price
from pipeline.core.spec import resolve_spec
from pipeline.planning.compare import compare_plans
from pipeline.planning.planner import plan_capacity
from pipeline.serving.bench import cost_basis


def test_every_gpu_has_a_price_with_source_and_date():
    assert GPU_PRICES.keys() == GPUS.keys()
    for price in GPU_PRICES.values():
        assert price.usd_per_hour > 0 and price.source and re.fullmatch(r"\d{4}-\d{2}", price.date)


def test_l40s_and_h100_are_priced_differently(monkeypatch):
    monkeypatch.delenv(PRICE_ENV, raising=False)
    h100 = plan_capacity(resolve_spec(model="llama-8b", precision="fp8", gpu="h100-sxm"))
    l40s = plan_capacity(resolve_spec(model="llama-8b", precision="fp8", gpu="l40s"))
    assert h100.gpu_price_per_hour == GPU_PRICES["h100-sxm"].usd_per_hour
    assert l40s.gpu_price_per_hour == GPU_PRICES["l40s"].usd_per_hour < h100.gpu_price_per_hour
    assert "l40s" in l40s.gpu_price_source and GPU_PRICES["l40s"].date in l40s.gpu_price_source
    assert compare_plans(resolve_spec(model="llama-8b", gpu="l40s", gpu_count=1)).gpu_price_per_hour == 0.79


def test_flag_beats_environment_beats_table(monkeypatch):
    monkeypatch.setenv(PRICE_ENV, "1.5")
    assert gpu_price("h100-sxm").usd_per_hour == 1.5 and gpu_price("h100-sxm").source == f"${PRICE_ENV}"
    p = plan_capacity(resolve_spec(model="llama-8b", gpu_price_per_hour=2.0))
    assert p.gpu_price_per_hour == 2.0 and p.gpu_price_source.startswith("--gpu-price")
    monkeypatch.delenv(PRICE_ENV)
    assert gpu_price("h200").usd_per_hour == GPU_PRICES["h200"].usd_per_hour


@pytest.mark.parametrize("value", ["abc", "0", "-3", "inf", "20000"])
def test_a_bad_environment_price_is_refused(monkeypatch, value):
    monkeypatch.setenv(PRICE_ENV, value)
    with pytest.raises(SpecError, match=rf"\${PRICE_ENV}=.*fix or unset it"):
        gpu_price("h100-sxm")


def test_bench_labels_a_cpu_reference_servers_cost(monkeypatch):
    monkeypatch.delenv(PRICE_ENV, raising=False)
    price, source = cost_basis(resolve_spec(model="tiny-llama", target="reference"))
    assert price == GPU_PRICES["h100-sxm"].usd_per_hour and "CPU reference server" in source
    price, source = cost_basis(resolve_spec(model="llama-8b", gpu="l40s"))
    assert price == GPU_PRICES["l40s"].usd_per_hour and "CPU" not in source
