"""`serve` in the foreground: tritonserver (or trtllm-serve) on a build's repository until Ctrl-C or SIGTERM, or the
launch plan printed instead."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.artifacts import triton_repo_dir
from pipeline.core.errors import BuildError, PipelineError, ServeError, ServerFailed, SpecError
from pipeline.core.layout import PENDING, SPEC_KEY_CHARS
from pipeline.core.spec import BuildSpec
from pipeline.core.table import format_table
from pipeline.serving.serve import TritonServer
from pipeline.stages.package import launch_plan


def repo_for(spec: BuildSpec | None, repo: str | Path | None) -> Path:
    """`repo`, else the current repository of `spec`'s build."""
    if repo:
        return Path(repo)
    if spec is None:
        raise ServeError("give --repo PATH (a model repository) or the build's spec (--model ... / --spec FILE)")
    return built_repo(spec)


def built_repo(spec: BuildSpec) -> Path:
    """The model repository of `spec`'s finished build, located check-only.

    Raises:
        PipelineError: the build is not finished (the message says what to run).
    """
    from pipeline.stages.build import locate_outputs

    found = locate_outputs(spec).triton_repo
    if found is None:  # locate_outputs raises for a missing stage output: a build without a package stage
        raise BuildError(f"the build of {spec.model.name} makes no model repository; run `invoke build`")
    return found.path


def _print_addresses(server: TritonServer, path: Path) -> None:
    configured = {"http": server.http_url, "grpc": server.grpc_url,
                  "metrics": server.metrics_url.removeprefix("http://")}
    rows = [("", what, f"{bound} (bound)" if (bound := server.bound.get(what)) else f"{addr} (configured)")
            for what, addr in configured.items()]
    table = format_table([*rows, ("", "log", str(server.log_file))])
    print(f"ok: serving {path} (installed copy {server.launch_dir})\n{table}\n(Ctrl-C to stop)", flush=True)


def serve_until_stopped(server: TritonServer, path: Path) -> None:
    """Start `server` on repository `path`, print its addresses, and keep it until Ctrl-C or SIGTERM; ServerFailed
    when it exits or loses a Python stub on its own."""
    stop = {"flag": False}

    def _term(*_):
        stop["flag"] = True

    old = signal.signal(signal.SIGTERM, _term)
    try:
        server.start()
        _print_addresses(server, path)
        while not stop["flag"]:
            if not server.running:
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


def planned_repo(spec: BuildSpec) -> Path:
    """The repository `package` makes (or made) for `spec`: its current path, else its name with the build id that
    calibration will fix."""
    from pipeline.core.runtimes import runtime_of

    with contextlib.suppress(PipelineError):
        return built_repo(spec)
    name = f"{PENDING}-{spec.identity()[:SPEC_KEY_CHARS]}" + runtime_of(spec).repo_suffix
    return triton_repo_dir() / name


def print_launch_plan(spec: BuildSpec | None, repo: str | None,
                      endpoints: launch_plan.Endpoints) -> launch_plan.LaunchPlan:
    """Print the launch plan (env + command) of `repo` or of the spec's repository; nothing runs or is written."""
    from pipeline.core.host import visible_gpu_count
    from pipeline.planning.placement import node_gpus
    from pipeline.serving.serve import NGC_TRITONSERVER, find_gpu_tritonserver

    if repo and Path(repo).is_dir():
        path, shape = Path(repo).resolve(), launch_plan.shape_from_repo(Path(repo))
        gpus = visible_gpu_count()
    elif spec is not None:
        path, shape = (Path(repo) if repo else planned_repo(spec)), launch_plan.shape_from_spec(spec)
        gpus = node_gpus(spec.hardware)
    else:
        raise ServeError("give --repo PATH (a model repository) or the build's spec (--model ... / --spec FILE)")
    binary = "tritonserver" if shape.kind == "reference" else str(find_gpu_tritonserver() or NGC_TRITONSERVER)
    server = launch_plan.ServerArgs(str(path), binary, endpoints, shm_prefix="tripipe-")
    plan = launch_plan.plan_launch(shape, server, gpus_per_node=gpus)
    print(plan.format())
    if plan.mode == "cpu-reference":
        print("# serve runs the nvidia-pytriton tritonserver with --backend-directory/--cache-directory of its bundle "
              "and serves an installed copy of the repository")
    return plan


def serve_trtllm(spec: BuildSpec | None, *, port: int, host: str, print_only: bool):
    """Run (or print) trtllm-serve on the build's HF checkpoint (runtime pytorch) or engine (runtime engine), with
    its options YAML; `print_only` works from the spec alone (see `pipeline.serving.llmapi.local_inputs`)."""
    from pipeline.serving.llmapi import local_inputs
    from pipeline.stages.package import serve_plan

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
