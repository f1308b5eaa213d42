"""`precision: auto`: calibrate the candidates most precise first and keep the cheapest that passes the quality gate.

The rule (step 3 of the cost workflow): a cheaper precision is taken when its held-out perplexity delta stays within
the gate (`max_ppl_delta_pct`, 1 % by default); otherwise step up. On FP8 GPUs that is FP8 first, then INT4-AWQ only
while FP8 holds (`spec.auto_ladder`). Each candidate is a real calibrate run, judged here against the gate: one that passes
is the cached checkpoint the build then reuses; one that fails is kept too, its manifest saying so (a re-run reads
its delta instead of calibrating again; a build at that precision with the gate on refuses it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.core.errors import CalibrationError, QualityGateFailed
from pipeline.core.layout import precision_search_file
from pipeline.core.manifests import PrecisionCandidate, PrecisionSearch
from pipeline.core.spec import BuildSpec
from pipeline.stages.calibrate.stage import CheckpointResult, run_calibrate
from pipeline.stages.download.stage import DownloadResult


@dataclass(frozen=True)
class PrecisionChoice:
    """The spec at the chosen precision (not yet re-checked for limits and fit), its checkpoint and the record."""

    spec: BuildSpec
    checkpoint: CheckpointResult
    record: PrecisionSearch


def _try(spec: BuildSpec, source: DownloadResult | None, verify: bool, threshold: float) -> tuple[
        PrecisionCandidate, CheckpointResult]:
    """Calibrate one candidate, the gate recorded but not enforced, and judge it against `threshold` here: a
    candidate that fails stays a complete checkpoint whose manifest says so, so a re-run reads its delta instead of
    calibrating it again (a build at that precision with the gate on still refuses it)."""
    ungated = spec.model_copy(update={"quantization": spec.quantization.model_copy(update={"quality_gate": False})})
    res = run_calibrate(ungated, role="target", source=source, verify=verify)
    q, m = spec.quantization, res.manifest
    delta = m.quality.ppl_delta_pct
    return PrecisionCandidate(precision=q.precision, kv_cache=q.kv, ppl_delta_pct=delta,
                              passed=delta <= threshold, build_id=m.build_id), res


def choose_precision(spec: BuildSpec, *, source: DownloadResult | None = None, verify: bool = False,
                     say: Callable[[str], None] = lambda line: None) -> PrecisionChoice:
    """Calibrate `spec.auto_precision`'s candidates in order while each passes the gate; choose the last that passed.

    Args:
        spec: a spec resolved with `precision: auto`.
        source: the target model's download result (default: `run_calibrate` fetches it).
        verify: re-hash a cached candidate checkpoint before reusing it.
        say: receives one line per candidate (its delta and the verdict).

    Returns:
        The choice; its record is also written to the chosen build's directory (`BuildLayout.precision_search`).

    Raises:
        CalibrationError: `spec` is not `auto`; `QualityGateFailed` when no candidate passes (naming the best delta).
    """
    auto = spec.auto_precision
    if auto is None:
        raise CalibrationError("choose_precision needs a spec resolved with precision=auto")
    threshold = spec.max_ppl_delta_pct
    tried: list[PrecisionCandidate] = []
    best: tuple[BuildSpec, CheckpointResult] | None = None
    for precision in auto.candidates:
        candidate = spec.with_precision(precision)
        row, res = _try(candidate, source, verify, threshold)
        tried.append(row)
        verdict = "passes" if row.passed else "fails"
        say(f"precision auto: {precision} / KV {row.kv_cache}: held-out perplexity delta {row.ppl_delta_pct:+.3f} % "
            f"{verdict} the gate (<= {threshold:g} %)")
        if not row.passed:
            break  # a cheaper candidate is tried only while the more precise one holds
        best = (candidate, res)
    if best is None:
        low = min(tried, key=lambda c: c.ppl_delta_pct)
        raise QualityGateFailed(
            f"precision auto: no candidate passes the quality gate (<= {threshold:g} %): the best, {low.precision}, "
            f"has a held-out perplexity delta of {low.ppl_delta_pct:+.3f} %; use --precision bf16, better "
            "calibration data (--calib-data), or raise --max-ppl-delta",
            expected=threshold, actual=low.ppl_delta_pct)
    chosen, res = best
    record = PrecisionSearch(
        model=spec.model.name, gpu=spec.hardware.gpu, runtime=spec.runtime, threshold_pct=threshold,
        candidates=tried, refused=dict(auto.refused), not_tried=list(auto.candidates[len(tried):]),
        passing=[c.precision for c in tried if c.passed], chosen=chosen.quantization.precision)
    record.write(precision_search_file(res.manifest.build_id))
    say(f"precision auto: chose {record.chosen} (passing: {', '.join(record.passing)})")
    return PrecisionChoice(chosen, res, record)
