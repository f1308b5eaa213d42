"""Bodies of `invoke package`, `invoke serve` and `invoke smoke` (tasks.py stays thin wiring)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import ServeError


def package_command(spec, *, output=None, engine_dir=None, draft_engine_dir=None, checkpoint_dir=None,
                    draft_checkpoint_dir=None, tokenizer_dir=None, draft_tokenizer_dir=None, force=False) -> Any:
    """Package the build's stage outputs (located check-only: this never calibrates or compiles), print one line.

    Explicit directories replace the located ones; the repository is named by the build layout unless only
    explicit directories are given.
    """
    from .package import package_repo

    explicit = checkpoint_dir if spec.target == "reference" else engine_dir
    kwargs: dict[str, Any] = {}
    if explicit is None:
        from ..build import locate_outputs

        out = locate_outputs(spec, until="compile" if spec.target == "trtllm" else "calibrate")
        lay = out.layout
        kwargs = dict(build_id=lay.build_id, name=lay.repo_name, spec_key=lay.spec_key)
        checkpoint_dir = checkpoint_dir or out.checkpoint.path
        tokenizer_dir = tokenizer_dir or out.checkpoint.path
        if out.draft_checkpoint is not None:
            draft_checkpoint_dir = draft_checkpoint_dir or out.draft_checkpoint.path
        if out.engine is not None:
            engine_dir = engine_dir or out.engine.path
            draft_engine_dir = draft_engine_dir or (out.draft_engine.path if out.draft_engine else None)

    def path(p):
        return Path(p) if p else None

    res = package_repo(
        spec, output=path(output), engine_dir=path(engine_dir), draft_engine_dir=path(draft_engine_dir),
        checkpoint_dir=path(checkpoint_dir), draft_checkpoint_dir=path(draft_checkpoint_dir),
        tokenizer_dir=path(tokenizer_dir), draft_tokenizer_dir=path(draft_tokenizer_dir), force=force, **kwargs,
    )
    for w in res.manifest.warnings:
        print(f"warning: {w}", file=sys.stderr)
    state = "current (no-op)" if res.status == "cached" else "written"
    print(f"ok: {res.path} {state}: {', '.join(res.manifest.models)} (target {res.manifest.target})")
    return res


def _repo_for(spec, repo) -> Path:
    if repo:
        return Path(repo)
    if spec is None:
        raise ServeError("give --repo PATH (a model repository) or the build's spec (--model ... / --spec FILE)")
    from ..build import locate_outputs

    return locate_outputs(spec).triton_repo.path


def serve_command(spec, *, repo=None, http_port=None, grpc_port=None, metrics_port=None, ready_timeout=300.0,
                  engine_dir=None, draft_engine_dir=None) -> None:
    """Serve an installed copy of the repository until interrupted (Ctrl-C / SIGTERM), then stop cleanly."""
    import signal
    import time

    from ..serve import TritonServer

    path = _repo_for(spec, repo)
    from ..manifests import RepoManifest

    manifest = RepoManifest.read(path)
    world = manifest.world_size if manifest is not None and manifest.target == "trtllm" else 1
    server = TritonServer(path, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                          ready_timeout_s=ready_timeout, world_size=world,
                          engine_dir=Path(engine_dir) if engine_dir else None,
                          draft_engine_dir=Path(draft_engine_dir) if draft_engine_dir else None)
    stop = {"flag": False}

    def _term(*_):
        stop["flag"] = True

    old = signal.signal(signal.SIGTERM, _term)
    try:
        server.start()
        configured = {"http": server.http_url, "grpc": server.grpc_url,
                      "metrics": server.metrics_url.removeprefix("http://")}
        lines = [f"ok: serving {path} (installed copy {server.launch_dir})"]
        for what, addr in configured.items():
            bound = server.bound.get(what)
            lines.append(f"  {what:<8}{bound} (bound)" if bound else f"  {what:<8}{addr} (configured)")
        lines += [f"  log     {server.log_file}", "(Ctrl-C to stop)"]
        print("\n".join(lines), flush=True)
        while not stop["flag"]:
            if server._proc is None or server._proc.poll() is not None:
                raise ServeError(f"tritonserver exited; see {server.log_file}: {server.log_tail()}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, old)
    print("ok: server stopped")


def smoke_command(spec, *, repo=None, http_url=None, grpc_url=None, prompt=None, max_tokens=24,
                  num_draft_tokens=None, ready_timeout=300.0) -> None:
    from ..smoke import DEFAULT_PROMPT, run_smoke

    path = None if (http_url and grpc_url and not repo) else _repo_for(spec, repo)
    results = run_smoke(path, http_url=http_url, grpc_url=grpc_url, prompt=prompt or DEFAULT_PROMPT,
                        max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, ready_timeout_s=ready_timeout)
    print(f"ok: smoke passed ({len(results)} routes)")
