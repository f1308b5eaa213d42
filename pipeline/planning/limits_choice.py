"""Engine limits the user left unset, chosen by the memory model: what fits the model on its GPU at its TP.

The registry's sequence lengths are ceilings (already capped by the model's positions); the max batch is the most
requests the KV pool holds at the plan's typical request (1024 in / 256 out, within the limits), at most upstream's
default (`trtllm-build --max_batch_size` 2048), and max_num_tokens is upstream's 8192 per step (at least one whole
prompt). Each choice carries its reason for `check`, `plan` and `build` to print. The spec never imports this
module: the CLI applies it to every spec it resolves (`pipeline.cli.flags.spec_from_flags`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.core.runtimes import runtime_of
from pipeline.planning.planner import plan_capacity

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

UPSTREAM_MAX_BATCH = 2048  # TensorRT-LLM BuildConfig / trtllm-build default max_batch_size
UPSTREAM_MAX_NUM_TOKENS = 8192  # its default max_num_tokens
BATCH_STEP = 8  # a chosen batch is rounded down to a multiple of this (when at least 2 steps)


def with_batch(spec: BuildSpec, batch: int) -> BuildSpec:
    """`spec` at max batch `batch` (no rule applied again)."""
    return spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_batch_size": batch})})


def _fitting_batch(spec: BuildSpec) -> tuple[int | None, str]:
    """The batch the KV pool holds at the plan's typical request with a batch-`UPSTREAM_MAX_BATCH` engine, or None
    with the reason when not even one request fits."""
    at_cap = plan_capacity(with_batch(spec, UPSTREAM_MAX_BATCH))
    where = (f"{spec.parallelism.world_size} x {spec.hardware.gpu} at tp={spec.parallelism.tp} "
             f"pp={spec.parallelism.pp}")
    if not at_cap.fits or at_cap.max_concurrent_requests < 1:
        return None, f"no request fits on {where} (see `plan`'s minimum TP)"
    batch = min(UPSTREAM_MAX_BATCH, at_cap.max_concurrent_requests)
    if batch >= 2 * BATCH_STEP:
        batch -= batch % BATCH_STEP
    length = f"{at_cap.input_len}+{at_cap.output_len}-token requests"
    if batch == UPSTREAM_MAX_BATCH:
        why = f"upstream's default {UPSTREAM_MAX_BATCH}: the KV pool on {where} holds more {length}"
    else:
        why = (f"the KV pool on {where} holds {at_cap.max_concurrent_requests:,} {length} "
               f"(under upstream's {UPSTREAM_MAX_BATCH})")
    return batch, why


def choose_limits(spec: BuildSpec, *, validate: bool = True) -> BuildSpec:
    """`spec` with its unset max batch chosen by the memory model (target trtllm) and `limit_reasons` saying
    where every engine limit comes from. Given values are kept as given; `validate`: the spec's rules are checked
    again at the chosen batch (its warnings replaced).

    Raises:
        SpecError: the chosen batch breaks a rule of the spec (`pipeline.core.spec_rules`).
    """
    given = spec.limits.model_fields_set - set(spec.limit_reasons)  # a chosen value may be chosen again
    positions = spec.model.architecture.max_position_embeddings
    reasons: dict[str, str] = {}
    if "max_seq_len" not in given:
        reasons["max_seq_len"] = (f"the registry's ceiling for {spec.model.name} (model positions "
                                  f"{positions:,})")
    if "max_input_len" not in given:
        reasons["max_input_len"] = f"the registry's ceiling for {spec.model.name} (at most max_seq_len)"
    if "max_num_tokens" not in given:
        reasons["max_num_tokens"] = (f"upstream's default {UPSTREAM_MAX_NUM_TOKENS} tokens per step, at least one "
                                     "whole prompt (max_input_len)")
    chosen = spec
    if "max_batch_size" not in given:
        if not runtime_of(spec).gpu:
            reasons["max_batch_size"] = ("the registry's value: the reference target serves on CPU, where the GPU "
                                         "memory model does not apply")
        else:
            batch, why = _fitting_batch(spec)
            if batch is None:
                reasons["max_batch_size"] = f"the registry's value: {why}"
            else:
                if spec.speculation_mode is not None:
                    above = ("plain decoding above it (the LLM API's max_concurrency)" if runtime_of(spec).llmapi
                             else "heavier traffic through the plain ensemble")
                    why += (f"; {spec.speculation_mode} speculation runs up to batch "
                            f"{spec.speculation.max_batch_for_speculation}, {above}")
                chosen = with_batch(chosen, batch)
                reasons["max_batch_size"] = why
    chosen = chosen.with_notes(limit_reasons=reasons)
    if chosen.max_batch_size != spec.max_batch_size and validate:
        chosen = chosen.revised()  # the rules again, at the chosen batch (not warning about it)
    return chosen


def _values(spec: BuildSpec) -> dict[str, int]:
    return {"max_batch_size": spec.max_batch_size, "max_input_len": spec.max_input_len,
            "max_seq_len": spec.max_seq_len, "max_num_tokens": spec.base_max_num_tokens}


def limit_lines(spec: BuildSpec) -> list[str]:
    """`limits: NAME=VALUE (reason)` for each limit the memory model or a default chose."""
    values = _values(spec)
    return [f"limits: {name}={values[name]:,} ({why})" for name, why in spec.limit_reasons.items()]


def limits_record(spec: BuildSpec) -> dict[str, dict[str, Any]]:
    """Every engine limit with its value and where it comes from (plan's JSON)."""
    return {name: {"value": value, "reason": spec.limit_reasons.get(name, "given")}
            for name, value in _values(spec).items()}
