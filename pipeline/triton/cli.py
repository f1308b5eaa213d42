"""Bodies of `invoke package`, `invoke serve` and `invoke smoke` (tasks.py stays thin wiring)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import ServeError


def _checkpoint(spec, role: str) -> tuple[Path, str | None]:
    from ..calibrate import run_calibrate

    res = run_calibrate(spec, role=role)
    return Path(res.path), res.build_id


def package_command(spec, *, output=None, engine_dir=None, draft_engine_dir=None, checkpoint_dir=None,
                    draft_checkpoint_dir=None, tokenizer_dir=None, force=False) -> Any:
    """Locate the stage inputs (calibrate / compile outputs unless given), package, print one line."""
    from .package import package_repo

    build_id = None
    if spec.target == "reference":
        if checkpoint_dir is None:
            checkpoint_dir, build_id = _checkpoint(spec, "target")
        if spec.draft_model and draft_checkpoint_dir is None:
            draft_checkpoint_dir, _ = _checkpoint(spec, "draft")
    elif engine_dir is None:
        from ..compile.cli import engine_dirs_for

        ckpt, build_id = _checkpoint(spec, "target")
        engine_dir, default_draft = engine_dirs_for(ckpt, spec)
        draft_engine_dir = draft_engine_dir or (default_draft if spec.draft_model else None)
        tokenizer_dir = tokenizer_dir or ckpt
    res = package_repo(
        spec, build_id=build_id, output=Path(output) if output else None,
        engine_dir=Path(engine_dir) if engine_dir else None,
        draft_engine_dir=Path(draft_engine_dir) if draft_engine_dir else None,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
        draft_checkpoint_dir=Path(draft_checkpoint_dir) if draft_checkpoint_dir else None,
        tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None, force=force,
    )
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    state = "current (no-op)" if res.reused else "written"
    print(f"ok: {res.path} {state}: {', '.join(res.manifest['models'])} (target {res.manifest['target']})")
    return res


def _repo_for(spec, repo) -> Path:
    if repo:
        return Path(repo)
    if spec is None:
        raise ServeError("give --repo PATH (a model repository) or the build's spec (--model ... / --spec FILE)")
    from ..build import locate_outputs

    path = locate_outputs(spec).triton_repo
    if path is None:
        raise ServeError("the build has no Triton repository yet; run `invoke package` (or `invoke build`)")
    return Path(path)


def serve_command(spec, *, repo=None, http_port=None, grpc_port=None, metrics_port=None, ready_timeout=300.0,
                  engine_dir=None, draft_engine_dir=None) -> None:
    """Serve an installed copy of the repository until interrupted (Ctrl-C / SIGTERM), then stop cleanly."""
    import signal
    import time

    from ..serve import TritonServer

    path = _repo_for(spec, repo)
    from ..artifacts import read_manifest

    manifest = read_manifest(path) or {}
    world = int(manifest.get("world_size", 1)) if manifest.get("target") == "trtllm" else 1
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
