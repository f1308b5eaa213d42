"""What each task does and prints: its flags typed from the one table (`pipeline.cli.flags.parse_flags`), the
library called, the result printed. `pipeline.cli.console` makes the invoke tasks of these functions.

Each function's docstring is its task's help (its first sentence for `--list`). A function whose first parameter is
`spec` receives the validated `BuildSpec` the spec flags describe. Every import of a task's own modules sits in its
function: a task loads only what it uses (torch, ModelOpt, transformers and tritonclient load inside the stages).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from pipeline.cli import flags as cli_flags
from pipeline.cli.flags import parse_flags
from pipeline.core.errors import BuildError, SpecError
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec


def _path(p: str | Path | None) -> Path | None:
    return Path(p) if p else None


def _program() -> str:
    return cli_flags.PROGRAM


def check_command(spec: BuildSpec, **flags: Any) -> None:
    """Validate a build spec (model, precision, KV, parallelism, speculation, GPU) and print it in one line; then
    check that this host has the GPU memory, RAM and disk to build it (exit 4 naming the numbers and ways out).

    Then each engine limit left unset, on stderr with its value and why (`limits: ...`).
    """
    from pipeline.planning.limits_choice import limit_lines

    f = parse_flags("check", flags)
    print(spec.summary())
    for precision, why in spec.auto_precision.refused if spec.auto_precision else ():
        print(f"precision auto: {precision} is not a candidate: {why}", file=sys.stderr)
    if not f["skip_host_check"]:
        from pipeline.stages.build import stage_range
        from pipeline.stages.host_check import check_host_fits

        stages = stage_range(until=None, from_stage=None, force=None, target=spec.target, runtime=spec.runtime)
        print(check_host_fits(spec, stages=stages).summary(), file=sys.stderr)
    if spec.placement_reason:
        print(f"placement: {spec.placement_reason}", file=sys.stderr)
    for line in limit_lines(spec):
        print(line, file=sys.stderr)


_SLO_ONLY = ("ttft_ms", "tpot_ms", "prefix_share", "rate", "bench_report", "write_spec", "precision_search",
             "accept_foreign_bench_report", "serving_mode")


def plan_command(spec: BuildSpec, **flags: Any) -> None:
    """Plan memory fit, KV capacity, concurrency, estimated TTFT/TPOT/throughput, the decode roofline (an upper
    bound) and $ per 1M output tokens.
    """
    from pipeline.planning import planner

    f = parse_flags("plan", flags)
    if f["slo"]:
        if f["compare"]:
            raise SpecError("--slo searches on its own: drop --compare (run it on its pick)")
        return _plan_slo(spec, f)
    if any(f[name] not in (None, False) for name in _SLO_ONLY):
        raise SpecError("--ttft-ms, --tpot-ms, --prefix-share, --rate, --bench-report, --write-spec, "
                        "--precision-search, --accept-foreign-bench-report and --serving-mode belong to --slo; add "
                        "--slo")
    terms = dict(input_len=f["input_len"], output_len=f["output_len"],
                 acceptance=f["acceptance"],
                 prefix_hit_ratio=f["prefix_hit"] or 0.0)
    routing = _routing(f)
    if f["compare"]:
        if f["estimator"]:
            raise SpecError("--estimator and --compare do not combine: run --estimator on one configuration")
        if routing is not None:
            raise SpecError("--router, --shared-prefixes and --prefix-requests size one fleet: drop them with "
                            "--compare")
        from pipeline.planning.compare import compare_plans, format_comparison

        c = compare_plans(spec, **terms)
        print(json.dumps(c.as_dict(), indent=2) if f["json"] else format_comparison(c))
        return
    _plan_one(spec, planner.plan_capacity(spec, routing=routing or _routing(f, spec), **terms),
              estimator=bool(f["estimator"]), as_json=f["json"])


def _routing(f: dict[str, Any], spec: BuildSpec | None = None):
    """`--router`, `--shared-prefixes`, `--prefix-requests` as the fleet model's routing, else the prefix shape the
    spec's serving_target recorded (None: neither)."""
    from pipeline.planning.fleet import PrefixShape, Routing, traffic_routing

    if f["router"] is None and f["shared_prefixes"] is None and f["prefix_requests"] is None:
        target = spec.serving_target if spec is not None else None
        return traffic_routing(target.traffic) if target is not None else None
    return Routing(f["router"] or "round-robin", PrefixShape(f["shared_prefixes"] or 1, f["prefix_requests"]))


def _plan_one(spec: BuildSpec, result, *, estimator: bool, as_json: bool) -> None:
    from pipeline.ops.plan import plan_resources
    from pipeline.planning import planner
    from pipeline.planning.limits_choice import limit_lines, limits_record
    from pipeline.stages.host_check import format_resources

    other = None
    if estimator:
        from pipeline.planning import aiconfigurator

        other = aiconfigurator.second_opinion(result, tokens_per_block=spec.limits.tokens_per_block)
    resources = plan_resources(spec)
    if as_json:
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
    print("\nbuild resources\n" + format_resources(resources))


def _plan_slo(spec: BuildSpec, f: dict[str, Any]) -> None:
    """`plan --slo`: the search (pipeline.ops.plan.slo_plan) printed; the pick written as a spec."""
    from pipeline.ops.plan import SloRequest, check_pick_path, slo_plan, write_pick
    from pipeline.planning.slo_search import format_search

    request = SloRequest(ttft_ms=f["ttft_ms"], tpot_ms=f["tpot_ms"], input_len=f["input_len"],
                         output_len=f["output_len"], rate=f["rate"], acceptance=f["acceptance"],
                         prefix_share=f["prefix_hit"] if f["prefix_share"] is None else f["prefix_share"],
                         bench_report=f["bench_report"], precision_search=f["precision_search"],
                         accept_foreign_bench_report=f["accept_foreign_bench_report"], routing=_routing(f),
                         disagg=f["serving_mode"] != "agg")
    if f["write_spec"]:
        check_pick_path(f["write_spec"])  # before the search
    result = slo_plan(spec, request)
    other = None
    if f["estimator"]:
        from pipeline.planning.aiconfigurator_modes import second_opinion
        from pipeline.stages.check import resolve_checked_spec

        other = second_opinion(spec, result, check=resolve_checked_spec)
    written = write_pick(spec, result, f["write_spec"]) if f["write_spec"] else None
    if f["json"]:
        print(json.dumps(result.as_dict() | {"spec_file": str(written) if written else None}
                         | ({"aiconfigurator": other} if other else {}), indent=2))
        return
    print(format_search(result))
    if other:
        print(f"\naggregated vs disaggregated, AIConfigurator's own search beside ours\n{other}")
    if written:
        p = _program()
        print(f"spec: {written} (`{p} check --spec {shlex.quote(str(written))}`, then `{p} build --spec ...`)")


def download_command(spec: BuildSpec, **flags: Any) -> None:
    """Download (or generate) the model's checkpoint, pinned to a commit and verified; prints the local path."""
    from pipeline.stages.download.stage import HubAccess, download_model

    f = parse_flags("download", flags)
    for i, entry in enumerate(e for e in (spec.model, spec.draft_model) if e is not None):
        res = download_model(entry, revision=f["revision"] if i == 0 else None, update=f["update"],
                             offline=f["offline"], verify=f["verify"], hub=HubAccess(endpoint=f["endpoint"]))
        m = res.manifest
        print(f"{entry.name}: {m.source} {entry.repo_id}@{m.sha[:12]} {len(m.files)} files "
              f"{m.total_bytes / 1e6:.1f} MB [{res.status}] -> {res.path}")


def calibrate_command(spec: BuildSpec, **flags: Any) -> None:
    """Quantize with ModelOpt (FP8/INT4-AWQ/W4A8-AWQ/INT8-SQ), gate on held-out quality, export TRT-LLM checkpoints
    (runtime pytorch: unified Hugging Face checkpoints with hf_quant_config.json).
    """
    from pipeline.core.refs import write_ref
    from pipeline.stages.calibrate.stage import Role, log_file, run_calibrate, uncalibrated_head

    f = parse_flags("calibrate", flags)
    results = {}
    roles: tuple[tuple[Role, str], ...] = (("target", "checkpoint"), ("draft", "draft_checkpoint"))
    for role, output in roles[: 2 if spec.quantized_draft else 1]:
        res = results[output] = run_calibrate(spec, role=role, force=f["force"])
        q = res.manifest.quality
        print(
            f"ok: {role} {res.status}: {res.path} (ppl {q.ppl_base:.4f} -> {q.ppl_quant:.4f}, "
            f"{q.ppl_delta_pct:+.3f} %, top-1 {q.top1_agreement:.3f})"
            + (f"; library output: {log_file(res.path)}" if res.built else "")
        )
    head = uncalibrated_head(spec)
    if head:
        print(f"ok: {head}")
    write_ref("calibrate", spec.identity("calibrate"), results)


def compile_command(spec: BuildSpec, **flags: Any) -> dict[str, Any]:
    """Compile TensorRT-LLM 1.2.1 engines (target + draft) for SM 90 from the exported checkpoint(s)."""
    from pipeline.stages.compile.inputs import engine_dirs_for, locate_checkpoints

    f = parse_flags("compile", flags)
    row = runtime_of(spec)
    if f["dry_run"] and row.gpu and not row.compiles:
        return _serve_dry_run(spec, as_json=f["json"])
    if not f["dry_run"]:  # fail fast (< 1 s on a CPU host) before locating anything
        from pipeline.stages.compile.preflight import preflight

        workers = max(1, min(spec.parallelism.world_size, spec.hardware.gpu_count))
        toolchain = preflight(gpu=spec.hardware.gpu, workers=workers)
    target, draft = locate_checkpoints(spec, checkpoint_dir=f["checkpoint_dir"],
                                       draft_checkpoint_dir=f["draft_checkpoint_dir"], dry_run=f["dry_run"])
    engine_dir, draft_engine_dir = engine_dirs_for(target, spec)
    draft_output = draft_engine_dir if draft else None
    if f["dry_run"]:
        from pipeline.stages.compile.engine_plan import plan_compile

        plan = plan_compile(spec, checkpoint_dir=target, output_dir=engine_dir, draft_checkpoint_dir=draft,
                            draft_output_dir=draft_output, allow_derived=True)
        print(plan.to_json() if f["json"] else plan.format())
        return plan.as_dict()
    from pipeline.core.refs import write_ref
    from pipeline.stages.compile.stage import CompileIO, run_compile

    res, draft_res = run_compile(spec, CompileIO(target, engine_dir, draft, draft_output), force=f["force"],
                                 toolchain=toolchain)
    if f["checkpoint_dir"] is None and f["draft_checkpoint_dir"] is None:  # the spec's own build: its ref points here
        write_ref("compile", spec.identity("compile"), {"engine": res, "draft_engine": draft_res})
    m = res.manifest
    if f["json"]:
        print(json.dumps(m.model_dump(mode="json"), indent=2))
    else:
        print(f"ok: target engine {res.path} {res.status} (key {m.key[:12]}, TensorRT-LLM {m.engine_version}, "
              f"SM {m.gpu.sm})")
        if draft_res is not None:
            print(f"ok: draft engine {draft_res.path} {draft_res.status} (key {draft_res.manifest.key[:12]}, "
                  "tokenizer shared)")
    return m.model_dump(mode="json")


def _serve_dry_run(spec: BuildSpec, *, as_json: bool) -> dict[str, Any]:
    """`compile --dry-run` of a runtime that compiles nothing (pytorch): what TensorRT-LLM 1.2.1 is given instead,
    the `trtllm-serve` command over the build's checkpoint and its `--extra_llm_api_options` YAML (the Triton
    `llmapi` model's model.yaml carries the same options). Nothing is located, downloaded or written."""
    import yaml

    from pipeline.serving.llmapi.local_inputs import locate_serve_inputs
    from pipeline.stages.package.serve_plan import trtllm_serve_plan

    inputs = locate_serve_inputs(spec, allow_pending=True)
    plan = trtllm_serve_plan(spec, model_dir=inputs.model_dir, tokenizer_dir=inputs.tokenizer_dir,
                             options_file=inputs.options_file)
    result = {"spec_summary": spec.summary(), "compile": None, "reason": runtime_of(spec).no_compile,
              "trtllm_serve": plan.argv, "extra_llm_api_options": yaml.safe_load(inputs.options_yaml),
              "warnings": list(spec.warnings)}
    if as_json:
        print(json.dumps(result, indent=2))
        return result
    print(spec.summary())
    print(f"compile: {result['reason']}")
    print(plan.command_line())
    print(f"# {inputs.options_file} (--extra_llm_api_options; the llmapi model.yaml holds the same options):")
    print(inputs.options_yaml.rstrip())
    return result


def build_command(spec: BuildSpec, **flags: Any) -> None:
    """Build end to end: check -> download -> calibrate -> compile (trtllm) -> package; cached stages are no-ops.

    With `--precision auto` the candidates are calibrated first (FP8, then INT4-AWQ while the quality gate holds),
    each one's perplexity delta printed; the build goes on at the cheapest that passes.

    A stage is cached only when its output still matches its manifest; one that does not fails (exit 3) naming
    `--force STAGE`.
    """
    from pipeline.planning.limits_choice import limits_record
    from pipeline.stages import build as build_stage

    f = parse_flags("build", flags)

    def host_check(stages: list[str]) -> str:  # called after the preflight, which rejects most builds faster
        from pipeline.stages.host_check import check_host_fits

        return check_host_fits(spec, stages=stages, force=f["force"]).summary()

    opts = build_stage.BuildOptions(offline=f["offline"], update=f["update"], verify_download=f["verify_download"],
                                    verify=f["verify"], revision=f["revision"], endpoint=f["endpoint"])
    with contextlib.redirect_stdout(sys.stderr):  # stages' library chatter must not corrupt --json on stdout
        report = build_stage.build(spec, until=f["until"], from_stage=f["from"], force=f["force"], options=opts,
                                   host_check=None if f["skip_host_check"] else host_check)
    if f["json"]:
        if report.spec is None:
            raise BuildError("build returned no spec: its --json report has no limits to show")
        print(json.dumps(report.as_dict() | {"limits": limits_record(report.spec)}, indent=2))


def release_command(spec: BuildSpec, **flags: Any) -> None:
    """Pack a finished build as a deterministic, versioned release tarball + .sha256 (run `build` first).

    Every packed file is re-hashed against its stage manifest; a mismatch refuses the release (exit 3).
    """
    from pipeline.ops.release import release

    f = parse_flags("release", flags)
    r = release(spec, output=f["output"], version=f["version"])
    files = len(r.document["files"])
    if f["json"]:
        doc = {k: v for k, v in r.document.items() if k != "files"}
        print(json.dumps({"tarball": str(r.tarball), "sha256": r.sha256, "files": files, "release": doc}, indent=2))
    else:
        print(f"ok: {r.tarball} sha256 {r.sha256} ({files} files)")


def verify_command(path: str, **flags: Any) -> None:
    """Check every sha256 of a release or repo (complete: no extra file, no symlink) and refuse engines built for
    another toolchain/GPU. Exit 3: files differ; 4: host mismatch; 2: not a release.
    """
    from pipeline.ops.release_verify import verify

    f = parse_flags("verify", {"path": path, **flags})
    if path.startswith("-"):  # `verify --help` hands the flag over as the positional path
        p = _program()
        raise SpecError(f"{path} is not a path; usage: {p} verify PATH [--skip-host] [--json] (help: {p} --help "
                        "verify)")
    report = verify(path, check_host=not f["skip_host"], sha256=f["sha256"])
    if f["json"]:
        print(json.dumps(report.as_dict(), indent=2))
        return
    host = "host matches" if report.host_checked else "host not checked"
    print(f"ok: {report.kind} {path}: {report.files_checked} files verified; {host}")
    for note in report.notes:
        print(f"note: {note}")


def bench_command(spec: BuildSpec, **flags: Any) -> None:
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
    """
    from pipeline.serving import aiperf
    from pipeline.serving import bench as bench_lib

    f = parse_flags("bench", flags)  # every number checked before any file, install or server
    workload = bench_lib.WorkloadOptions(
        concurrency=bench_lib.parse_levels(",".join(map(str, f["concurrency"])) or "1,2,4"),
        requests_per_level=f["requests"], max_tokens=f["max_tokens"], shared_prefix_tokens=f["shared_prefix_tokens"],
        shared_prefix_share=f["shared_prefix_share"], speculation=f["speculation"] or "server", dataset=f["dataset"],
        request_rate=f["request_rate"], seed=f["seed"])
    sweep = bench_lib.SweepOptions(model=f["model_name"], stream=False if f["no_stream"] else None,
                                   level_budget_s=f["budget"])
    if f["json_file"]:
        bench_lib.check_output_file("--json-file", f["json_file"])
    if f["plot"]:
        bench_lib.check_plotting()
        bench_lib.check_output_file("--plot", f["plot"])
    as_json = f["json"]
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():  # stdout: the JSON only
        other = aiperf.Aiperf.installed() if f["second_opinion"] else None
        server = bench_lib.ServerUrls.given(f["url"], f["metrics_url"], f["http_url"])
        report = bench_lib.bench_spec(spec, workload=workload, server=server, repo=f["repo"], sweep=sweep,
                                      second_opinion=other)
    said = sys.stderr if as_json else sys.stdout
    print(bench_lib.report_json(report) if as_json else bench_lib.format_report(report))
    if other is not None and not as_json and any(lv.aiperf for lv in report.levels):
        print("\n" + aiperf.format_side_by_side(report))
    if f["json_file"]:
        print(f"json: {bench_lib.write_json(report, f['json_file'])}", file=said)
    if f["plot"]:
        print(f"plot: {bench_lib.plot_report(report, f['plot'])}", file=said)
    bench_lib.check_failures(report)


def package_command(spec: BuildSpec, **flags: Any) -> Any:
    """Write and validate the Triton model repository (ensemble, BLS draft-target) for --target trtllm|reference;
    for --runtime pytorch the `llmapi` model repository over the exported Hugging Face checkpoint.

    Earlier stages' outputs are located, never built: run `build --until compile` (or calibrate) first.
    Explicit directories replace the located ones; the repository is named by the build layout unless only
    explicit directories are given.
    """
    from pipeline.backends import backend_for
    from pipeline.core.refs import write_ref
    from pipeline.stages.package.inputs import PackageInputs
    from pipeline.stages.package.located import package_inputs

    f = parse_flags("package", flags)
    backend = backend_for(spec)
    inputs = package_inputs(spec, PackageInputs.of(f))
    res = backend.package(spec, inputs, force=f["force"])
    if inputs.build_id is not None and f["output"] is None:  # the spec's own build: its ref points here
        write_ref("package", spec.identity("package"), {"triton_repo": res})
    for w in res.manifest.warnings:
        print(f"warning: {w}", file=sys.stderr)
    state = "current (no-op)" if res.status == "cached" else "written"
    note = f", {backend.repo_note()}" if backend.repo_note() else ""
    print(f"ok: {res.path} {state}: {', '.join(res.manifest.models)} (target {res.manifest.target}{note})")
    return res


def serve_command(spec: BuildSpec | None, **flags: Any) -> Any:
    """Run tritonserver on an installed copy of the repository until Ctrl-C; it dies with this task. It is launched
    as the repository's launch plan says (one process; leader-mode ranks under mpirun; or one orchestrator process
    for draft-target), the same plan `deploy` renders.

    `--mode trtllm-serve` instead runs TensorRT-LLM's OpenAI-compatible server (/v1/chat/completions): on the
    exported Hugging Face checkpoint (--runtime pytorch) or on the engine with --backend tensorrt (--runtime engine),
    with the build's LLM-API options YAML (GPU host with TensorRT-LLM 1.2.1).
    """
    from pipeline.serving import foreground
    from pipeline.serving.serve import TritonServer, check_host, serve_ports
    from pipeline.stages.package import launch_plan

    f = parse_flags("serve", flags)
    if f["mode"] == "trtllm-serve":
        return foreground.serve_trtllm(spec, port=f["http_port"] or 8000, host=f["host"] or "127.0.0.1",
                                       print_only=f["print_only"])
    given = {name: f[f"{name}_port"] for name in ("http", "grpc", "metrics")}
    host = check_host(f["host"] or "127.0.0.1")
    ports = serve_ports(host=host, offset=f["port_offset"], given=given, check_free=not f["print_only"])
    if f["print_only"]:
        endpoints = launch_plan.Endpoints(host, ports["http"], ports["grpc"], ports["metrics"])
        plan = foreground.print_launch_plan(spec, f["repo"], endpoints)
        if spec is not None and not f["repo"] and runtime_of(spec).llmapi:
            _print_model_yaml(spec, foreground.planned_repo(spec))
        return plan
    path = foreground.repo_for(spec, f["repo"])
    server = TritonServer(path, host=host, http_port=ports["http"], grpc_port=ports["grpc"],
                          metrics_port=ports["metrics"], ready_timeout_s=f["ready_timeout"],
                          engine_dir=_path(f["engine_dir"]), draft_engine_dir=_path(f["draft_engine_dir"]))
    foreground.serve_until_stopped(server, path)


def _print_model_yaml(spec: BuildSpec, repo: Path) -> None:
    """Under the launch plan of an `llmapi` repository: its model.yaml, the arguments Triton's LLM-API model gives
    `tensorrt_llm.LLM` unchanged (every key but triton_config), as `#` lines; planned from the spec when the
    repository is not built yet (nothing is located or written)."""
    from pipeline.core.artifacts import engines_dir
    from pipeline.core.layout import PENDING
    from pipeline.stages.package import llmapi_yaml
    from pipeline.stages.package.eagle3_head import HEAD_DIR
    from pipeline.stages.package.llmapi_options import llm_api_options
    from pipeline.stages.package.llmapi_package import model_yaml

    path = repo / llmapi_yaml.MODEL_YAML
    if path.is_file():
        data, note = llmapi_yaml.read(path), ""
    else:
        ckpt = runtime_of(spec).checkpoint.dirname
        draft = (None if spec.draft_model is None else str(path.parent / HEAD_DIR) if spec.quantized_draft is None
                 else str(engines_dir() / f"{PENDING}-draft" / ckpt))
        options = llm_api_options(spec, draft_dir=draft)
        data = model_yaml(spec, options, model=str(engines_dir() / PENDING / ckpt), draft=draft, tokenizer=None)
        note = f" (written by package; {PENDING} is the id calibration gives the build)"
    print(f"# {path}{note}: tensorrt_llm.LLM arguments, as trtllm-serve's --extra_llm_api_options")
    print("\n".join(f"#   {line}" for line in llmapi_yaml.dump(data).splitlines() if not line.startswith("#")))


def smoke_command(spec: BuildSpec | None, **flags: Any) -> None:
    """Start a server (unless given), HTTP + gRPC (streaming, or unary with a draft) via the ensemble, BLS
    draft-target; non-zero exit on failure."""
    from pipeline.serving import smoke
    from pipeline.serving.foreground import repo_for

    f = parse_flags("smoke", flags)
    path = None if (f["http_url"] and f["grpc_url"] and not f["repo"]) else repo_for(spec, f["repo"])
    results = smoke.run_smoke(path, http_url=f["http_url"], grpc_url=f["grpc_url"],
                              prompt=f["prompt"] or smoke.DEFAULT_PROMPT, max_tokens=f["max_tokens"],
                              num_draft_tokens=f["num_draft_tokens"], ready_timeout_s=f["ready_timeout"])
    print(f"ok: smoke passed ({len(results)} routes)")


def install_repo_command(repo: str | None = None, **flags: Any) -> None:
    """Make every path parameter of a repository absolute (and checked) so bare `tritonserver` can serve it."""
    from pipeline.stages.package.install import install_command

    f = parse_flags("install_repo", {"repo": repo, **flags})
    if not repo:
        raise SpecError(f"give --repo DIR, the model repository to install (`{_program()} install-repo --help`)")
    install_command(repo, dest=f["dest"], engine_dir=f["engine_dir"], draft_engine_dir=f["draft_engine_dir"])


def deploy_command(spec: BuildSpec | None, **flags: Any) -> dict[str, Any]:
    """Render deployment files (Kubernetes or Slurm) for a release or a spec, validated before anything is written.

    Serving deployments also get their Prometheus rules (operations and cost) and Grafana dashboard (README
    "Watching cost").
    """
    from pipeline.ops.deploy.request import DeployRequest, deploy

    request = DeployRequest(**parse_flags("deploy", flags))
    done = deploy(spec, request)
    for w in done.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(done.summary, indent=2) if request.json else done.line)
    return done.summary
