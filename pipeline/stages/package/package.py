"""The package stage: render the Triton model repository of a build from the packaged templates, validate it, and
publish it atomically under `triton_repo/`.

Layout (`<output>/<name>/`, default output = `pipeline.core.artifacts.triton_repo_dir()`; `<name>` is the build id
`<model>-<precision>-<hash12>` for `--target trtllm` and `<build-id>-reference` for `--target reference`):

    preprocessing/   config.pbtxt, 1/model.py, tokenizer/      (python; the build's tokenizer, copied)
    tensorrt_llm/    config.pbtxt, 1/[model.py]                  (tensorrtllm backend, or python for reference)
    postprocessing/  config.pbtxt, 1/model.py, tokenizer/
                     (every python model's 1/ also holds request_limits.py, the shared request ceilings)
    ensemble/        config.pbtxt, 1/                            (text in, text out, streaming)
    tensorrt_llm_draft/, tensorrt_llm_bls/                       (only with speculation)
    manifest.json

`<name>` is chosen by the build layout (`pipeline.core.layout.repo_name`: the build id plus the spec's key) when the
build or a task packages; a direct call names it `<build-id>[-reference]` unless its inputs give a `name`.

`gpt_model_path` and `tokenizer_dir` are written *relative to the model's directory* (e.g.
`../../../engines/<id>/engine`), so the repository and `engines/` move together. The C++ backend (and upstream's
python models) need absolute paths: `pipeline.stages.package.install` writes them (`invoke install-repo`; `invoke serve`
launches from such an installed copy).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.runtimes import RuntimeTarget, runtime_named
from pipeline.core.artifacts import atomic_dir, check_name, file_table, read_config_json, stage_key, triton_repo_dir
from pipeline.core.errors import PackageError, PipelineError
from pipeline.core.layout import repo_name
from pipeline.core.manifests import EngineManifest, RepoManifest, StageResult, TokenizerIdentity
from pipeline.core.tokenizer import find_tokenizer, identity, mismatch
from pipeline.core.upstream import Upstream
from pipeline.stages.package import pbtxt
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.render import render, templates_hash, templates_root
from pipeline.stages.package.repo_check import MAX_MEMORY_FRACTION_SUM, validate_repo

_TOKENIZER_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                       "chat_template*", "*.tiktoken")
_QUEUE = {"max_queue_delay_microseconds": 0, "max_queue_size": 0}
# The request ceilings every Python model imports (copied beside each model.py).
SHARED_MODULE = "request_limits.py"


PackageResult = StageResult[RepoManifest]


@dataclass
class LLMSource:
    """What one tensorrt_llm model serves: an engine dir (trtllm) or a checkpoint dir (reference), and limits."""

    path: Path
    max_batch_size: int
    max_beam_width: int
    world_size: int
    kv_reuse_ok: bool
    key: str
    max_draft_len: int = 0


# ---------------------------------------------------------------------------------------------------- sources
def read_engine_source(engine_dir: Path) -> LLMSource:
    """Limits of a TensorRT-LLM 1.2 engine, from its own config.json (never re-typed)."""
    engine_dir = Path(engine_dir)
    cfg = read_config_json(engine_dir / "config.json", PackageError,
                           missing=f"engine dir {engine_dir} has no config.json; run `invoke compile` first",
                           fix="rebuild the engine (invoke compile --force)")
    try:
        build = cfg["build_config"]
        mapping = cfg["pretrained_config"].get("mapping", {})
    except (KeyError, AttributeError, TypeError) as exc:
        raise PackageError(f"{engine_dir}/config.json is not a TensorRT-LLM engine config ({exc})") from None
    world = int(mapping.get("world_size", int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))))
    missing = [f"rank{r}.engine" for r in range(world) if not (engine_dir / f"rank{r}.engine").is_file()]
    if missing:
        raise PackageError(f"engine dir {engine_dir} lacks {', '.join(missing)}; the build did not finish")
    plugin = build.get("plugin_config", {})
    paged = str(build.get("kv_cache_type", "PAGED")).upper() in ("PAGED", "1", "KVCACHETYPE.PAGED")
    return LLMSource(
        path=engine_dir,
        max_batch_size=int(build["max_batch_size"]),
        max_beam_width=int(build.get("max_beam_width", 1)),
        world_size=world,
        kv_reuse_ok=paged and bool(plugin.get("use_paged_context_fmha", False)),
        key=Upstream.of_dir(engine_dir).key,
        max_draft_len=int(build.get("max_draft_len", 0) or 0),
    )


def read_checkpoint_source(ckpt_dir: Path, spec) -> LLMSource:
    """A checkpoint served by the reference backend: TRT-LLM checkpoint (config.json + rank*.safetensors) or HF."""
    ckpt_dir = Path(ckpt_dir)
    cfg = read_config_json(ckpt_dir / "config.json", PackageError,
                           missing=f"checkpoint dir {ckpt_dir} has no config.json; run `invoke calibrate` first",
                           fix="re-export the checkpoint (invoke calibrate --force)")
    if "architectures" not in cfg and not list(ckpt_dir.glob("rank*.safetensors")):
        raise PackageError(f"{ckpt_dir} has no rank*.safetensors; not an exported TensorRT-LLM checkpoint")
    return LLMSource(
        path=ckpt_dir,
        max_batch_size=spec.max_batch_size,
        max_beam_width=1,
        world_size=1,
        kv_reuse_ok=True,
        key=Upstream.of_dir(ckpt_dir).key,
    )


def _tokenizer_files(src: Path) -> list[Path]:
    files = sorted({p for pat in _TOKENIZER_PATTERNS for p in src.glob(pat) if p.is_file()})
    if not files:
        raise PackageError(f"{src} holds no tokenizer files; pass --tokenizer-dir")
    return files


def _tokenizer_files_hash(src: Path) -> str:
    """sha256 over the tokenizer files the repository copies (a package key factor; identity is `tokenizer`)."""
    h = hashlib.sha256()
    for p in _tokenizer_files(src):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------- values
# Parameters of the 1.2.1 `tensorrtllm` backend that this pipeline leaves at the backend's default: an empty value
# is read as "not set" (model_state.cc / model_instance_state.cc catch the failed conversion and keep the default).
_BACKEND_DEFAULTS = (
    "encoder_model_path", "max_attention_window_size", "sink_token_length", "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks", "enable_trt_overlap", "cancellation_check_period_ms",
    "stats_check_period_ms", "iter_stats_max_iterations", "request_stats_max_iterations", "gpu_device_ids",
    "participant_ids", "num_nodes", "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode",
    "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size", "medusa_choices",
    "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode",
    "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
)
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"


def _llm_values(name: str, models: EnsembleModels, src: LLMSource, rel_path: str, *, decoupled: bool,
                fraction: float, spec) -> dict[str, Any]:
    """Template values of one `tensorrt_llm` model: every parameter the 1.2.1 backend reads (empty = default).
    KV-cache reuse and chunked context are on when the spec asks and the source's KV cache allows them."""
    return {
        "model_name": name,
        "triton_backend": models.triton_backend,
        "triton_max_batch_size": src.max_batch_size,
        "decoupled_mode": decoupled,
        **_QUEUE,
        **dict.fromkeys(_BACKEND_DEFAULTS, ""),
        "max_beam_width": src.max_beam_width,
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": rel_path,
        "batch_scheduler_policy": spec.serving.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": fraction,
        "max_tokens_in_paged_kv_cache": spec.serving.max_tokens_in_paged_kv_cache,
        "enable_kv_cache_reuse": spec.serving.enable_kv_cache_reuse and src.kv_reuse_ok,
        "enable_chunked_context": spec.serving.enable_chunked_context and src.kv_reuse_ok,
        "exclude_input_in_output": False,  # the backend's default; upstream's draft-target clients rely on it
        "normalize_log_probs": True,
        "executor_worker_path": EXECUTOR_WORKER,
    }


def reference_parameters(spec, *, draft: bool) -> dict[str, str]:
    """Parameters only the reference backend reads (the C++ backend takes them from the engine's config.json)."""
    k = spec.draft_len if draft else 0
    return {
        "reference_dtype": "float64" if spec.model.source == "generated" else "float32",
        "tokens_per_block": str(spec.limits.tokens_per_block),
        "max_input_len": str(spec.max_input_len),
        "max_seq_len": str(spec.max_seq_len + k),
    }


def plan_values(spec, *, models: EnsembleModels, repo: Path, llm: LLMSource,
                draft: LLMSource | None) -> tuple[dict, list]:
    """model name -> template values for every model of the repository, plus warnings."""
    warnings: list[str] = []
    speculative = draft is not None
    fraction = spec.serving.target_fraction(speculative)
    draft_fraction = spec.serving.draft_kv_cache_free_gpu_mem_fraction
    if speculative and fraction + draft_fraction > MAX_MEMORY_FRACTION_SUM + 1e-9:
        raise PackageError(f"KV memory fractions target {fraction} + draft {draft_fraction} > "
                           f"{MAX_MEMORY_FRACTION_SUM}; lower --mem-fraction")
    if spec.serving.enable_kv_cache_reuse and not llm.kv_reuse_ok:
        warnings.append("engine built without paged context FMHA: KV-cache reuse and chunked context stay off")
    if speculative:
        models.check_draft_len(spec, llm)
    batch = llm.max_batch_size

    def rel(p: Path, model: str) -> str:
        return os.path.relpath(Path(p).resolve(), (repo / model).resolve())

    values: dict[str, dict[str, Any]] = {
        "preprocessing": {"triton_max_batch_size": batch, **_QUEUE, "preprocessing_instance_count": 1,
                          "tokenizer_dir": "tokenizer", "add_special_tokens": True, "multimodal_model_path": "",
                          "gpt_model_path": "", "max_num_images": "", "hf_model_path": "",
                          "max_input_len": spec.max_input_len},
        "postprocessing": {"triton_max_batch_size": batch, "postprocessing_instance_count": 1,
                           "tokenizer_dir": "tokenizer", "skip_special_tokens": True},
        "tensorrt_llm": _llm_values("tensorrt_llm", models, llm, rel(llm.path, "tensorrt_llm"),
                                    decoupled=spec.serving.target_decoupled(speculative), fraction=fraction,
                                    spec=spec),
        "ensemble": {"triton_max_batch_size": batch},
    }
    if draft is not None:
        values["tensorrt_llm_draft"] = _llm_values(
            "tensorrt_llm_draft", models, draft, rel(draft.path, "tensorrt_llm_draft"), decoupled=False,
            fraction=draft_fraction, spec=spec)
        values["tensorrt_llm_draft"]["max_tokens_in_paged_kv_cache"] = spec.draft_max_tokens_in_paged_kv_cache
        models.place_draft_target(spec, values)
        values["tensorrt_llm_bls"] = {
            "triton_max_batch_size": batch, "decoupled_mode": False, "bls_instance_count": 1,
            "accumulate_tokens": False, "tensorrt_llm_model_name": "tensorrt_llm",
            "tensorrt_llm_draft_model_name": "tensorrt_llm_draft", "multimodal_encoders_name": "",
            "default_num_draft_tokens": spec.draft_len,
            "max_batch_for_speculation": spec.speculation.max_batch_for_speculation,
        }
    return values, warnings


# ---------------------------------------------------------------------------------------------------- writing
def write_repo(dest: Path, values: dict[str, dict[str, Any]], *, models: EnsembleModels, tokenizer: Path,
               extra_parameters: dict[str, dict[str, str]] | None = None) -> None:
    """Render every model of `values` into `dest` (which must exist and be empty); `extra_parameters` (model ->
    key -> value) are added to the rendered configs."""
    root = templates_root()
    extra_parameters = extra_parameters or {}
    for model, vals in values.items():
        template = "tensorrt_llm" if model == "tensorrt_llm_draft" else model
        src = root / template
        out = dest / model
        (out / "1").mkdir(parents=True)
        name = f"{template}/config.pbtxt"
        text = render((src / "config.pbtxt").read_text(), vals, name=name)
        if model in extra_parameters:
            text = pbtxt.with_parameters(text, extra_parameters[model], name=name)
        (out / "config.pbtxt").write_text(text)
        if model != "ensemble" and models.python_model(template):
            shutil.copy2(src / "1" / "model.py", out / "1" / "model.py")
            shutil.copy2(root / SHARED_MODULE, out / "1" / SHARED_MODULE)
        if model in ("preprocessing", "postprocessing"):
            (out / "tokenizer").mkdir()
            for f in _tokenizer_files(tokenizer):
                shutil.copy2(f, out / "tokenizer" / f.name)


def _engine_sources(spec, inputs: PackageInputs) -> tuple[LLMSource, LLMSource | None, Path, str]:
    """--target trtllm: the target (and draft) engine sources, the tokenizer and the build id the engines imply."""
    engine_dir = inputs.engine
    if engine_dir is None:
        raise PackageError("--target trtllm needs the engine dir (engines/<build-id>/engine); run `invoke compile`")
    llm = read_engine_source(Path(engine_dir))
    draft = None
    if spec.draft_model is not None:
        draft = read_engine_source(Path(inputs.draft_engine or Path(engine_dir).parent / "draft_engine"))
    tok = find_tokenizer(inputs.tokenizer, Path(engine_dir).parent / "checkpoint", engine_dir, error=PackageError)
    return llm, draft, tok, Path(engine_dir).resolve().parent.name


def _checkpoint_sources(spec, inputs: PackageInputs) -> tuple[LLMSource, LLMSource | None, Path, str]:
    """--target reference: the target (and draft) checkpoint sources, the tokenizer and the implied build id."""
    checkpoint_dir = inputs.checkpoint
    if checkpoint_dir is None:
        raise PackageError("--target reference needs the checkpoint dir; run `invoke calibrate`")
    llm = read_checkpoint_source(Path(checkpoint_dir), spec)
    draft = None
    if spec.draft_model is not None:
        if inputs.draft_checkpoint is None:
            raise PackageError("speculation needs the draft checkpoint dir (--draft-checkpoint-dir)")
        draft = read_checkpoint_source(Path(inputs.draft_checkpoint), spec)
    tok = find_tokenizer(inputs.tokenizer, checkpoint_dir, error=PackageError)
    resolved = Path(checkpoint_dir).resolve()
    return llm, draft, tok, resolved.parent.name if resolved.name == "checkpoint" else resolved.name


class EnsembleModels(Protocol):
    """What serves the `tensorrt_llm` model(s) of an ensemble repository: the C++ backend over engines, or the
    Python reference backend over the checkpoint (`ENSEMBLE_MODELS`, by the row's `repo_kind`)."""

    triton_backend: str  # the models' `backend:` in config.pbtxt

    def sources(self, spec, inputs: PackageInputs) -> tuple[LLMSource, LLMSource | None, Path, str]:
        """(target source, draft source or None, the tokenizer dir, the build id the sources imply)."""
        ...

    def python_model(self, template: str) -> bool:
        """Whether the model rendered from `template` (not the ensemble) runs a model.py of ours."""
        ...

    def check_draft_len(self, spec, llm: LLMSource) -> None:
        """Refuse a target that cannot take the spec's draft tokens."""
        ...

    def place_draft_target(self, spec, values: dict[str, dict[str, Any]]) -> None:
        """Add what the two models of a draft-target repository need to share a server."""
        ...

    def draft_tokenizer(self, draft: LLMSource, draft_tokenizer_dir: Path | None) -> TokenizerIdentity:
        """The draft's tokenizer identity: its own tokenizer dir when given, else what the draft source holds."""
        ...

    def extra_parameters(self, spec, *, with_draft: bool) -> dict[str, Any]:
        """Parameters appended to the `tensorrt_llm` model(s)."""
        ...


class EngineModels:
    """target trtllm: Triton's C++ `tensorrtllm` backend over the trtllm-build engines."""

    triton_backend = "tensorrtllm"

    def sources(self, spec, inputs: PackageInputs) -> tuple[LLMSource, LLMSource | None, Path, str]:
        return _engine_sources(spec, inputs)

    def python_model(self, template: str) -> bool:
        return template != "tensorrt_llm"

    def check_draft_len(self, spec, llm: LLMSource) -> None:
        if llm.max_draft_len < spec.draft_len:
            raise PackageError(f"target engine max_draft_len={llm.max_draft_len} < draft_len {spec.draft_len}; "
                               "rebuild the target with --speculative_decoding_mode draft_tokens_external")

    def place_draft_target(self, spec, values: dict[str, dict[str, Any]]) -> None:
        # Orchestrator mode (two tensorrtllm models in one server): each model's GPUs, comma-separated within one
        # instance (model_state.cc LoadParameters). Participant ids stay empty: the orchestrator spawns.
        values["tensorrt_llm"]["gpu_device_ids"] = ",".join(map(str, spec.target_gpu_device_ids))
        values["tensorrt_llm_draft"]["gpu_device_ids"] = ",".join(map(str, spec.draft_gpu_device_ids))

    def draft_tokenizer(self, draft: LLMSource, draft_tokenizer_dir: Path | None) -> TokenizerIdentity:
        if draft_tokenizer_dir is not None:
            return identity(find_tokenizer(draft_tokenizer_dir, error=PackageError))
        recorded = EngineManifest.read(draft.path)
        if recorded is None or recorded.tokenizer is None:
            raise PackageError(f"draft engine {draft.path} records no tokenizer (no pipeline manifest); pass "
                               "--draft-tokenizer-dir with the draft checkpoint's tokenizer", path=draft.path)
        return recorded.tokenizer

    def extra_parameters(self, spec, *, with_draft: bool) -> dict[str, Any]:
        return {}


class ReferenceModels:
    """target reference: the Python reference backend over the checkpoint, on CPU."""

    triton_backend = "python"

    def sources(self, spec, inputs: PackageInputs) -> tuple[LLMSource, LLMSource | None, Path, str]:
        return _checkpoint_sources(spec, inputs)

    def python_model(self, template: str) -> bool:
        return True

    def check_draft_len(self, spec, llm: LLMSource) -> None:
        return None  # the reference proposes and verifies any number of draft tokens

    def place_draft_target(self, spec, values: dict[str, dict[str, Any]]) -> None:
        return None  # one CPU process holds both models

    def draft_tokenizer(self, draft: LLMSource, draft_tokenizer_dir: Path | None) -> TokenizerIdentity:
        return identity(find_tokenizer(draft_tokenizer_dir or draft.path, error=PackageError))

    def extra_parameters(self, spec, *, with_draft: bool) -> dict[str, Any]:
        """Parameters only the reference backend reads (the C++ backend takes them from the engine's config.json)."""
        extra = {"tensorrt_llm": reference_parameters(spec, draft=False)}
        if with_draft:
            extra["tensorrt_llm_draft"] = reference_parameters(spec, draft=True)
        return extra


ENSEMBLE_MODELS: dict[str, EnsembleModels] = {"engine": EngineModels(), "reference": ReferenceModels()}


def current_repo(final: Path, key: str, *, force: bool, verify: bool, check_only: bool) -> PackageResult | None:
    """The repository at `final` when its manifest is current for `key` (None: build it).

    Raises:
        PackageError: `check_only` and there is no current repository.
        IntegrityError: the repository differs from its manifest.
    """
    m = None if force else RepoManifest.current(final, key, verify=verify, strict=check_only)
    if m is not None:
        return PackageResult(final, m, "cached")
    if check_only:
        raise PackageError(f"no current Triton repository at {final} for this spec; run `invoke package` or "
                           "`invoke build` first", path=final)
    return None


@dataclass(frozen=True)
class RepoPlan:
    """What an ensemble repository is rendered from: its sources, the template values and the key over them."""

    key: str
    target: str
    build_id: str
    spec_key: str | None
    llm: LLMSource
    draft: LLMSource | None
    tokenizer: Path
    values: dict[str, dict[str, Any]]
    warnings: list[str]


def package_repo(spec, inputs: PackageInputs, *, target: str | None = None, force: bool = False,
                 check_only: bool = False, verify: bool = False) -> PackageResult:
    """Render, validate and publish the repository of `spec` for `target` ("trtllm" | "reference").

    trtllm needs `inputs.engine` (+ `draft_engine` with speculation); reference needs `inputs.checkpoint`
    (+ `draft_checkpoint`). The result lands at `<output>/<name>` (output defaults to `triton_repo_dir()`,
    name to `repo_name(build_id, backend, spec_key)`); the same inputs again are a no-op (status "cached") after
    the files were checked against the manifest (sizes and mtimes; every sha256 with `verify`).
    `inputs.draft_tokenizer` is the draft's tokenizer for a draft engine without a pipeline manifest;
    `inputs.spec_key` is the spec's key, recorded in the manifest (and part of the default name).

    Args:
        check_only: return the current repository or raise `PackageError`; never write.

    Raises:
        PackageError: missing/invalid inputs, the draft's tokenizer differs from the target's or is unknown, or
            the rendered repository fails validation (nothing is published).
        IntegrityError: the current repository differs from its manifest (exit 3).
    """
    backend = _ensemble_backend(target or spec.target)
    models = ENSEMBLE_MODELS[backend.repo_kind]
    llm, draft, tok, derived_id = models.sources(spec, inputs)
    build_id = inputs.build_id or derived_id
    final = repo_path(inputs.output, inputs.name, build_id, backend, inputs.spec_key)
    values, warnings = plan_values(spec, models=models, repo=final, llm=llm, draft=draft)
    if draft is not None:
        why = mismatch(identity(tok), models.draft_tokenizer(draft, inputs.draft_tokenizer))
        if why:
            raise PackageError(f"the draft {draft.path} has a different tokenizer than the target's {tok} ({why})")
    extra = models.extra_parameters(spec, with_draft=draft is not None)
    key = stage_key({
        "stage": "package",
        "target": backend.target,
        "templates": templates_hash(),
        "values": values,
        "sources": {"llm": llm.key, "draft": draft.key if draft else None},
        "tokenizer": _tokenizer_files_hash(tok),
        "extra_parameters": extra,
    })

    cached = current_repo(final, key, force=force, verify=verify, check_only=check_only)
    if cached is not None:
        return cached
    plan = RepoPlan(key, backend.target, build_id, inputs.spec_key, llm, draft, tok, values, warnings)
    with atomic_dir(final) as tmp:
        write_repo(tmp, values, models=models, tokenizer=tok, extra_parameters=extra)
        summary = validate_repo(tmp)
        manifest = _repo_manifest(spec, plan, models=sorted(summary.models), files=file_table(tmp))
        manifest.write(tmp)
    return PackageResult(final, manifest, "built")


def _ensemble_backend(target: str) -> RuntimeTarget:
    """The backend whose repository has the ensemble layout for `target` (the engine runtime's)."""
    try:
        return runtime_named("engine", target)
    except PipelineError:
        raise PackageError(f"target {target!r} is not one of trtllm, reference") from None


def repo_path(output: Path | None, name: str | None, build_id: str, backend: RuntimeTarget,
              spec_key: str | None) -> Path:
    """`<output>/<name>`: output defaults to `triton_repo_dir()`, name to `repo_name(build_id, backend, spec_key)`."""
    out_root = Path(output) if output else triton_repo_dir()
    name = check_name(name, what="repository name", fix="pass a plain directory name") if name else \
        repo_name(check_name(build_id, what="build id", fix="pass a plain name"), backend, spec_key)
    return out_root / name


def _repo_manifest(spec, plan: RepoPlan, *, models: list[str], files: dict) -> RepoManifest:
    """The manifest of the repository rendered from `plan`, holding `models` and `files`."""
    llm, draft, values = plan.llm, plan.draft, plan.values
    return RepoManifest(
        key=plan.key,
        target=plan.target,
        build_id=plan.build_id,
        spec=spec.summary(),
        spec_key=plan.spec_key,
        models=models,
        speculation={"draft": spec.draft_model.name, "num_draft_tokens": spec.draft_len} if draft else None,
        sources={
            "llm": str(llm.path.resolve()),
            "draft": str(draft.path.resolve()) if draft else None,
            "tokenizer": str(plan.tokenizer.resolve()),
        },
        gpt_model_path={m: v["gpt_model_path"] for m, v in values.items() if "gpt_model_path" in v},
        world_size=llm.world_size,
        kv_cache_reuse=values["tensorrt_llm"]["enable_kv_cache_reuse"],
        warnings=plan.warnings,
        files=files,
    )
