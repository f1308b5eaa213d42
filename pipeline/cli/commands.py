"""What each task does and prints. `pipeline.cli.console` only wires these to invoke
(`pipeline.cli.flags.command_task`).

Each function's docstring is its task's help: its first sentence for `--list`, the `Args:` section for the flags.
A function whose first parameter is `spec` also takes every spec flag and receives the validated `BuildSpec`.
Only what every task needs (the spec, the planner) is imported here; each task's own stage, serving and ops modules
are lazy (`_lazy`: executed on first use), and torch, ModelOpt, transformers and tritonclient load inside the stages.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline import __version__
from pipeline.backends import PackageInputs, backend_for
from pipeline.cli.flags import int_option
from pipeline.core.artifacts import engines_dir, replace_file, triton_repo_dir
from pipeline.core.errors import BenchError, DeployError, PipelineError, ServeError, ServerFailed, SpecError
from pipeline.core.layout import PENDING, SPEC_KEY_CHARS, release_file
from pipeline.core.registry import MAX_DRAFT_LEN
from pipeline.core.spec import (
    MAX_NODES,
    MAX_RATE,
    MAX_REPLICAS,
    MAX_REQUEST_TOKENS,
    MAX_SLO_MS,
    BuildSpec,
)
from pipeline.core.table import format_table
from pipeline.planning import planner
from pipeline.planning.limits_choice import choose_limits, limit_lines, limits_record

if TYPE_CHECKING:
    from pipeline.stages.package.launch_plan import Endpoints, LaunchPlan
    from pipeline.stages.package.serve_plan import TrtllmServePlan
    from pipeline.serving.serve import TritonServer


def _lazy(name: str):
    """Module `name`, executed on first attribute access: keeps every task's start-up (e.g. `download`) free of
    the modules only other tasks use."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)  # as an import does: `pipeline.x.y` resolves by attribute too
    spec.loader.exec_module(module)
    return module


aiconfigurator = _lazy("pipeline.planning.aiconfigurator")
aiperf_lib = _lazy("pipeline.serving.aiperf")
bench_lib = _lazy("pipeline.serving.bench")
build_stage = _lazy("pipeline.stages.build")
calibrate_stage = _lazy("pipeline.stages.calibrate.stage")
compile_plan = _lazy("pipeline.stages.compile.engine_plan")
compile_preflight = _lazy("pipeline.stages.compile.preflight")
compile_stage = _lazy("pipeline.stages.compile.stage")
deploy_names = _lazy("pipeline.ops.deploy.names")
deploy_render = _lazy("pipeline.ops.deploy.render")
deploy_scheduling = _lazy("pipeline.ops.deploy.scheduling")
deploy_source = _lazy("pipeline.ops.deploy.source")
deploy_topology = _lazy("pipeline.ops.deploy.topology")
download_stage = _lazy("pipeline.stages.download.stage")
host_lib = _lazy("pipeline.core.host")
host_fit = _lazy("pipeline.stages.host_check")
install_lib = _lazy("pipeline.stages.package.install")
launch_plan = _lazy("pipeline.stages.package.launch_plan")
local_inputs = _lazy("pipeline.serving.llmapi.local_inputs")
placement_lib = _lazy("pipeline.planning.placement")
plan_compare = _lazy("pipeline.planning.compare")
quality_records = _lazy("pipeline.stages.calibrate.quality_records")
refs = _lazy("pipeline.core.refs")
release_ops = _lazy("pipeline.ops.release")
release_verify = _lazy("pipeline.ops.release_verify")
resources_lib = _lazy("pipeline.stages.resources")
serve_lib = _lazy("pipeline.serving.serve")
serve_plan = _lazy("pipeline.stages.package.serve_plan")
smoke_lib = _lazy("pipeline.serving.smoke")
slo_search = _lazy("pipeline.planning.slo_search")
check_stage = _lazy("pipeline.stages.check")

MAX_SECONDS = 86_400.0  # a timeout or a time budget: a day
MAX_SEED = 2**32 - 1
MAX_PORT = 65_535



Stage = Literal["check", "download", "calibrate", "compile", "package"]  # pipeline.stages.build.STAGES


def _path(p: str | Path | None) -> Path | None:
    return Path(p) if p else None


def check_command(spec: BuildSpec, *, skip_host_check=False) -> None:
    """Validate a build spec (model, precision, KV, parallelism, speculation, GPU) and print it in one line; then
    check that this host has the GPU memory, RAM and disk to build it (exit 4 naming the numbers and ways out).

    Then each engine limit left unset, on stderr with its value and why (`limits: ...`).

    Args:
        skip_host_check: validate the spec only (e.g. for another host); the host line is not printed
    """
    print(spec.summary())
    for precision, why in spec.auto_precision.refused if spec.auto_precision else ():
        print(f"precision auto: {precision} is not a candidate: {why}", file=sys.stderr)
    if not skip_host_check:
        stages = build_stage.stage_range(until=None, from_stage=None, force=None, target=spec.target,
                                         runtime=spec.runtime)
        print(host_fit.check_host_fits(spec, stages=stages).summary(), file=sys.stderr)
    if spec.placement_reason:
        print(f"placement: {spec.placement_reason}", file=sys.stderr)
    for line in limit_lines(spec):
        print(line, file=sys.stderr)


def resources_section(spec: BuildSpec):
    """The disk per stage and calibration memory of `spec` (`plan`'s resources; nothing on disk is consulted)."""
    return resources_lib.plan_resources(spec, resources_lib.SizeInputs(repo_code_bytes=host_fit.repo_code_bytes()))


def _tokens_option(name: str, value: Any) -> int | None:
    """A token count option (--input-len, --output-len, --max-tokens): an integer within 1..`MAX_REQUEST_TOKENS`."""
    return int_option(name, value, maximum=MAX_REQUEST_TOKENS)


def plan_command(spec: BuildSpec, *, input_len: int | None = None, output_len: int | None = None, json_=False,
                 compare=False, acceptance: float | None = None, prefix_hit: float | None = None,
                 estimator: Literal["aiconfigurator"] | None = None, slo=False, ttft_ms: float | None = None,
                 tpot_ms: float | None = None, prefix_share: float | None = None, rate: float | None = None,
                 bench_report: str | None = None, write_spec: str | None = None,
                 precision_search: str | None = None, accept_foreign_bench_report=False) -> None:
    """Plan memory fit, KV capacity, concurrency, estimated TTFT/TPOT/throughput, the decode roofline (an upper
    bound) and $ per 1M output tokens.

    Args:
        input_len: prompt tokens per request for capacity/throughput (default min(1024, max_input_len))
        output_len: output tokens per request (default 256)
        json_: print the plan as JSON
        compare: a table over precisions (bf16/fp8/int4_awq/w4a8_awq), TP sizes and draft off/on for this model
            and GPU, with speculation's speed-up, prefix reuse's prefill saving and estimated $ per 1M tokens
        acceptance: draft acceptance rate for the estimate, 0..1 (default 0.7; `invoke bench` measures it)
        prefix_hit: prefix-cache hit ratio for the estimate, 0..1 (default 0)
        estimator: "aiconfigurator": also run NVIDIA AIConfigurator 0.12 on the same case (installed into its own
            venv under the pipeline cache on first use) and print both estimates side by side
        slo: search precision x TP x PP x max batch x draft/K (x runtime) for the cheapest configuration meeting
            --ttft-ms and --tpot-ms at this traffic; print it, the Pareto front and why the others lose (exit 2
            naming the nearest miss when none meets the SLO). Flags the spec sets (--precision, --tp, ...) stay fixed
        ttft_ms: --slo: time to first token to meet, ms
        tpot_ms: --slo: time per output token to meet, ms
        prefix_share: --slo: share of each prompt a cached prefix covers, 0..1 (default: --bench-report's hit ratio,
            else --prefix-hit, else 0)
        rate: --slo: requests per second to serve (replicas are provisioned for it); default: fully loaded
        bench_report: --slo: the `invoke bench --json-file` report whose acceptance_rate and prefix_cache_hit_ratio
            feed the search (--acceptance and --prefix-share win); its model (and precision, when --precision is given)
            must be the spec's
        accept_foreign_bench_report: --slo: take a --bench-report of another (or an unnamed) model or precision
        write_spec: --slo: write the pick as a spec YAML that `invoke build --spec` and `invoke check --spec` take
        precision_search: --slo: a `--precision auto` build's precision_search.json: only the precisions that
            passed its quality gate are searched (default: the newest such record of this model and GPU under
            engines/, else bf16/fp8/int4_awq/w4a8_awq)
    """
    if slo:
        if compare or estimator:
            raise SpecError("--slo searches on its own: drop --compare / --estimator (run them on its pick)")
        if prefix_share is None:  # --prefix-hit stands in, refused under its own name
            prefix_share = int_option("prefix_hit", prefix_hit, minimum=0.0, maximum=1.0, kind=float)
        return plan_slo(spec, input_len=input_len, output_len=output_len, json_=json_, acceptance=acceptance,
                        prefix_share=prefix_share, ttft_ms=ttft_ms, tpot_ms=tpot_ms, rate=rate,
                        bench_report=bench_report, write_spec=write_spec, precision_search=precision_search,
                        accept_foreign_bench_report=accept_foreign_bench_report)
    if any(v is not None for v in (ttft_ms, tpot_ms, prefix_share, rate, bench_report, write_spec,
                                   precision_search)) or accept_foreign_bench_report:
        raise SpecError("--ttft-ms, --tpot-ms, --prefix-share, --rate, --bench-report, --write-spec, "
                        "--precision-search and --accept-foreign-bench-report belong to --slo; add --slo")
    lengths = dict(input_len=_tokens_option("input_len", input_len),
                   output_len=_tokens_option("output_len", output_len))
    terms = dict(acceptance=int_option("acceptance", acceptance, default=planner.DEFAULT_ACCEPTANCE, kind=float,
                                       minimum=0.0, maximum=1.0),
                 prefix_hit_ratio=int_option("prefix_hit", prefix_hit, default=0.0, kind=float, minimum=0.0,
                                             maximum=1.0))
    if estimator not in (None, "", "aiconfigurator"):
        raise SpecError(f"--estimator={estimator!r}: the only second estimator is 'aiconfigurator'; drop the flag "
                        "for the built-in estimate alone")
    if compare:
        if estimator:
            raise SpecError("--estimator and --compare do not combine: run --estimator on one configuration")
        c = plan_compare.compare_plans(spec, **lengths, **terms)
        print(json.dumps(c.as_dict(), indent=2) if json_ else plan_compare.format_comparison(c))
        return
    result = planner.plan_capacity(spec, **lengths, **terms)
    other = aiconfigurator.second_opinion(result, tokens_per_block=spec.limits.tokens_per_block) if estimator else None
    resources = resources_section(spec)
    if json_:
        data = result.as_dict() | ({"aiconfigurator": other.model_dump()} if other else {})
        print(json.dumps(data | {"limits": limits_record(spec), "placement": spec.placement_reason or "given",
                                 "resources": resources.as_dict()}, indent=2))
        return
    print(planner.format_capacity_plan(result))
    if spec.placement_reason:
        print(f"\nplacement (no --tp given): {spec.placement_reason}")
    print("\n".join(["", "engine limits", *(line.removeprefix("limits: ") for line in limit_lines(spec))]))
    if other is not None:
        print()
        print(aiconfigurator.format_side_by_side(result, other))
    print("\nbuild resources\n" + host_fit.format_resources(resources))


def plan_slo(spec: BuildSpec, *, input_len, output_len, json_: bool, acceptance, prefix_share, ttft_ms, tpot_ms,
             rate, bench_report: str | None, write_spec: str | None, precision_search: str | None = None,
             accept_foreign_bench_report: bool = False) -> None:
    """`plan --slo`: the search (pipeline.planning.slo_search) over `spec`, printed; the pick written as a spec."""
    if ttft_ms is None or tpot_ms is None:
        raise SpecError("plan --slo needs --ttft-ms and --tpot-ms (the SLO to meet)")
    goal = slo_search.Slo(int_option("ttft_ms", ttft_ms, minimum=1e-9, maximum=MAX_SLO_MS, kind=float),
                          int_option("tpot_ms", tpot_ms, minimum=1e-9, maximum=MAX_SLO_MS, kind=float))
    rate = int_option("rate", rate, minimum=1e-9, maximum=MAX_RATE, kind=float)
    acceptance = int_option("acceptance", acceptance, minimum=0.0, maximum=1.0, kind=float)
    prefix_share = int_option("prefix_share", prefix_share, minimum=0.0, maximum=1.0, kind=float)
    lengths = planner.request_lengths(spec, _tokens_option("input_len", input_len),
                                      _tokens_option("output_len", output_len))
    fixed = spec.quantization.precision if "precision" in spec.quantization.model_fields_set else None
    measured = slo_search.read_bench_terms(bench_report, model=spec.model.name, precision=fixed,
                                           accept_foreign=bool(accept_foreign_bench_report)) if bench_report else {}
    if acceptance is None:
        acceptance = measured.get("acceptance", planner.DEFAULT_ACCEPTANCE)
    if prefix_share is None:
        prefix_share = measured.get("prefix_share", 0.0)
    terms = dict(acceptance=acceptance, prefix_share=prefix_share)
    traffic = slo_search.Traffic(*lengths, rate=rate, **terms)
    passing, source = _passing_precisions(spec, precision_search)
    quality = quality_records.quality_verdicts(spec.model.name) | dict.fromkeys(passing or (), True)
    result = slo_search.search(spec, goal, traffic, check=check_stage.resolve_checked_spec, precisions=passing,
                               precision_source=source, quality=quality)
    if result.pick is None:
        nearest = f"; nearest miss: {result.nearest_miss}" if result.nearest_miss else ""
        raise SpecError(f"plan --slo: no configuration of {spec.model.name} on {spec.hardware.gpu} meets TTFT <= "
                        f"{goal.ttft_ms:g} ms and TPOT <= {goal.tpot_ms:g} ms{nearest}; relax the SLO or allow more "
                        "GPUs (--gpu-count, --nodes)")
    written = write_pick(spec, result, write_spec) if write_spec else None
    if json_:
        print(json.dumps(result.as_dict() | {"spec_file": str(written) if written else None}, indent=2))
        return
    print(slo_search.format_search(result))
    if written:
        print(f"spec: {written} (`invoke check --spec {shlex.quote(str(written))}`, then `invoke build --spec ...`)")


def _passing_precisions(spec: BuildSpec, path: str | None) -> tuple[tuple[str, ...] | None, str]:
    """The precisions that passed a `--precision auto` build's quality gate (`--precision-search FILE`, else the
    newest such record of this spec's model, GPU, runtime and gate threshold under engines/), and where they came
    from; (None, "searched") when there is none."""
    from pipeline.core.errors import IntegrityError
    from pipeline.core.manifests import PrecisionSearch

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


def write_pick(spec: BuildSpec, result: slo_search.SloSearch, path: str) -> Path:
    """Write the search's pick as a spec YAML with its `serving_target` (replicas, SLO, traffic, estimate),
    atomically, after loading it back through the real spec loader and every `check` rule (a file that
    `check --spec` would refuse is never left behind)."""
    import yaml

    pick = result.pick
    dest = Path(path)
    if dest.suffix not in (".yaml", ".yml") or dest.is_dir():
        raise SpecError(f"--write-spec {path}: expected a .yaml file path")
    if not dest.parent.is_dir():
        raise SpecError(f"--write-spec {path}: directory {dest.parent} does not exist; create it first")
    doc = slo_search.spec_document(slo_search.layout_overrides(spec, pick.structure(), batch=pick.max_batch))
    doc["serving_target"] = slo_search.serving_target(result).model_dump(mode="json", exclude_none=True)
    text = "# invoke plan --slo pick: " + pick.label() + "\n" + yaml.safe_dump(doc, sort_keys=False)

    def write(tmp: Path) -> None:
        tmp.write_text(text)
        check_stage.resolve_checked_spec(spec_file=tmp)

    return replace_file(dest, write)


# --- compile ---------------------------------------------------------------------------------------------------------
def engine_dirs_for(checkpoint_dir: Path, spec: BuildSpec) -> tuple[Path, Path]:
    """engines/<build-id>/engine and draft_engine for a checkpoint at engines/<build-id>/checkpoint.

    A checkpoint elsewhere (--checkpoint-dir) gets engines/<model>-<precision>-ext-<hash12 of its path>/.
    """
    checkpoint_dir = Path(checkpoint_dir).resolve()
    if checkpoint_dir.name == "checkpoint":
        base = checkpoint_dir.parent
    else:
        digest = hashlib.sha256(str(checkpoint_dir).encode()).hexdigest()[:12]
        base = engines_dir() / f"{spec.model.name}-{spec.quantization.precision}-ext-{digest}"
    return base / "engine", base / "draft_engine"


def locate_checkpoints(
    spec: BuildSpec, *, checkpoint_dir: str | None, draft_checkpoint_dir: str | None, dry_run: bool
) -> tuple[Path, Path | None]:
    """Explicit directories win; else the calibrate stage's current outputs (check-only: never calibrates); a dry
    run plans without them."""
    target = _path(checkpoint_dir)
    draft = _path(draft_checkpoint_dir)
    need_draft = spec.draft_model is not None and draft is None
    if target is not None and not need_draft:
        return target, draft
    if dry_run:
        target = target or engines_dir() / PENDING / "checkpoint"
        if need_draft:
            draft = engines_dir() / f"{PENDING}-draft" / "checkpoint"
        return target, draft
    out = build_stage.locate_outputs(spec, until="calibrate")
    target = target or out.checkpoint.path
    if need_draft:
        draft = out.draft_checkpoint.path
    return target, draft


def compile_command(spec: BuildSpec, *, dry_run=False, checkpoint_dir=None, draft_checkpoint_dir=None, force=False,
                    json_=False) -> dict[str, Any]:
    """Compile TensorRT-LLM 1.2.1 engines (target + draft) for SM 90 from the exported checkpoint(s).

    Args:
        dry_run: print the trtllm-build plan (argv, expected outputs, GPU memory) and exit; works on any machine
        checkpoint_dir: target TensorRT-LLM checkpoint dir (default: the calibrate stage's engines/<build-id>/checkpoint)
        draft_checkpoint_dir: draft checkpoint dir (default: the calibrate stage's draft checkpoint)
        force: rebuild even when the engine manifest's key is current
        json_: print the plan / engine manifest as JSON
    """
    if not dry_run:  # fail fast (< 1 s on a CPU host) before locating anything
        world = spec.parallelism.world_size
        workers = max(1, min(world, spec.hardware.gpu_count))
        toolchain = compile_preflight.preflight(gpu=spec.hardware.gpu, workers=workers)
    target, draft = locate_checkpoints(spec, checkpoint_dir=checkpoint_dir,
                                       draft_checkpoint_dir=draft_checkpoint_dir, dry_run=dry_run)
    engine_dir, draft_engine_dir = engine_dirs_for(target, spec)
    dirs = dict(checkpoint_dir=target, output_dir=engine_dir, draft_checkpoint_dir=draft,
                draft_output_dir=draft_engine_dir if draft else None)
    if dry_run:
        plan = compile_plan.plan_compile(spec, **dirs, allow_derived=True)
        print(plan.to_json() if json_ else plan.format())
        return plan.as_dict()
    res, draft_res = compile_stage.run_compile(spec, checkpoint=target, output_dir=engine_dir,
                                               draft_checkpoint=draft, draft_output_dir=dirs["draft_output_dir"],
                                               force=force, toolchain=toolchain)
    if checkpoint_dir is None and draft_checkpoint_dir is None:  # the spec's own build: point its ref here
        refs.write_ref("compile", spec.identity("compile"), {"engine": res, "draft_engine": draft_res})
    m = res.manifest
    if json_:
        print(json.dumps(m.model_dump(mode="json"), indent=2))
    else:
        print(f"ok: target engine {res.path} {res.status} (key {m.key[:12]}, TensorRT-LLM {m.engine_version}, "
              f"SM {m.gpu.sm})")
        if draft_res is not None:
            print(f"ok: draft engine {draft_res.path} {draft_res.status} (key {draft_res.manifest.key[:12]}, "
                  "tokenizer shared)")
    return m.model_dump(mode="json")


# --- build / release / verify / bench --------------------------------------------------------------------------------
def build_command(spec: BuildSpec, *, until: Stage | None = None, from_: Stage | None = None,
                  force: Stage | None = None, json_=False, offline=False, update=False, verify_download=False,
                  verify=False, revision=None, endpoint=None, skip_host_check=False) -> None:
    """Build end to end: check -> download -> calibrate -> compile (trtllm) -> package; cached stages are no-ops.

    With `--precision auto` the candidates are calibrated first (FP8, then INT4-AWQ while the quality gate holds),
    each one's perplexity delta printed; the build goes on at the cheapest that passes.

    A stage is cached only when its output still matches its manifest; one that does not fails (exit 3) naming
    `--force STAGE`.

    Args:
        until: last stage to run
        from_: first stage to run; earlier stages must already be current (they are located, not run)
        force: rebuild this stage and every stage after it even when current
        json_: print the build report as JSON on stdout (progress stays on stderr)
        offline: download: use only the local cache
        update: download: re-resolve a branch revision to its newest commit
        verify_download: download: re-hash every cached file
        verify: re-hash every stage output (sha256), not only sizes and mtimes, before reusing it
        revision: download: model revision (branch, tag or commit) overriding the registry's
        endpoint: download: Hugging Face Hub endpoint URL
        skip_host_check: do not compare GPU memory, RAM and disk with what the stages need (unusual setups)
    """
    host_check = None if skip_host_check else (
        lambda stages: host_fit.check_host_fits(spec, stages=stages, force=force).summary())
    opts = build_stage.BuildOptions(offline=offline, update=update, verify_download=verify_download, verify=verify,
                                    revision=revision, endpoint=endpoint)
    with contextlib.redirect_stdout(sys.stderr):  # stages' library chatter must not corrupt --json on stdout
        report = build_stage.build(spec, until=until, from_stage=from_, force=force, options=opts,
                                   host_check=host_check)
    if json_:
        print(json.dumps(report.as_dict() | {"limits": limits_record(report.spec)}, indent=2))


def release_command(spec: BuildSpec, *, output=None, version=None, json_=False) -> None:
    """Pack a finished build as a deterministic, versioned release tarball + .sha256 (run `invoke build` first).

    Every packed file is re-hashed against its stage manifest; a mismatch refuses the release (exit 3).

    Args:
        output: directory for the tarball: any directory, absolute or relative to the output tree (default releases/)
        version: release version: letters, digits and . _ + - (default: the pipeline's version)
        json_: print release.json's summary as JSON
    """
    r = release_ops.release(spec, output=output, version=version)
    files = len(r.document["files"])
    if json_:
        doc = {k: v for k, v in r.document.items() if k != "files"}
        print(json.dumps({"tarball": str(r.tarball), "sha256": r.sha256, "files": files, "release": doc}, indent=2))
    else:
        print(f"ok: {r.tarball} sha256 {r.sha256} ({files} files)")


def verify_command(path, *, skip_host=False, sha256=None, json_=False) -> None:
    """Check every sha256 of a release or repo (complete: no extra file, no symlink) and refuse engines built for
    another toolchain/GPU. Exit 3: files differ; 4: host mismatch; 2: not a release.

    Args:
        path: release .tar (or an earlier .tar.gz), unpacked release dir, or Triton model repository
        skip_host: check hashes only, not the host's TensorRT-LLM/TensorRT/GPU against the engines
        sha256: the tarball's expected sha256 (e.g. pinned by deploy), checked in the same read as its members
        json_: print the verification report as JSON
    """
    if path.startswith("-"):  # `invoke verify --help` hands the flag over as the positional path
        raise SpecError(f"{path} is not a path; usage: invoke verify PATH [--skip-host] [--json] "
                        "(help: invoke --help verify)")
    report = release_verify.verify(path, check_host=not skip_host, sha256=sha256)
    if json_:
        print(json.dumps(report.as_dict(), indent=2))
        return
    host = "host matches" if report.host_checked else "host not checked"
    print(f"ok: {report.kind} {path}: {report.files_checked} files verified; {host}")
    for note in report.notes:
        print(f"note: {note}")


def bench_command(spec: BuildSpec, *, url=None, metrics_url=None, repo=None, model_name=None,
                  concurrency: list[int] | None = None, requests: int | None = None, max_tokens: int | None = None,
                  no_stream=False, budget: float | None = None, json_=False, json_file=None, plot=None,
                  shared_prefix_tokens: int | None = None, shared_prefix_share: float | None = None,
                  speculation: Literal["server", "off", "both"] | None = None, dataset=None,
                  request_rate: float | None = None, seed: int | None = None, http_url=None,
                  second_opinion: Literal["aiperf"] | None = None) -> None:
    """Benchmark a Triton deployment: TTFT, time per token, tok/s, p50/p99, $ per 1M output tokens.

    The report ends with the figures an SLO is written in (P99 TTFT, P95 TPOT), the input/output token length
    distributions, the acceptance rate and the prefix-cache hit ratio (`--json`: top-level keys of the same names).
    Every level (and both arms of `--speculation both`) replays the same requests: a seeded sample of the dataset
    (or the built-in prompts), each asking for exactly its output length where the route takes `min_tokens`; the
    report's per-level `workload_sha256` names them.

    `--second-opinion aiperf` then sends every level's requests again with NVIDIA AIPerf (its own venv, installed
    on first use) and prints both tools' TTFT p50/p99, TPOT p50 and output tok/s side by side (`--json`: an
    `aiperf` key per level).

    Exit codes: 0 every request succeeded; 5 some request failed, or the second opinion did (report printed, then
    one error line); 2 the benchmark could not run; 4 AIPerf could not be installed.

    Args:
        url: gRPC address of a running server (127.0.0.1:PORT); default: start tritonserver on the build's repo
        metrics_url: Triton metrics URL (http://127.0.0.1:PORT/metrics) for the prefix-cache hit ratio
        repo: model repository to serve (default: the build's Triton repo)
        model_name: model to call (default: tensorrt_llm_bls when served, else ensemble)
        concurrency: concurrency levels, repeatable or comma-separated (default 1,2,4)
        requests: requests per concurrency level (default 8)
        max_tokens: output tokens per request, where the dataset gives none (default 32)
        no_stream: send non-streaming requests (TTFT not measurable)
        budget: seconds per concurrency level before no new requests are sent (default 60)
        json_: print the report as JSON on stdout (server and progress lines go to stderr)
        json_file: also write the report as JSON to this file (checked writable before the run; written atomically)
        plot: write a PNG of throughput and TTFT against concurrency to this file (needs matplotlib: .[dev])
        shared_prefix_tokens: shared-prefix workload: this many prompt tokens common to a share of the requests
            (each with a distinct suffix); default 0: the fixed prompt set
        shared_prefix_share: share of the requests that reuse the shared prefix, 0..1 (default 1)
        speculation: server (the route's default draft length), off (num_draft_tokens 0), or both (each level
            twice: the crossover in the plot); default server
        dataset: prompts as JSONL (one object a line) or one JSON array (ShareGPT as published, streamed): objects
            {"prompt": ..., "output_len": N} (output_len optional) or the ShareGPT layout {"conversations":
            [{"from": "human", ...}, {"from": "gpt", ...}]}; every level replays one seeded sample of --requests
        request_rate: Poisson arrivals per second in each level (the concurrency level caps requests in flight);
            default: closed loop, each client sends its next request at once
        seed: seed of the dataset sample and the Poisson arrival times (default 0)
        http_url: HTTP address of the server at --url (127.0.0.1:PORT), for --second-opinion aiperf
        second_opinion: aiperf: also run NVIDIA AIPerf 0.13 on the same requests, concurrency and request rate
            (a streaming ensemble or BLS) and print both tools' figures side by side
    """
    levels = concurrency if isinstance(concurrency, str) else ",".join(concurrency or ())
    if second_opinion not in (None, "", "aiperf"):
        raise BenchError(f"--second-opinion {second_opinion!r}: the only second opinion is 'aiperf'; drop the "
                         "flag for ours alone")
    options = dict(  # every number checked before any file, install or server
        concurrency=bench_lib.parse_levels(levels or "1,2,4"),
        requests_per_level=int_option("requests", requests, default=8, maximum=bench_lib.MAX_REQUESTS),
        max_tokens=int_option("max_tokens", max_tokens, default=32, maximum=MAX_REQUEST_TOKENS),
        level_budget_s=int_option("budget", budget, default=60.0, kind=float, minimum=0.1, maximum=MAX_SECONDS),
        shared_prefix_tokens=int_option("shared_prefix_tokens", shared_prefix_tokens, default=0, minimum=0,
                                        maximum=MAX_REQUEST_TOKENS),
        shared_prefix_share=int_option("shared_prefix_share", shared_prefix_share, default=1.0, kind=float,
                                       minimum=0.0, maximum=1.0),
        request_rate=int_option("request_rate", request_rate, kind=float, minimum=0.001,
                                maximum=bench_lib.MAX_REQUEST_RATE),
        seed=int_option("seed", seed, default=0, minimum=0, maximum=MAX_SEED),
    )
    if json_file:
        bench_lib.check_output_file("--json-file", json_file)
    if plot:
        bench_lib.check_plotting()
        bench_lib.check_output_file("--plot", plot)
    with contextlib.redirect_stdout(sys.stderr) if json_ else contextlib.nullcontext():  # stdout: the JSON only
        other = aiperf_lib.Aiperf.installed() if second_opinion else None
        report = bench_lib.bench_spec(
            spec, url=url, metrics_url=metrics_url, repo=repo, model=model_name, http_url=http_url,
            second_opinion=other, stream=False if no_stream else None, speculation=speculation or "server",
            dataset=dataset, **options)
    said = sys.stderr if json_ else sys.stdout
    print(bench_lib.report_json(report) if json_ else bench_lib.format_report(report))
    if other is not None and not json_ and any(lv.aiperf for lv in report.levels):
        print("\n" + aiperf_lib.format_side_by_side(report))
    if json_file:
        print(f"json: {bench_lib.write_json(report, json_file)}", file=said)
    if plot:
        print(f"plot: {bench_lib.plot_report(report, plot)}", file=said)
    bench_lib.check_failures(report)


# --- download / calibrate --------------------------------------------------------------------------------------------
def download_command(spec: BuildSpec, *, revision=None, update=False, offline=False, verify=False,
                     endpoint=None) -> None:
    """Download (or generate) the model's checkpoint, pinned to a commit and verified; prints the local path.

    Args:
        revision: branch, tag or commit overriding the registry's (target model only)
        update: re-resolve the branch/tag to its current commit instead of the locked one (models.lock.json)
        offline: no network: reuse a previous download, fail clearly when there is none
        verify: re-hash every file against the Hub's oids (corrupt files are fetched again)
        endpoint: Hub URL (default: HF_ENDPOINT or https://huggingface.co); the token comes from HF_TOKEN/hf auth login
    """
    for i, entry in enumerate(e for e in (spec.model, spec.draft_model) if e is not None):
        res = download_stage.download_model(entry, revision=revision if i == 0 else None, update=update,
                                            offline=offline, verify=verify, endpoint=endpoint)
        m = res.manifest
        print(f"{entry.name}: {m.source} {entry.repo_id}@{m.sha[:12]} {len(m.files)} files "
              f"{m.total_bytes / 1e6:.1f} MB [{res.status}] -> {res.path}")


def calibrate_command(spec: BuildSpec, *, force=False) -> None:
    """Quantize with ModelOpt (FP8/INT4-AWQ/W4A8-AWQ/INT8-SQ), gate on held-out quality, export TRT-LLM checkpoints
    (runtime pytorch: unified Hugging Face checkpoints with hf_quant_config.json).

    Args:
        force: rebuild even when the checkpoint for these inputs exists
    """
    results = {}
    for role, output in (("target", "checkpoint"), ("draft", "draft_checkpoint"))[: 2 if spec.draft_model else 1]:
        res = results[output] = calibrate_stage.run_calibrate(spec, role=role, force=bool(force))
        q = res.manifest.quality
        print(
            f"ok: {role} {res.status}: {res.path} (ppl {q.ppl_base:.4f} -> {q.ppl_quant:.4f}, "
            f"{q.ppl_delta_pct:+.3f} %, top-1 {q.top1_agreement:.3f})"
            + (f"; library output: {calibrate_stage.log_file(res.path)}" if res.built else "")
        )
    refs.write_ref("calibrate", spec.identity("calibrate"), results)


# --- package / serve / smoke / install-repo -----------------------------------------------------------------------
def package_command(spec: BuildSpec, *, output=None, engine_dir=None, draft_engine_dir=None, checkpoint_dir=None,
                    draft_checkpoint_dir=None, tokenizer_dir=None, draft_tokenizer_dir=None, force=False) -> Any:
    """Write and validate the Triton model repository (ensemble, BLS draft-target) for --target trtllm|reference;
    for --runtime pytorch the `llmapi` model repository over the exported Hugging Face checkpoint.

    Earlier stages' outputs are located, never built: run `invoke build --until compile` (or calibrate) first.
    Explicit directories replace the located ones; the repository is named by the build layout unless only
    explicit directories are given.

    Args:
        output: parent directory of the repository (default triton_repo/); the repo is <output>/<build-id>[-reference]
        engine_dir: trtllm: target engine dir (default: the compile stage's engines/<build-id>/engine)
        draft_engine_dir: trtllm: draft engine dir (default: <engine-dir>/../draft_engine)
        checkpoint_dir: reference or runtime pytorch: target checkpoint dir (default: the calibrate stage's
            engines/<build-id>/checkpoint, or hf_checkpoint for runtime pytorch)
        draft_checkpoint_dir: reference or runtime pytorch: draft checkpoint dir (default: the calibrate stage's)
        tokenizer_dir: tokenizer files to copy into the repo (default: the checkpoint's tokenizer/)
        draft_tokenizer_dir: trtllm: the draft's tokenizer, for a draft engine built outside the pipeline
        force: rewrite the repository even when its manifest key is current
    """
    backend = backend_for(spec)
    explicit = engine_dir if backend.package_from == "engine" else checkpoint_dir
    naming: dict[str, Any] = {}
    if explicit is None:
        served_stage = backend.stages[backend.stages.index("package") - 1]  # the stage whose output it serves
        out = build_stage.locate_outputs(spec, until=served_stage)
        lay = out.layout
        naming = dict(build_id=lay.build_id, name=lay.repo_name, spec_key=lay.spec_key)
        checkpoint_dir = checkpoint_dir or out.checkpoint.path
        tokenizer_dir = tokenizer_dir or out.checkpoint.path
        if out.draft_checkpoint is not None:
            draft_checkpoint_dir = draft_checkpoint_dir or out.draft_checkpoint.path
        if out.engine is not None:
            engine_dir = engine_dir or out.engine.path
            draft_engine_dir = draft_engine_dir or (out.draft_engine.path if out.draft_engine else None)
    inputs = PackageInputs(
        output=_path(output), engine=_path(engine_dir), draft_engine=_path(draft_engine_dir),
        checkpoint=_path(checkpoint_dir), draft_checkpoint=_path(draft_checkpoint_dir),
        tokenizer=_path(tokenizer_dir), draft_tokenizer=_path(draft_tokenizer_dir), **naming,
    )
    res = backend.package(spec, inputs, force=bool(force))
    if naming and output is None:  # the spec's own build: point its ref here
        refs.write_ref("package", spec.identity("package"), {"triton_repo": res})
    for w in res.manifest.warnings:
        print(f"warning: {w}", file=sys.stderr)
    state = "current (no-op)" if res.status == "cached" else "written"
    note = f", {backend.repo_note()}" if backend.repo_note() else ""
    print(f"ok: {res.path} {state}: {', '.join(res.manifest.models)} (target {res.manifest.target}{note})")
    return res


def _repo_for(spec: BuildSpec | None, repo: str | None) -> Path:
    if repo:
        return Path(repo)
    if spec is None:
        raise ServeError("give --repo PATH (a model repository) or the build's spec (--model ... / --spec FILE)")
    return build_stage.locate_outputs(spec).triton_repo.path


def _print_addresses(server: TritonServer, path: Path) -> None:
    configured = {"http": server.http_url, "grpc": server.grpc_url,
                  "metrics": server.metrics_url.removeprefix("http://")}
    rows = [("", what, f"{bound} (bound)" if (bound := server.bound.get(what)) else f"{addr} (configured)")
            for what, addr in configured.items()]
    table = format_table([*rows, ("", "log", str(server.log_file))])
    print(f"ok: serving {path} (installed copy {server.launch_dir})\n{table}\n(Ctrl-C to stop)", flush=True)


def serve_command(spec: BuildSpec | None, *, repo=None, http_port: int | None = None, grpc_port: int | None = None,
                  metrics_port: int | None = None, port_offset: int | None = None, ready_timeout: float | None = None,
                  engine_dir=None, draft_engine_dir=None, mode: Literal["triton", "trtllm-serve"] | None = None,
                  host=None, print_only=False) -> Any:
    """Run tritonserver on an installed copy of the repository until Ctrl-C; it dies with this task. It is launched
    as the repository's launch plan says (one process; leader-mode ranks under mpirun; or one orchestrator process
    for draft-target), the same plan `deploy` renders.

    `--mode trtllm-serve` instead runs TensorRT-LLM's OpenAI-compatible server (/v1/chat/completions): on the
    exported Hugging Face checkpoint (--runtime pytorch) or on the engine with --backend tensorrt (--runtime engine),
    with the build's LLM-API options YAML (GPU host with TensorRT-LLM 1.2.1).

    Args:
        mode: triton (default) or trtllm-serve
        host: address to bind (default 127.0.0.1; 0.0.0.0: every interface)
        print_only: print the launch command(s) and env and run nothing, needing no download (triton: from the spec
            alone, or --repo; trtllm-serve: a finished build gets its options YAML written so the command runs as
            printed, without one <build-id> stands in the paths)
        repo: model repository to serve (default: the spec's repo under triton_repo/; --model is then needed)
        http_port: HTTP port (default 8000 + --port-offset)
        grpc_port: gRPC port (default 8001 + --port-offset)
        metrics_port: metrics port (default 8002 + --port-offset)
        port_offset: shift the three default ports by N (e.g. 100: 8100/8101/8102)
        ready_timeout: seconds to wait for readiness (default 300)
        engine_dir: serve tensorrt_llm from this engine dir (the repository itself is not changed)
        draft_engine_dir: serve tensorrt_llm_draft from this engine dir
    """
    if (mode or "triton") not in SERVE_MODES:
        raise SpecError(f"--mode {mode!r}: use one of {', '.join(SERVE_MODES)}")
    if mode == "trtllm-serve":
        return _serve_trtllm(spec, port=int_option("http_port", http_port, default=8000, maximum=MAX_PORT),
                             host=host or "127.0.0.1", print_only=bool(print_only))
    given = {name: int_option(f"{name}_port", value, maximum=MAX_PORT) for name, value in
             (("http", http_port), ("grpc", grpc_port), ("metrics", metrics_port))}
    offset = int_option("port_offset", port_offset, minimum=0, default=0, maximum=MAX_PORT - 8002)
    timeout = int_option("ready_timeout", ready_timeout, default=300.0, kind=float, minimum=0.1, maximum=MAX_SECONDS)
    host = serve_lib.check_host(host or "127.0.0.1")
    ports = serve_lib.serve_ports(host=host, offset=offset, given=given, check_free=not print_only)
    if print_only:
        endpoints = launch_plan.Endpoints(host, ports["http"], ports["grpc"], ports["metrics"])
        return _print_launch_plan(spec, repo, endpoints)
    path = _repo_for(spec, repo)
    server = serve_lib.TritonServer(path, host=host, http_port=ports["http"], grpc_port=ports["grpc"],
                                    metrics_port=ports["metrics"], ready_timeout_s=timeout,
                                    engine_dir=_path(engine_dir), draft_engine_dir=_path(draft_engine_dir))
    stop = {"flag": False}

    def _term(*_):
        stop["flag"] = True

    old = signal.signal(signal.SIGTERM, _term)
    try:
        server.start()
        _print_addresses(server, path)
        while not stop["flag"]:
            if server._proc is None or server._proc.poll() is not None:
                raise ServerFailed(f"tritonserver exited; see {server.log_file}: {server.log_tail()}")
            dead = server.dead_stubs()
            if dead:
                raise ServerFailed(f"model instance(s) {', '.join(dead)} lost their Python stub (tritonserver would "
                                   f"keep answering errors); stopped the server, restart it; see {server.log_file}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, old)
    print("ok: server stopped")


def _planned_repo(spec: BuildSpec) -> Path:
    """The repository `package` makes (or made) for `spec`: its current path, else its name with the build id that
    calibration will fix."""
    with contextlib.suppress(PipelineError):
        return build_stage.locate_outputs(spec).triton_repo.path
    name = f"{PENDING}-{spec.identity()[:SPEC_KEY_CHARS]}" + backend_for(spec).repo_suffix
    return triton_repo_dir() / name


def _print_launch_plan(spec: BuildSpec | None, repo: str | None, endpoints: Endpoints) -> LaunchPlan:
    """Print the launch plan (env + command) of `--repo` or of the spec's repository; nothing runs or is written."""
    if repo and Path(repo).is_dir():
        path, shape = Path(repo).resolve(), launch_plan.shape_from_repo(Path(repo))
        gpus = host_lib.visible_gpu_count()
    elif spec is not None:
        path, shape = (Path(repo) if repo else _planned_repo(spec)), launch_plan.shape_from_spec(spec)
        gpus = placement_lib.node_gpus(spec.hardware)
    else:
        raise ServeError("give --repo PATH (a model repository) or the build's spec (--model ... / --spec FILE)")
    binary = "tritonserver" if shape.kind == "reference" else \
        str(serve_lib.find_gpu_tritonserver() or serve_lib.NGC_TRITONSERVER)
    plan = launch_plan.plan_launch(shape, repo=str(path), binary=binary, endpoints=endpoints, shm_prefix="tripipe-",
                                   gpus_per_node=gpus)
    print(plan.format())
    if plan.mode == "cpu-reference":
        print("# serve runs the nvidia-pytriton tritonserver with --backend-directory/--cache-directory of its bundle "
              "and serves an installed copy of the repository")
    return plan


SERVE_MODES = ("triton", "trtllm-serve")


def _serve_trtllm(spec: BuildSpec | None, *, port: int, host: str, print_only: bool) -> TrtllmServePlan:
    """Run (or print) trtllm-serve on the build's HF checkpoint (runtime pytorch) or engine (runtime engine), with
    its options YAML; `--print-only` works from the spec alone (see `pipeline.serving.llmapi.local_inputs`)."""
    if spec is None:
        raise SpecError("--mode trtllm-serve serves a build: give its spec (--model ... or --spec FILE)")
    inputs = local_inputs.locate_serve_inputs(spec, allow_pending=print_only)
    plan = serve_plan.trtllm_serve_plan(spec, model_dir=inputs.model_dir, tokenizer_dir=inputs.tokenizer_dir,
                                        options_file=inputs.options_file, host=host, port=port)
    if inputs.found:
        inputs.write_options()
    print(plan.command_line())
    if not inputs.found:
        print(inputs.pending_options())
        print(f"note: the paths are where the build will put its outputs; none is finished here ({inputs.reason})",
              file=sys.stderr)
    if print_only:
        return plan
    serve_plan.require_trtllm_serve()
    rc = subprocess.run(plan.argv, check=False).returncode
    if rc != 0:
        raise ServeError(f"trtllm-serve exited with status {rc}; see its output above")
    return plan


def smoke_command(spec: BuildSpec | None, *, repo=None, http_url=None, grpc_url=None, prompt=None,
                  max_tokens: int | None = None, num_draft_tokens: int | None = None,
                  ready_timeout: float | None = None) -> None:
    """Start a server (unless given), HTTP + gRPC (streaming, or unary with a draft) via the ensemble, BLS draft-target; non-zero exit on failure.

    Args:
        repo: model repository to serve (default: the spec's repo under triton_repo/; --model is then needed)
        http_url: HTTP address of a running server (127.0.0.1:PORT); with --grpc-url no server is started
        grpc_url: gRPC address of a running server (127.0.0.1:PORT)
        prompt: prompt text
        max_tokens: output tokens per request (default 24)
        num_draft_tokens: draft tokens per step for the BLS route (default: the repo's K)
        ready_timeout: seconds to wait for readiness (default 300)
    """
    max_tokens = int_option("max_tokens", max_tokens, default=24, maximum=MAX_REQUEST_TOKENS)
    num_draft_tokens = int_option("num_draft_tokens", num_draft_tokens, maximum=MAX_DRAFT_LEN)
    timeout = int_option("ready_timeout", ready_timeout, default=300.0, kind=float, minimum=0.1, maximum=MAX_SECONDS)
    path = None if (http_url and grpc_url and not repo) else _repo_for(spec, repo)
    results = smoke_lib.run_smoke(path, http_url=http_url, grpc_url=grpc_url, prompt=prompt or smoke_lib.DEFAULT_PROMPT,
                                  max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, ready_timeout_s=timeout)
    print(f"ok: smoke passed ({len(results)} routes)")


def install_repo_command(repo, *, dest=None, engine_dir=None, draft_engine_dir=None) -> None:
    """Make every path parameter of a repository absolute (and checked) so bare `tritonserver` can serve it.

    Args:
        repo: model repository to install (e.g. triton_repo/<build-id>)
        dest: write the installed repository here instead of editing --repo in place (must not exist)
        engine_dir: point tensorrt_llm at this engine dir
        draft_engine_dir: point tensorrt_llm_draft at this engine dir
    """
    install_lib.install_command(repo, dest=dest, engine_dir=engine_dir, draft_engine_dir=draft_engine_dir)


# --- deploy ----------------------------------------------------------------------------------------------------------
def _deploy_options(platform, name, *, namespace, release_url, release_volume, image, pipeline_image, pipeline_cmd,
                    partition, release_secret=None, no_container, account=None, qos=None, constraint=None, time_=None,
                    serve_mode=None, replicas=1, exclusive=False, mpi=None, keep_work=False, node_selector=None,
                    toleration=None, gpu_product_label=None, no_gpu_affinity=False, rdma_resource=None,
                    nccl_env=None, monitoring_label=None, prefix_cache_alert=False) -> deploy_render.DeployOptions:
    if platform not in ("k8s", "slurm"):
        raise DeployError(f"--platform {platform!r}: choose k8s or slurm")
    slurm_only = {"--account": account, "--qos": qos, "--constraint": constraint, "--time": time_,
                  "--exclusive": exclusive, "--mpi": mpi, "--keep-work": keep_work}
    if platform != "slurm" and any(slurm_only.values()):
        given = ", ".join(flag for flag, value in slurm_only.items() if value)
        raise DeployError(f"{given}: Slurm options; drop them or use --platform slurm")
    k8s_only = {"--node-selector": node_selector, "--toleration": toleration, "--gpu-product-label": gpu_product_label,
                "--no-gpu-affinity": no_gpu_affinity, "--rdma-resource": rdma_resource, "--nccl-env": nccl_env}
    if platform != "k8s" and any(k8s_only.values()):
        given = ", ".join(flag for flag, value in k8s_only.items() if value)
        raise DeployError(f"{given}: Kubernetes options; drop them or use --platform k8s (Slurm: --constraint)")
    if gpu_product_label and no_gpu_affinity:
        raise DeployError("--gpu-product-label and --no-gpu-affinity: give one of them")
    if monitoring_label and platform != "k8s":
        raise DeployError("--monitoring-label labels the PrometheusRule, PodMonitor and dashboard ConfigMap; Slurm "
                          "deployments have none, so drop it or use --platform k8s")
    labels = dict(deploy_names.kube_label(item, "--monitoring-label") for item in monitoring_label or ())
    if reserved := sorted(set(labels) & deploy_render.MONITORING_OWN_LABELS):
        raise DeployError(f"--monitoring-label {reserved[0]}: deploy sets that label itself; choose another key")
    if release_url:
        deploy_names.check_release_url(release_url)
    if release_secret and (platform != "k8s" or not release_url):
        raise DeployError("--release-secret names a Kubernetes Secret; on Slurm export RELEASE_AUTH_HEADER in the shell "
                          "that runs sbatch instead" if platform == "slurm" else
                          "--release-secret without --release-url; give the URL or drop --release-secret")
    opts = dict(platform=platform, name=deploy_render.check_name(name), namespace=namespace or "default",
                image=image, pipeline_image=pipeline_image, release_url=release_url, release_volume=release_volume,
                release_secret=release_secret, partition=partition, account=account, qos=qos, constraint=constraint,
                time_limit=time_, container=not no_container, serve_mode=serve_mode, replicas=replicas,
                exclusive=bool(exclusive), mpi=mpi or "pmix", keep_work=bool(keep_work),
                node_selector=deploy_scheduling.node_selector(node_selector or []),
                tolerations=deploy_scheduling.tolerations(toleration or []),
                gpu_product=gpu_product_label and deploy_names.label_value(gpu_product_label, "--gpu-product-label"),
                gpu_affinity=not no_gpu_affinity,
                rdma_resources=deploy_scheduling.extended_resources(rdma_resource or []),
                nccl_env=deploy_scheduling.nccl_env(nccl_env or []),
                monitoring_labels=labels, prefix_cache_alert=prefix_cache_alert)
    if pipeline_cmd:
        opts["pipeline_cmd"] = pipeline_cmd
    return deploy_render.DeployOptions(**opts)


def deploy_command(spec: BuildSpec | None, *, platform: Literal["k8s", "slurm"] | None = None, release=None,
                   output=None, name=None, namespace=None, release_url=None, release_volume=None,
                   release_secret=None, image=None,
                   pipeline_image=None, pipeline_cmd=None, partition=None, account=None, qos=None, constraint=None,
                   time_=None, no_container=False, max_nodes: int | None = None, matrix=None,
                   matrix_target: Literal["trtllm", "reference"] | None = None, matrix_output=None, force=False,
                   json_=False, serve_mode: Literal["triton", "trtllm-serve"] | None = None,
                   replicas: int | None = None, release_version=None, exclusive=False,
                   mpi: Literal["pmix", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none"] | None = None,
                   keep_work=False, node_selector: list[str] | None = None,
                   toleration: list[str] | None = None, gpu_product_label=None, no_gpu_affinity=False,
                   rdma_resource: list[str] | None = None, nccl_env: list[str] | None = None,
                   monitoring_label: list[str] | None = None, prefix_cache_alert: bool = False) -> dict[str, Any]:
    """Render deployment files (Kubernetes or Slurm) for a release or a spec, validated before anything is written.

    Serving deployments also get their Prometheus rules (operations and cost) and Grafana dashboard (README
    "Watching cost").

    Args:
        platform: k8s (Deployment, or LeaderWorkerSet across nodes) or slurm (sbatch)
        release: release tarball or unpacked release (its spec, toolchain and sha256); default: the spec flags
        output: directory to write (default <output tree>/deploy/<platform>/<name>); replaced only with --force
        name: deployment name, DNS-1123 (default <model>-<precision>)
        namespace: Kubernetes namespace (default default)
        release_url: http(s) URL the nodes fetch the release tarball from (no user:password@ in it)
        release_secret: k8s: Secret whose key `header` (e.g. 'Authorization: Bearer ...') the fetch sends with
            --release-url; Slurm: export RELEASE_AUTH_HEADER before sbatch instead
        release_volume: where the nodes find the tarball instead: a PVC name (k8s) or a shared directory (slurm)
        image: server image (default: the NGC tritonserver image of the release's TensorRT-LLM)
        pipeline_image: image with this pipeline (runs `invoke verify` and the build matrix; default derived)
        pipeline_cmd: how the scripts call the pipeline (default: invoke -r /opt/trtllm-pipeline)
        partition: Slurm partition
        account: Slurm account to charge (#SBATCH --account)
        qos: Slurm quality of service (#SBATCH --qos)
        constraint: Slurm node features, e.g. 'h100&ib' (#SBATCH --constraint)
        time_: Slurm time limit, e.g. 2-00:00:00 (serving default: none, the partition's limit; matrix: 04:00:00)
        no_container: Slurm: run on the hosts instead of srun --container-image (pyxis)
        max_nodes: most nodes the placement may use when tp/pp are not given (default 16)
        matrix: build matrix instead of serving: MODEL:PRECISION[:TP],... (Indexed Job / job array)
        matrix_target: target of every matrix cell: trtllm (default) or reference
        matrix_output: where the matrix writes (k8s: a PVC name; slurm: a shared directory)
        force: replace an existing output directory
        json_: print the deployment summary as JSON
        serve_mode: what serves an engine release: triton (default, tritonserver) or trtllm-serve (OpenAI
            /v1/chat/completions, --backend tensorrt; no draft); runtime pytorch: trtllm-serve
        replicas: serving replicas, >= 1: Deployment/LeaderWorkerSet replicas, a Slurm job array (default: the
            spec's serving_target.replicas, written by `plan --slo --write-spec`, else 1)
        release_version: the `release --version` of the spec's release the nodes fetch (default: the pipeline's
            version); a --release-volume directory on this host must hold that file
        exclusive: Slurm: whole nodes (#SBATCH --exclusive); default: only the placement's GPUs per node
        mpi: Slurm: srun --mpi of the serving ranks (default pmix)
        keep_work: Slurm: leave the node-local work directory (the unpacked release) when the job ends
        node_selector: k8s: KEY=VALUE node label every pod requires (repeatable)
        toleration: k8s: KEY[=VALUE]:EFFECT taint GPU pods tolerate besides nvidia.com/gpu:NoSchedule (repeatable)
        gpu_product_label: k8s: nvidia.com/gpu.product value GPU pods require (default: the spec GPU's, as GPU
            feature discovery writes it, e.g. NVIDIA-H100-80GB-HBM3)
        no_gpu_affinity: k8s: no nvidia.com/gpu.product node affinity
        rdma_resource: k8s: NAME=COUNT extended resource each serving pod requests, e.g. rdma/rdma_shared_device_a=1
            (repeatable)
        nccl_env: k8s: NCCL environment of the serving containers, e.g. NCCL_IB_HCA=mlx5 (repeatable)
        monitoring_label: k8s: KEY=VALUE label of the PrometheusRule, PodMonitor and dashboard ConfigMap, repeatable
            (e.g. release=kube-prometheus-stack, for the operator's selectors)
        prefix_cache_alert: alert on a low prefix-cache hit ratio although the spec's serving_target declares no
            shared prefix (with one, the alert is on at its prefix share)
    """
    if not platform:
        raise DeployError("give --platform k8s or --platform slurm")
    replicas = int_option("replicas", replicas, maximum=MAX_REPLICAS)
    max_nodes = int_option("max_nodes", max_nodes, maximum=MAX_NODES)
    k8s_flags = dict(node_selector=node_selector, toleration=toleration, gpu_product_label=gpu_product_label,
                     no_gpu_affinity=no_gpu_affinity, rdma_resource=rdma_resource, nccl_env=nccl_env)
    if matrix:
        serving = {"--replicas": replicas is not None, "--release-version": release_version,
                   "--exclusive": exclusive, "--mpi": mpi, "--keep-work": keep_work,
                   "--monitoring-label": monitoring_label, "--prefix-cache-alert": prefix_cache_alert}
        if any(serving.values()):
            given = ", ".join(flag for flag, value in serving.items() if value)
            raise DeployError(f"{given}: serving options; drop them with --matrix")
        return _deploy_matrix(spec, platform, matrix, matrix_target=matrix_target, matrix_output=matrix_output,
                              output=output, name=name, force=force, json_=json_,
                              opts=dict(namespace=namespace, release_url=None, release_volume=None,
                                        release_secret=release_secret, image=image,
                                        pipeline_image=pipeline_image, pipeline_cmd=pipeline_cmd,
                                        partition=partition, no_container=no_container, account=account, qos=qos,
                                        constraint=constraint, time_=time_, **k8s_flags))
    if release:
        if release_version:
            raise DeployError("--release-version names a spec's release; --release reads its own name, drop one")
        src = deploy_source.from_release(release)
    elif spec is not None:
        src = deploy_source.from_spec(spec, release_version or __version__)
    else:
        raise DeployError("give --release PATH (a release) or the spec (--model ... / --spec FILE)")
    explicit = src.origin == "release" or bool({"tp", "pp"} & src.spec.parallelism.model_fields_set)
    chosen, placement = deploy_topology.choose(src.spec, explicit=explicit,
                                               max_nodes=max_nodes)
    if chosen.limit_reasons:  # limits the memory model chose follow the topology deploy chose
        chosen = choose_limits(chosen)
    if src.origin == "spec":
        src = deploy_source.from_spec(chosen, release_version or __version__)
    else:
        src = src.model_copy(update={"spec": chosen})
    o = _deploy_options(platform, name or deploy_render.default_name(chosen), namespace=namespace,
                        release_url=release_url, release_volume=release_volume, release_secret=release_secret,
                        image=image,
                        pipeline_image=pipeline_image, pipeline_cmd=pipeline_cmd, partition=partition,
                        no_container=no_container, account=account, qos=qos, constraint=constraint, time_=time_,
                        serve_mode=serve_mode, replicas=deploy_render.replicas_for(chosen, replicas),
                        exclusive=exclusive, mpi=mpi, keep_work=keep_work, monitoring_label=monitoring_label,
                        prefix_cache_alert=prefix_cache_alert, **k8s_flags)
    if platform == "slurm" and release_volume and not release_url:
        deploy_source.check_released(release_volume, src)
    dest = deploy_render.deploy_dir(output, o.name, platform)
    files = deploy_render.render_serving(o, src, placement, dest)
    deploy_render.write_directory(dest, files, force=bool(force))
    summary = json.loads(files["deploy.json"]) | {"directory": str(dest), "files": sorted(files)}
    for w in chosen.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if json_:
        print(json.dumps(summary, indent=2))
    else:
        copies = f"{o.replicas} replicas x " if o.replicas > 1 else ""
        shape = (f"{placement.nodes} node(s) x {placement.ranks_per_node} GPUs (tp={placement.tp}, pp={placement.pp}, "
                 f"{placement.world_size} ranks)") if summary["gpus"] else f"one CPU process ({summary['server']})"
        print(f"ok: {dest}: {summary['kind']}, {copies}{shape}, image {summary['image']}")
    return summary


def _deploy_matrix(spec, platform, matrix, *, matrix_target, matrix_output, output, name, force, json_,
                   opts) -> dict[str, Any]:
    base = {"target": matrix_target or "trtllm"}
    if spec is not None:
        base["gpu"] = spec.hardware.gpu
    cells = deploy_render.matrix_cells(matrix, base)
    o = _deploy_options(platform, name or "build-matrix", **opts)
    dest = deploy_render.deploy_dir(output, o.name, platform)
    if platform == "slurm" and not (matrix_output and Path(matrix_output).is_absolute()):
        raise DeployError("--matrix on slurm: give --matrix-output /shared/dir (absolute) for the cells' outputs")
    if platform == "k8s" and matrix_output:
        o = o.model_copy(update={"output_pvc": matrix_output})
    files = deploy_render.render_matrix(o, cells, dest, matrix_output or "")
    deploy_render.write_directory(dest, files, force=bool(force))
    summary = {"kind": "build-matrix", "platform": platform, "directory": str(dest), "files": sorted(files),
               "cells": [c.summary() for c in cells], "releases": [release_file(c, __version__) for c in cells]}
    print(json.dumps(summary, indent=2) if json_ else f"ok: {dest}: build matrix of {len(cells)} cells ({platform})")
    return summary
