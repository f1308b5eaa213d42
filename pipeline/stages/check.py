"""Rules of a build spec that need the planner or the input files: placement on the hardware, memory fit, readable
calibration data. `resolve_checked_spec` is the spec every command acts on (intrinsic rules + these); the spec module
itself imports no planner.

Each rule raises `SpecError` with one line: the field, the value, and what to do instead.
"""

from __future__ import annotations

from pipeline.core.errors import SpecError
from pipeline.core.gpus import GIB, GPUS
from pipeline.core.spec import BuildSpec, load_spec_file, resolve_spec
from pipeline.planning.limits_choice import choose_limits
from pipeline.planning.placement_choice import choose_placement
from pipeline.planning.placement import place
from pipeline.planning.planner import engine_shapes, fit_shortfall
from pipeline.stages.calibrate.data import load_texts


def _largest_fitting(fits, low: int, high: int) -> int | None:
    """The largest value in low..high for which the monotone predicate `fits` holds, or None."""
    if not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _check_memory_fit(spec: BuildSpec, warnings: list[str]) -> None:
    """Refuse limits whose activations plus one longest sequence's KV do not fit a GPU, naming what would fit.

    Ours (pipeline/planning/planner.py's memory model, not an upstream check): TensorRT-LLM sizes activations by
    max_num_tokens and max_batch_size at engine load, and a KV pool that cannot hold one max_seq_len sequence
    makes the executor shrink the attention window or reject the longest requests. Weights that do not fit at all
    are a parallelism question: a warning here, `invoke plan` names the minimum TP.
    """

    gpu = GPUS[spec.hardware.gpu]

    def short(**kw) -> float:
        return fit_shortfall(spec, *engine_shapes(spec, **kw), gpu)

    if short() <= 0:
        return
    draft = spec.quantized_draft is not None  # a draft model has its own batch; an EAGLE-3 head runs the target's
    floor = spec.limits.tokens_per_block
    knobs = [
        ("limits.max_batch_size", "--max-batch", "max_batch", spec.max_batch_size, 1),
        ("limits.max_num_tokens", "--max-num-tokens", "max_num_tokens", spec.base_max_num_tokens, floor),
        ("limits.max_seq_len", "--max-seq-len", "max_seq_len", spec.max_seq_len, 1),
    ]
    if draft:
        knobs.insert(1, ("speculation.draft_max_batch_size", "--draft-max-batch", "draft_max_batch",
                         spec.draft_max_batch_size, 1))
    # blame what the spec set explicitly first, then the registry defaults
    given = {f"limits.{n}" for n in spec.limits.model_fields_set} | {
        f"speculation.{n}" for n in spec.speculation.model_fields_set}
    knobs.sort(key=lambda knob: knob[0] not in given)
    minimal = {"max_batch": 1, "max_num_tokens": floor, "max_seq_len": 1}
    if draft:
        minimal["draft_max_batch"] = 1
    if short(**minimal) > 0:
        warnings.append(
            f"hardware: {spec.model.name} {spec.quantization.precision} at tp={spec.parallelism.tp} does not fit "
            f"one {gpu.name} ({gpu.memory_gib} GiB) even at batch 1; raise --tp (`invoke plan` shows the minimum)"
        )
        return
    need = short() / GIB
    for field, flag, key, value, low in knobs:
        if value < low:
            continue
        best = _largest_fitting(lambda v, key=key: short(**{key: v}) <= 0, low, value)
        if best is not None:
            hint = " (and --max-input-len with it)" if key == "max_seq_len" and best < spec.max_input_len else ""
            raise SpecError(
                f"{field}={value}: activations and one {spec.max_seq_len}-token sequence's KV need {need:.1f} GiB "
                f"more than a {gpu.name} has at tp={spec.parallelism.tp}; at most {best} fits: lower {flag} to "
                f"<= {best}{hint} or raise --tp"
            )
    raise SpecError(
        f"limits: max_batch_size={spec.max_batch_size}, max_num_tokens={spec.base_max_num_tokens} and "
        f"max_seq_len={spec.max_seq_len} together need {need:.1f} GiB more than a {gpu.name} has at "
        f"tp={spec.parallelism.tp}; lower them (each alone is not enough) or raise --tp"
    )


def check_spec_fits(spec: BuildSpec) -> BuildSpec:
    """Apply the placement, memory-fit and input-file rules to a spec that passed the intrinsic ones; their warnings
    join the spec's warnings in the returned copy."""
    warnings: list[str] = []
    p = spec.parallelism
    place(p.tp, p.pp, spec.hardware)  # TP within a node, PP across nodes, within hardware.nodes
    _check_memory_fit(spec, warnings)
    _check_input_files(spec)
    return spec.with_notes(warnings=[*spec.warnings, *warnings])


def resolve_checked_spec(**kwargs) -> BuildSpec:
    """`resolve_spec(**kwargs)`, the TP it leaves unset chosen by cost (`choose_placement`) and the engine limits by
    the memory model (`choose_limits`), then every rule applied (intrinsic and fit): the spec every command acts on."""
    if kwargs.get("spec_file"):  # read and checked once, whatever TP the placement tries
        kwargs = {**kwargs, "spec_file": None, "spec_data": load_spec_file(kwargs["spec_file"])}
    spec = resolve_spec(**kwargs)
    if not kwargs.get("validate", True):
        return spec
    spec = choose_placement(choose_limits(spec), lambda tp: choose_limits(resolve_spec(**{**kwargs, "tp": tp})))
    return check_spec_fits(spec)


def _check_input_files(spec: BuildSpec) -> None:
    """Rule of ours: file inputs exist and parse before anything is downloaded (the calibrate stage reads them
    again; this only fails early)."""
    if spec.quantization.calib_data is not None:
        load_texts(spec.quantization.calib_data)
