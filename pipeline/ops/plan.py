"""`plan`'s work above the planner: the build resources of a spec, and the SLO search (`slo_plan`) fed by a bench
report and a precision search, its pick written as a spec file every `check` rule accepts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.artifacts import engines_dir, replace_file
from pipeline.core.errors import IntegrityError, SpecError
from pipeline.core.manifests import PrecisionSearch
from pipeline.core.spec import BuildSpec
from pipeline.planning import planner
from pipeline.planning.fleet import Routing
from pipeline.planning.speculation_modes import measured_mode

if TYPE_CHECKING:
    from pipeline.planning.slo_search import SloSearch


def plan_resources(spec: BuildSpec):
    """The disk per stage and calibration memory of `spec` (`plan`'s resources; nothing on disk is consulted)."""
    from pipeline.stages import host_check, resources

    return resources.plan_resources(spec, resources.SizeInputs(repo_code_bytes=host_check.repo_code_bytes()))


@dataclass(frozen=True)
class SloRequest:
    """`plan --slo`: the SLO, the traffic terms (None: from the bench report, else the defaults) and the files."""

    ttft_ms: float | None
    tpot_ms: float | None
    input_len: int | None = None
    output_len: int | None = None
    rate: float | None = None
    acceptance: float | None = None
    prefix_share: float | None = None
    bench_report: str | None = None
    accept_foreign_bench_report: bool = False
    precision_search: str | None = None
    routing: Routing | None = None  # the replicas' router and the prefixes' shape (None: round-robin, 1 prefix)
    disagg: bool = True  # also search disaggregated units (`--serving-mode auto`)


def slo_plan(spec: BuildSpec, r: SloRequest) -> SloSearch:
    """The cheapest configuration of `spec`'s model meeting the SLO (pipeline.planning.slo_search); SpecError naming
    the nearest miss when none does."""
    from pipeline.planning import disagg, slo_search
    from pipeline.stages.calibrate.quality_records import quality_verdicts
    from pipeline.stages.check import resolve_checked_spec

    if r.ttft_ms is None or r.tpot_ms is None:
        raise SpecError("plan --slo needs --ttft-ms and --tpot-ms (the SLO to meet)")
    goal = slo_search.Slo(r.ttft_ms, r.tpot_ms)
    lengths = planner.request_lengths(spec, r.input_len, r.output_len)
    fixed = spec.quantization.precision if "precision" in spec.quantization.model_fields_set else None
    measured = slo_search.read_bench_terms(r.bench_report, model=spec.model.name, precision=fixed,
                                           accept_foreign=r.accept_foreign_bench_report) if r.bench_report else {}
    acceptance = r.acceptance if r.acceptance is not None else measured.get("acceptance")
    prefix_share = r.prefix_share if r.prefix_share is not None else measured.get("prefix_share", 0.0)
    mode = measured_mode(spec) if r.acceptance is not None else measured.get("mode", measured_mode(spec))
    given = spec.speculation_mode if {"draft", "speculative_decoding"} & spec.speculation.model_fields_set else None
    if given is not None and mode != given and r.acceptance is None and "acceptance" in measured:
        raise SpecError(f"--bench-report {r.bench_report} measured {mode} speculation, but the spec fixes {given}: "
                        f"its acceptance is not {given}'s; pass the report of a {given} build (`invoke bench "
                        "--json-file`), or drop --draft/--speculative-decoding to search every mode")
    traffic = slo_search.Traffic(*lengths, rate=r.rate, acceptance=acceptance, prefix_share=prefix_share,
                                 measured_mode=mode, routing=r.routing or Routing())
    passing, source = passing_precisions(spec, r.precision_search)
    quality = quality_verdicts(spec.model.name) | dict.fromkeys(passing or (), True)
    result = slo_search.search(spec, goal, traffic, check=resolve_checked_spec, precisions=passing,
                               precision_source=source, quality=quality)
    if result.pick is None:
        nearest = f"; nearest miss: {result.nearest_miss}" if result.nearest_miss else ""
        raise SpecError(f"plan --slo: no configuration of {spec.model.name} on {spec.hardware.gpu} meets TTFT <= "
                        f"{goal.ttft_ms:g} ms and TPOT <= {goal.tpot_ms:g} ms{nearest}; relax the SLO or allow more "
                        "GPUs (--gpu-count, --nodes)")
    if r.disagg:
        result.serving_modes = disagg.serving_modes(spec, result, check=resolve_checked_spec)
    return result


def passing_precisions(spec: BuildSpec, path: str | None) -> tuple[tuple[str, ...] | None, str]:
    """The precisions that passed a `--precision auto` build's quality gate (`path`, else the newest such record of
    this spec's model, GPU, runtime and gate threshold under engines/), and where they came from; (None,
    "searched") when there is none."""
    from pipeline.planning import slo_search

    if path:
        record = PrecisionSearch.read(Path(path))
        if record is None:
            raise SpecError(f"--precision-search {path} does not exist; pass the precision_search.json a "
                            "`--precision auto` build wrote")
        return slo_search.passing_precisions(record, spec, Path(path)), f"passed the quality gate: {path}"
    found = sorted(engines_dir().glob("*/precision_search.json"), key=lambda f: f.stat().st_mtime, reverse=True)
    for f in found:
        try:
            record = PrecisionSearch.read(f)
        except IntegrityError:
            continue
        if record and not record.differences(spec):
            return slo_search.passing_precisions(record, spec, f), f"passed the quality gate: {f}"
    return None, "searched"


def check_pick_path(path: str) -> Path:
    """Where `--write-spec` may write: a .yaml path in an existing directory (checked before the search)."""
    dest = Path(path)
    if dest.suffix not in (".yaml", ".yml") or dest.is_dir():
        raise SpecError(f"--write-spec {path}: expected a .yaml file path")
    if not dest.parent.is_dir():
        raise SpecError(f"--write-spec {path}: directory {dest.parent} does not exist; create it first")
    return dest


def write_pick(spec: BuildSpec, result: SloSearch, path: str) -> Path:
    """Write the search's pick as a spec YAML with its `serving_target` (replicas, SLO, traffic, estimate),
    atomically, after loading it back through the real spec loader and every `check` rule (a file that
    `check --spec` would refuse is never left behind). SpecError when the search picked nothing."""
    import yaml

    from pipeline.planning import disagg, slo_search
    from pipeline.stages.check import resolve_checked_spec

    pick = result.pick
    if pick is None:
        raise SpecError(f"--write-spec {path}: the search picked no configuration, so there is no spec to write")
    dest = check_pick_path(path)
    modes = result.serving_modes
    if isinstance(modes, disagg.ServingModes) and modes.disagg is not None and modes.winner == "disagg":
        overrides, target = disagg.written_unit(spec, result, modes.disagg)
        label = "disaggregated " + modes.disagg.label()
    else:
        overrides = slo_search.layout_overrides(spec, pick.structure(), batch=pick.max_batch)
        target, label = slo_search.serving_target(result), pick.label()
    doc = slo_search.spec_document(overrides)
    doc["serving_target"] = target.model_dump(mode="json", exclude_none=True)
    text = "# plan --slo pick: " + label + "\n" + yaml.safe_dump(doc, sort_keys=False)

    def write(tmp: Path) -> None:
        tmp.write_text(text)
        resolve_checked_spec(spec_file=tmp)

    return replace_file(dest, write)
