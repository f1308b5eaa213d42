"""invoke tasks: thin wiring over the `pipeline` library. `invoke --list` shows them; `invoke TASK --help` the flags.

Exit codes (pipeline/errors.py): 0 ok; 2 bad input or a missing prerequisite; 3 an artifact differs from its
manifest or release record; 4 this host lacks the GPU/toolchain (or an engine was built for another); 5 the work
ran and failed (I/O error, failed requests).
"""

from __future__ import annotations

import json

from invoke import task

from pipeline.cli import SPEC_HELP, with_spec


def _help(**own: str) -> dict[str, str]:
    return {**SPEC_HELP, **own}


@task(auto_shortflags=False, help=_help())
@with_spec
def check(c, spec):
    """Validate a build spec (model, precision, KV, parallelism, speculation, GPU) and print it in one line."""
    print(spec.summary())


@task(
    auto_shortflags=False,
    help=_help(
        input_len="prompt tokens per request for capacity/throughput (default min(1024, max_input_len))",
        output_len="output tokens per request (default 256)",
        json="print the plan as JSON",
    ),
)
@with_spec
def plan(c, spec, input_len=None, output_len=None, json_=False):
    """Plan memory fit, KV capacity, concurrency, decode throughput bound and $ per 1M output tokens."""
    from pipeline.cli import int_option
    from pipeline.planner import format_plan
    from pipeline.planner import plan as make_plan

    result = make_plan(
        spec,
        input_len=int_option("input_len", input_len),
        output_len=int_option("output_len", output_len),
    )
    print(json.dumps(result.as_dict(), indent=2) if json_ else format_plan(result))


@task(
    name="compile",
    auto_shortflags=False,
    help=_help(
        dry_run="print the trtllm-build plan (argv, expected outputs, GPU memory) and exit; works on any machine",
        checkpoint_dir="target TensorRT-LLM checkpoint dir (default: the calibrate stage's engines/<build-id>/checkpoint)",
        draft_checkpoint_dir="draft checkpoint dir (default: the calibrate stage's draft checkpoint)",
        force="rebuild even when the engine manifest's key is current",
        json="print the plan / engine manifest as JSON",
    ),
)
@with_spec
def compile_engines(c, spec, dry_run=False, checkpoint_dir=None, draft_checkpoint_dir=None, force=False, json_=False):
    """Compile TensorRT-LLM 1.2.1 engines (target + draft) for SM 90 from the exported checkpoint(s)."""
    from pipeline.compile.cli import compile_command

    compile_command(spec, dry_run=dry_run, checkpoint_dir=checkpoint_dir, draft_checkpoint_dir=draft_checkpoint_dir,
                    force=force, as_json=json_)


# --- build / release / verify / bench ----------------------------------------------------------------------------
@task(
    auto_shortflags=False,
    help=_help(
        until="last stage to run: check, download, calibrate, compile, package",
        from_="first stage to run; earlier stages must already be current (they are located, not run)",
        force="rebuild this stage and every stage after it even when current",
        json="print the build report as JSON on stdout (progress stays on stderr)",
        offline="download: use only the local cache",
        update="download: re-resolve a branch revision to its newest commit",
        verify_download="download: re-hash every cached file",
        verify="re-hash every stage output (sha256), not only sizes and mtimes, before reusing it",
        revision="download: model revision (branch, tag or commit) overriding the registry's",
        endpoint="download: Hugging Face Hub endpoint URL",
    ),
)
@with_spec
def build(c, spec, until=None, from_=None, force=None, json_=False, offline=False, update=False,
          verify_download=False, verify=False, revision=None, endpoint=None):
    """Build end to end: check -> download -> calibrate -> compile (trtllm) -> package; cached stages are no-ops.

    A stage is cached only when its output still matches its manifest; one that does not fails (exit 3) naming
    `--force STAGE`.
    """
    from pipeline.build import BuildOptions
    from pipeline.build import build as run_build

    opts = BuildOptions(offline=offline, update=update, verify_download=verify_download, verify=verify,
                        revision=revision, endpoint=endpoint)
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):  # stages' library chatter must not corrupt --json on stdout
        report = run_build(spec, until=until, from_stage=from_, force=force, options=opts)
    if json_:
        print(json.dumps(report.as_dict(), indent=2))


@task(
    auto_shortflags=False,
    help=_help(
        output="directory for the tarball: any directory, absolute or relative to the output tree (default releases/)",
        version="release version: letters, digits and . _ + - (default: the pipeline's version)",
        json="print release.json's summary as JSON",
    ),
)
@with_spec
def release(c, spec, output=None, version=None, json_=False):
    """Pack a finished build as a deterministic, versioned release tarball + .sha256 (run `invoke build` first).

    Every packed file is re-hashed against its stage manifest; a mismatch refuses the release (exit 3).
    """
    from pipeline.release import release as make_release

    r = make_release(spec, output=output, version=version)
    if json_:
        doc = {k: v for k, v in r.document.items() if k != "files"}
        print(json.dumps({"tarball": str(r.tarball), "sha256": r.sha256, "files": len(r.document["files"]),
                          "release": doc}, indent=2))
    else:
        print(f"ok: {r.tarball} sha256 {r.sha256} ({len(r.document['files'])} files)")


@task(
    positional=["path"],
    auto_shortflags=False,
    help={
        "path": "release .tar.gz, unpacked release dir, or Triton model repository",
        "skip_host": "check hashes only, not the host's TensorRT-LLM/TensorRT/GPU against the engines",
        "json": "print the verification report as JSON",
    },
)
def verify(c, path, skip_host=False, json_=False):
    """Check every sha256 of a release or repo (complete: no extra file, no symlink) and refuse engines built for
    another toolchain/GPU. Exit 3: files differ; 4: host mismatch; 2: not a release."""
    from pipeline.cli import exit_on_error
    from pipeline.verify import verify as run_verify

    if path.startswith("-"):  # `invoke verify --help` hands the flag over as the positional path
        import sys

        print(f"error: {path} is not a path; usage: invoke verify PATH [--skip-host] [--json] "
              "(help: invoke --help verify)", file=sys.stderr)
        raise SystemExit(2)
    report = exit_on_error(run_verify)(path, check_host=not skip_host)
    if json_:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        host = "host matches" if report.host_checked else "host not checked"
        print(f"ok: {report.kind} {path}: {report.files_checked} files verified; {host}")
        for note in report.notes:
            print(f"note: {note}")


@task(
    auto_shortflags=False,
    help=_help(
        url="gRPC address of a running server (127.0.0.1:PORT); default: start tritonserver on the build's repo",
        metrics_url="Triton metrics URL (http://127.0.0.1:PORT/metrics) for the prefix-cache hit ratio",
        repo="model repository to serve (default: the build's Triton repo)",
        model_name="model to call (default: tensorrt_llm_bls when served, else ensemble)",
        concurrency="comma-separated concurrency levels (default 1,2,4)",
        requests="requests per concurrency level (default 8)",
        max_tokens="output tokens per request (default 32)",
        no_stream="send non-streaming requests (TTFT not measurable)",
        budget="seconds per concurrency level before no new requests are sent (default 60)",
        json="write the report as JSON to this file",
        plot="write a latency-vs-throughput PNG to this file (needs matplotlib)",
    ),
)
@with_spec
def bench(c, spec, url=None, metrics_url=None, repo=None, model_name=None, concurrency="1,2,4", requests=None,
          max_tokens=None, no_stream=False, budget=None, json_=None, plot=None):
    """Benchmark a Triton deployment: TTFT, time per token, tok/s, p50/p99, $ per 1M output tokens.

    Exit codes: 0 every request succeeded; 5 some request failed (report printed, then one error line);
    2 the benchmark could not run.
    """
    from pipeline.bench import bench_spec, check_failures, format_report, parse_levels, plot_report, write_json
    from pipeline.cli import int_option

    report = bench_spec(
        spec, url=url, metrics_url=metrics_url, repo=repo, model=model_name, concurrency=parse_levels(concurrency),
        requests_per_level=int_option("requests", requests, default=8),
        max_tokens=int_option("max_tokens", max_tokens, default=32), stream=False if no_stream else None,
        level_budget_s=int_option("budget", budget, default=60.0, kind=float, minimum=0.1),
    )
    print(format_report(report))
    if json_:
        print(f"json: {write_json(report, json_)}")
    if plot:
        png = plot_report(report, plot)
        print(f"plot: {png}" if png else "plot: skipped (matplotlib is not installed)")
    check_failures(report)


@task(auto_shortflags=False, help=_help(force="rebuild even when the checkpoint for these inputs exists"))
@with_spec
def calibrate(c, spec, force=False):
    """Quantize with ModelOpt (FP8/INT4-AWQ/W4A8-AWQ/INT8-SQ), gate on held-out quality, export TRT-LLM checkpoints."""
    from pipeline.calibrate import run_calibrate

    roles = ["target"] + (["draft"] if spec.draft_model else [])
    for role in roles:
        res = run_calibrate(spec, role=role, force=bool(force))
        q = res.manifest.quality
        print(
            f"ok: {role} {res.status}: {res.path} (ppl {q.get('ppl_base', 0):.4f} -> {q.get('ppl_quant', 0):.4f}, "
            f"{q.get('ppl_delta_pct', 0):+.3f} %, top-1 {q.get('top1_agreement', 0):.3f})"
        )


# --- package / serve / smoke ---------------------------------------------------------------------------------------

@task(
    auto_shortflags=False,
    help=_help(
        output="parent directory of the repository (default triton_repo/); the repo is <output>/<build-id>[-reference]",
        engine_dir="trtllm: target engine dir (default: the compile stage's engines/<build-id>/engine)",
        draft_engine_dir="trtllm: draft engine dir (default: <engine-dir>/../draft_engine)",
        checkpoint_dir="reference: target checkpoint dir (default: the calibrate stage's engines/<build-id>/checkpoint)",
        draft_checkpoint_dir="reference: draft checkpoint dir (default: the calibrate stage's draft checkpoint)",
        tokenizer_dir="tokenizer files to copy into the repo (default: the checkpoint's tokenizer/)",
        draft_tokenizer_dir="trtllm: the draft's tokenizer, for a draft engine built outside the pipeline",
        force="rewrite the repository even when its manifest key is current",
    ),
)
@with_spec
def package(c, spec, output=None, engine_dir=None, draft_engine_dir=None, checkpoint_dir=None,
            draft_checkpoint_dir=None, tokenizer_dir=None, draft_tokenizer_dir=None, force=False):
    """Write and validate the Triton model repository (ensemble, BLS draft-target) for --target trtllm|reference.

    Earlier stages' outputs are located, never built: run `invoke build --until compile` (or calibrate) first.
    """
    from pipeline.triton.cli import package_command

    package_command(spec, output=output, engine_dir=engine_dir, draft_engine_dir=draft_engine_dir,
                    checkpoint_dir=checkpoint_dir, draft_checkpoint_dir=draft_checkpoint_dir,
                    tokenizer_dir=tokenizer_dir, draft_tokenizer_dir=draft_tokenizer_dir, force=bool(force))


_SERVE_HELP = dict(
    repo="model repository to serve (default: the spec's repo under triton_repo/; --model is then needed)",
    http_port="HTTP port on 127.0.0.1 (default: a free port)",
    grpc_port="gRPC port on 127.0.0.1 (default: a free port)",
    metrics_port="metrics port on 127.0.0.1 (default: a free port)",
    ready_timeout="seconds to wait for readiness (default 300)",
)


@task(
    auto_shortflags=False,
    help=_help(
        **_SERVE_HELP,
        engine_dir="serve tensorrt_llm from this engine dir (the repository itself is not changed)",
        draft_engine_dir="serve tensorrt_llm_draft from this engine dir",
    ),
)
@with_spec(optional=True)
def serve(c, spec, repo=None, http_port=None, grpc_port=None, metrics_port=None, ready_timeout=None,
          engine_dir=None, draft_engine_dir=None):
    """Run tritonserver (127.0.0.1) on an installed copy of the repository until Ctrl-C; it dies with this task."""
    from pipeline.cli import int_option
    from pipeline.triton.cli import serve_command

    serve_command(spec, repo=repo, http_port=int_option("http_port", http_port),
                  grpc_port=int_option("grpc_port", grpc_port), metrics_port=int_option("metrics_port", metrics_port),
                  ready_timeout=int_option("ready_timeout", ready_timeout, default=300.0, kind=float, minimum=0.1),
                  engine_dir=engine_dir, draft_engine_dir=draft_engine_dir)


@task(
    name="install-repo",
    auto_shortflags=False,
    help={
        "repo": "model repository to install (e.g. triton_repo/<build-id>)",
        "dest": "write the installed repository here instead of editing --repo in place (must not exist)",
        "engine_dir": "point tensorrt_llm at this engine dir",
        "draft_engine_dir": "point tensorrt_llm_draft at this engine dir",
    },
)
def install_repo(c, repo, dest=None, engine_dir=None, draft_engine_dir=None):
    """Make every path parameter of a repository absolute (and checked) so bare `tritonserver` can serve it."""
    from pipeline.cli import exit_on_error
    from pipeline.triton.install import install_command

    exit_on_error(install_command)(repo, dest=dest, engine_dir=engine_dir, draft_engine_dir=draft_engine_dir)


@task(
    auto_shortflags=False,
    help=_help(
        repo=_SERVE_HELP["repo"],
        http_url="HTTP address of a running server (127.0.0.1:PORT); with --grpc-url no server is started",
        grpc_url="gRPC address of a running server (127.0.0.1:PORT)",
        prompt="prompt text",
        max_tokens="output tokens per request (default 24)",
        num_draft_tokens="draft tokens per step for the BLS route (default: the repo's K)",
        ready_timeout="seconds to wait for readiness (default 300)",
    ),
)
@with_spec(optional=True)
def smoke(c, spec, repo=None, http_url=None, grpc_url=None, prompt=None, max_tokens=None, num_draft_tokens=None,
          ready_timeout=None):
    """Start a server (unless given), HTTP + gRPC (streaming, or unary with a draft) via the ensemble, BLS draft-target; non-zero exit on failure."""
    from pipeline.cli import int_option
    from pipeline.triton.cli import smoke_command

    smoke_command(spec, repo=repo, http_url=http_url, grpc_url=grpc_url, prompt=prompt,
                  max_tokens=int_option("max_tokens", max_tokens, default=24),
                  num_draft_tokens=int_option("num_draft_tokens", num_draft_tokens),
                  ready_timeout=int_option("ready_timeout", ready_timeout, default=300.0, kind=float, minimum=0.1))


@task(
    auto_shortflags=False,
    help=_help(
        revision="branch, tag or commit overriding the registry's (target model only)",
        update="re-resolve the branch/tag to its current commit instead of the locked one (models.lock.json)",
        offline="no network: reuse a previous download, fail clearly when there is none",
        verify="re-hash every file against the Hub's oids (corrupt files are fetched again)",
        endpoint="Hub URL (default: HF_ENDPOINT or https://huggingface.co); the token comes from HF_TOKEN/hf auth login",
    ),
)
@with_spec
def download(c, spec, revision=None, update=False, offline=False, verify=False, endpoint=None):
    """Download (or generate) the model's checkpoint, pinned to a commit and verified; prints the local path."""
    from pipeline.download import download_model

    for i, entry in enumerate(e for e in (spec.model, spec.draft_model) if e is not None):
        res = download_model(entry, revision=revision if i == 0 else None, update=update, offline=offline,
                             verify=verify, endpoint=endpoint)
        m = res.manifest
        print(f"{entry.name}: {m.source} {entry.repo_id}@{m.sha[:12]} {len(m.files)} files "
              f"{m.total_bytes / 1e6:.1f} MB [{res.status}] -> {res.path}")
