"""Engine manifests, the compile stage key, and the draft/target tokenizer check."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.artifacts import MANIFEST, file_table, sha256_file, stage_key
from pipeline.core.errors import CompileError, PipelineError
from pipeline.core.manifests import DraftRecord, EngineManifest, GpuRecord, InputRecord, TokenizerIdentity
from pipeline.core.tokenizer import TOKENIZER_DIR, identity, mismatch
from pipeline.core.upstream import Upstream
from pipeline.stages.compile.engine_plan import EnginePlan

STAGE = "compile"
STAGE_VERSION = 1


def _sha_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def tokenizer_fingerprint(ckpt_dir: Path) -> TokenizerIdentity:
    """The identity of the tokenizer exported with a checkpoint (`<ckpt>/tokenizer/`).

    Raises:
        CompileError: no tokenizer was exported with the checkpoint, or it is unreadable.
    """
    try:
        return identity(Path(ckpt_dir) / TOKENIZER_DIR)
    except PipelineError as exc:
        raise CompileError(f"checkpoint {ckpt_dir} has no usable tokenizer: {exc}", path=exc.path) from None


def check_same_tokenizer(target_ckpt: Path, draft_ckpt: Path) -> TokenizerIdentity:
    """The shared tokenizer identity of the two checkpoints; raise before any compile when they differ."""
    t, d = tokenizer_fingerprint(target_ckpt), tokenizer_fingerprint(draft_ckpt)
    why = mismatch(t, d)
    if why:
        raise CompileError(f"draft checkpoint {draft_ckpt} has a different tokenizer than the target {target_ckpt} "
                           f"({why})", expected=t, actual=d)
    return t


def checkpoint_identity(ckpt_dir: Path) -> InputRecord:
    """How an engine manifest records its checkpoint (`Upstream.of_dir(...).record()`): path, key, manifest hash."""
    return Upstream.of_dir(ckpt_dir).record()


def compile_key(plan: EnginePlan, *, checkpoint_key: str, toolchain: dict[str, Any],
                draft_key: str | None = None) -> str:
    """Stage key: the plan, the checkpoint it reads, the toolchain versions and the GPU architecture."""
    return stage_key({
        "stage": STAGE,
        "stage_version": STAGE_VERSION,
        "plan": plan.key_factors(),
        "checkpoint": checkpoint_key,
        "toolchain": {k: toolchain.get(k) for k in ("tensorrt_llm", "tensorrt", "cuda")},
        "arch": {"sm": toolchain.get("sm"), "gpu": toolchain.get("gpu_name")},
        "draft": draft_key,
    })


def build_config_hash(engine_config: dict[str, Any]) -> str:
    return _sha_json(engine_config["build_config"])


@dataclass(frozen=True)
class BuildRun:
    """One trtllm-build run: the engine config.json it wrote (verified), how long it took, where its log is."""

    engine_config: dict[str, Any]
    seconds: float | None = None
    log_path: Path | None = None


def engine_manifest(
    engine_dir: Path,
    plan: EnginePlan,
    *,
    key: str,
    run: BuildRun,
    toolchain: dict[str, Any],
    checkpoint: InputRecord,
    draft: DraftRecord | None = None,
) -> EngineManifest:
    """The manifest of a verified engine directory (files hashed as they are now; the checkpoint's tokenizer)."""
    engine_dir = Path(engine_dir)
    try:
        tokenizer = identity(Path(plan.checkpoint_dir) / TOKENIZER_DIR)
    except PipelineError:
        tokenizer = None  # a checkpoint exported outside the pipeline, without tokenizer/
    return EngineManifest(
        key=key,
        role=plan.role,
        model=plan.model,
        precision=plan.precision,
        kv_cache=plan.kv_cache,
        tp=plan.tp,
        pp=plan.pp,
        world_size=plan.world_size,
        engine_version=run.engine_config["version"],
        toolchain={k: toolchain.get(k) for k in ("tensorrt_llm", "tensorrt", "cuda", "driver")},
        gpu=GpuRecord(name=toolchain.get("gpu_name"), sm=toolchain.get("sm"), count=toolchain.get("gpu_count")),
        argv=plan.argv,  # as run, with the final engine directory
        planned_build_config=plan.expected_build_config,
        build_config_sha256=build_config_hash(run.engine_config),
        files=file_table(engine_dir),
        checkpoint=checkpoint,
        tokenizer=tokenizer,
        draft=draft,
        build_seconds=round(run.seconds, 1) if run.seconds is not None else None,
        log=str(run.log_path) if run.log_path else None,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def draft_record(draft_dir: Path, tokenizer: TokenizerIdentity) -> DraftRecord:
    """How a target manifest records its draft engine: path, key, manifest hash, the shared tokenizer."""
    m = EngineManifest.read(draft_dir)
    if m is None:
        raise CompileError(f"draft engine {draft_dir} has no manifest.json; compile the draft first", path=draft_dir)
    return DraftRecord(path=str(draft_dir), model=m.model, key=m.key,
                       manifest_sha256=sha256_file(Path(draft_dir) / MANIFEST), tokenizer=tokenizer)
