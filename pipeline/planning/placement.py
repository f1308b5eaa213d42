"""Where the ranks of a TP×PP engine run: TP groups within a node, pipeline stages across nodes, memory per node.

TensorRT-LLM numbers ranks TP-fastest (`tensorrt_llm/mapping.py`: tp_rank = rank % tp_size, pp_rank =
rank // tp_size), and mpirun/srun fill each node's slots in rank order, so a node that holds whole TP groups keeps
every TP all-reduce on NVLink; only pipeline activations (point to point, once per stage boundary) cross nodes.
Every node holds the same number of ranks, so one pod/worker template (or `--ntasks-per-node`) fits all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GIB, GPU

if TYPE_CHECKING:  # spec.py imports the rules that call this module
    from pipeline.core.spec import HardwareSpec


class NodeMemory(BaseModel):
    """One node: its ranks and what the engine takes of its GPUs' memory."""

    node: int
    ranks: list[int]
    gpus: int
    capacity_gib: float = Field(description="memory of the node's GPUs that hold ranks")
    used_gib: float = Field(description="weights + runtime reserve + activations on those GPUs")
    kv_pool_gib: float = Field(description="KV-cache pools carved from the rest")


class Placement(BaseModel):
    """Ranks to nodes: `node_ranks[k]` are the global ranks of node k (TP groups never split unless asked)."""

    tp: int
    pp: int
    nodes: int
    gpus_per_node: int
    ranks_per_node: int
    node_ranks: list[list[int]]
    per_node: list[NodeMemory] = []

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def node_gpus(hw: HardwareSpec) -> int:
    """GPUs per node: `gpus_per_node`, else the host's `gpu_count`."""
    return hw.gpus_per_node or hw.gpu_count


def capacity(hw: HardwareSpec) -> int:
    """GPUs the spec may use: nodes × GPUs per node."""
    return hw.nodes * node_gpus(hw)


def _ranks_per_node(tp: int, pp: int, hw: HardwareSpec) -> int:
    per_node, world = node_gpus(hw), tp * pp
    if world <= per_node:
        return world
    if tp > per_node:
        if not hw.tp_across_nodes:
            raise SpecError(
                f"parallelism: tp={tp} exceeds the {per_node} GPUs of one node; a TP group stays within a node "
                "(its all-reduces need NVLink): lower --tp and raise --pp, or pass --tp-across-nodes")
        if tp % per_node:
            raise SpecError(f"parallelism: tp={tp} spanning nodes must be a multiple of the {per_node} GPUs per node; "
                            f"use tp={tp // per_node * per_node or per_node}")
        return per_node
    if per_node % tp:
        raise SpecError(f"parallelism: tp={tp} does not divide the {per_node} GPUs of a node, so a TP group would "
                        "straddle two nodes; use a tp that divides --gpus-per-node")
    stages = per_node // tp
    if pp % stages:
        raise SpecError(
            f"parallelism: pp={pp} stages of tp={tp} do not fill {per_node}-GPU nodes evenly ({stages} stages per "
            f"node); use a pp that is a multiple of {stages}, or tp×pp <= {per_node} on one node")
    return per_node


def place(tp: int, pp: int, hw: HardwareSpec) -> Placement:
    """Place tp×pp ranks on the spec's nodes (TP within a node, PP across nodes).

    Raises:
        SpecError: a TP group would span nodes (unless `tp_across_nodes`), nodes would hold unequal rank counts,
            or more nodes are needed than `hardware.nodes` (the message names the count to pass).
    """
    rpn = _ranks_per_node(tp, pp, hw)
    world = tp * pp
    nodes = world // rpn
    if nodes > hw.nodes:
        per = "gpus_per_node" if hw.gpus_per_node else "gpu_count"
        raise SpecError(
            f"parallelism: tp×pp={world} exceeds hardware.{per}={node_gpus(hw)} × nodes={hw.nodes}; lower --tp/--pp, "
            f"or place it on {nodes} nodes (--nodes {nodes})")
    return Placement(tp=tp, pp=pp, nodes=nodes, gpus_per_node=node_gpus(hw), ranks_per_node=rpn,
                     node_ranks=[list(range(k * rpn, (k + 1) * rpn)) for k in range(nodes)])


def with_memory(p: Placement, per_rank_used: dict[int, float], per_rank_pool: dict[int, float],
                gpu: GPU) -> Placement:
    """`p` with each node's memory: the per-rank bytes in use and KV pools summed over the node's ranks."""
    nodes = [
        NodeMemory(node=k, ranks=ranks, gpus=len(ranks),
                   capacity_gib=round(len(ranks) * gpu.memory_gib, 2),
                   used_gib=round(sum(per_rank_used.get(r, 0.0) for r in ranks) / GIB, 2),
                   kv_pool_gib=round(sum(per_rank_pool.get(r, 0.0) for r in ranks) / GIB, 2))
        for k, ranks in enumerate(p.node_ranks)
    ]
    return p.model_copy(update={"per_node": nodes})


def try_place(tp: int, pp: int, hw: HardwareSpec) -> Placement | None:
    """`place`, or None where the ranks cannot be placed on this hardware (for searches over candidates)."""
    try:
        return place(tp, pp, hw)
    except SpecError:
        return None
