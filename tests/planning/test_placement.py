"""Placement: TP groups within a node, pipeline stages across nodes, equal ranks per node, memory per node."""

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import HardwareSpec, resolve_spec
from pipeline.planning.placement import place
from pipeline.planning.planner import plan_capacity
from pipeline.stages.check import resolve_checked_spec


def test_tp_within_node_pp_across_nodes():
    p = place(8, 2, HardwareSpec(nodes=2))
    assert (p.nodes, p.ranks_per_node, p.world_size) == (2, 8, 16)
    assert p.node_ranks == [list(range(8)), list(range(8, 16))]  # TP-fastest rank order: a TP group per node


def test_two_stages_per_node():
    p = place(4, 4, HardwareSpec(nodes=2))
    assert p.node_ranks == [list(range(8)), list(range(8, 16))]


def test_single_node_keeps_world():
    p = place(2, 2, HardwareSpec())
    assert (p.nodes, p.ranks_per_node) == (1, 4)


@pytest.mark.parametrize(("tp", "pp", "hw", "message"), [
    (16, 1, HardwareSpec(nodes=2), r"tp=16 exceeds the 8 GPUs of one node.*--tp-across-nodes"),
    (8, 2, HardwareSpec(), r"tp×pp=16 exceeds hardware.gpu_count=8 × nodes=1.*--nodes 2"),
    (4, 3, HardwareSpec(nodes=4), r"pp=3 stages of tp=4 do not fill 8-GPU nodes evenly"),
    (3, 4, HardwareSpec(nodes=4, gpus_per_node=8), r"tp=3 does not divide the 8 GPUs"),
])
def test_refused(tp, pp, hw, message):
    with pytest.raises(SpecError, match=message):
        place(tp, pp, hw)


def test_tp_across_nodes_when_asked():
    p = place(16, 1, HardwareSpec(nodes=2, tp_across_nodes=True))
    assert (p.nodes, p.ranks_per_node) == (2, 8)


def test_check_refuses_tp_spanning_nodes():
    with pytest.raises(SpecError, match="tp=16 exceeds the 8 GPUs of one node"):
        resolve_checked_spec(model="llama-405b", precision="bf16", tp=16, nodes=2)


def test_plan_reports_memory_per_node():
    spec = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2)
    plan = plan_capacity(spec)
    assert plan.nodes == 2 and plan.fits
    assert [n["ranks"] for n in plan.per_node] == [list(range(8)), list(range(8, 16))]
    for node in plan.per_node:
        # 405B BF16 (~756 GiB) halves across the two pipeline stages; each node's GPUs hold one half plus reserve
        assert plan.weights_gib_total / 2 < node["used_gib"] < node["capacity_gib"]
        assert node["kv_pool_gib"] > 0


def test_llama_405b_registry_numbers():
    spec = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2)
    a = spec.model.architecture
    assert (a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads, a.intermediate_size, a.vocab_size) == (
        126, 16384, 128, 8, 53248, 128256)
    plan = plan_capacity(spec)
    assert 800 < plan.weights_gib_total * 2**30 / 1e9 < 820  # ~810 GB in BF16
