"""Choosing TP × PP and nodes for a deployment: the fewest nodes on which the model fits, TP filling a node first.

One node: the smallest TP (1, 2, 4, 8, within the node) whose weights, activations and one longest sequence's KV fit
(the planner's memory model). Several nodes: TP = GPUs per node and one pipeline stage per node (TP all-reduces stay
on NVLink; only activations cross nodes), the layout NVIDIA's multi-node examples use.
"""

from __future__ import annotations

from pipeline.core.errors import DeployError, SpecError
from pipeline.core.spec import BuildSpec, ParallelSpec
from pipeline.planning.placement import Placement, node_gpus, place
from pipeline.planning.planner import TP_CHOICES, plan_capacity
from pipeline.stages.check import check_spec_fits

MAX_NODES = 16


def with_parallelism(spec: BuildSpec, tp: int, pp: int, nodes: int) -> BuildSpec:
    """A copy of `spec` at tp × pp on `nodes` nodes, with every spec rule applied again."""
    hw = spec.hardware.model_copy(update={"nodes": nodes})
    return check_spec_fits(spec.revised(parallelism=ParallelSpec(tp=tp, pp=pp), hardware=hw))


def _fits(spec: BuildSpec, tp: int, pp: int, nodes: int) -> BuildSpec | None:
    try:
        candidate = with_parallelism(spec, tp, pp, nodes)
    except SpecError:
        return None
    return candidate if plan_capacity(candidate).fits else None


def _candidates(spec: BuildSpec, max_nodes: int):
    per_node = node_gpus(spec.hardware)
    for tp in (t for t in TP_CHOICES if t <= per_node):
        yield tp, 1, 1
    for nodes in range(2, max_nodes + 1):
        yield per_node, nodes, nodes


def choose(spec: BuildSpec, *, explicit: bool, max_nodes: int | None = None) -> tuple[BuildSpec, Placement]:
    """The spec to deploy and its placement.

    `explicit`: the spec's tp/pp were given (or recorded by a release) and are kept; only the node count follows
    from them. Otherwise the fewest nodes that fit, up to `max_nodes` (default `hardware.nodes` when it was set,
    else 16).

    Raises:
        DeployError: nothing fits within the node limit, or the given tp/pp cannot be placed.
    """
    p = spec.parallelism
    limit = max_nodes or (spec.hardware.nodes if "nodes" in spec.hardware.model_fields_set else MAX_NODES)
    if explicit:
        probe = spec.hardware.model_copy(update={"nodes": limit})
        try:
            nodes = place(p.tp, p.pp, probe).nodes
            chosen = with_parallelism(spec, p.tp, p.pp, nodes)
        except SpecError as exc:
            raise DeployError(str(exc)) from None
        return chosen, place(p.tp, p.pp, chosen.hardware)
    for tp, pp, nodes in _candidates(spec, limit):
        fit = _fits(spec, tp, pp, nodes)
        if fit is not None:
            return fit, place(tp, pp, fit.hardware)
    raise DeployError(
        f"{spec.model.name} {spec.quantization.precision} does not fit {limit} node(s) of "
        f"{node_gpus(spec.hardware)} x {spec.hardware.gpu}; raise --max-nodes, quantize (--precision fp8) or lower "
        "--max-batch / --max-seq-len (`invoke plan` shows the memory)")
