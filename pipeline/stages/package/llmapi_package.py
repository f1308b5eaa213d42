"""The package stage for the PyTorch runtime: a Triton repository with TensorRT-LLM's LLM-API (`llmapi`) model
serving the exported Hugging Face checkpoint.

Layout (`<output>/<name>/`, name as for the engine runtime: `pipeline.core.layout.repo_name`):

    tensorrt_llm/config.pbtxt            python backend, the 1.2 `llmapi` tensor contract; decoupled per the spec
    tensorrt_llm/1/model.yaml            LLM(...) arguments (LlmApiOptions) + `model` + `triton_config`
    tensorrt_llm/1/model.py, llmapi_io.py    trtllm: runs tensorrt_llm.LLM (GPU); reference: transformers on CPU
    tensorrt_llm/1/hf_reference.py       (reference only) the CPU engine
    manifest.json

`model`, `tokenizer` (only when the checkpoint holds no tokenizer) and the draft's `speculative_model_dir` are
written relative to `tensorrt_llm/1/` (see `pipeline.stages.package.llmapi_yaml`). The draft runs inside the target's
LLM (speculative_config), so there is no ensemble, BLS or draft model. An EAGLE-3 head is carried into the repository
(`tensorrt_llm/1/eagle3_head/`, `pipeline.stages.package.eagle3_head`) and listed in its file table.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.runtimes import RuntimeTarget, runtime_named
from pipeline.core.artifacts import atomic_dir, file_table, read_config_json, stage_key
from pipeline.core.errors import PackageError, PipelineError
from pipeline.core.manifests import RepoManifest
from pipeline.core.spec import EAGLE3, BuildSpec
from pipeline.core.tokenizer import find_tokenizer, identity, mismatch
from pipeline.core.upstream import Upstream
from pipeline.stages.calibrate.hf_checkpoint import HF_QUANT_CONFIG
from pipeline.stages.calibrate.hf_checkpoint import SUPPORTED_QUANT_ALGOS as REFERENCE_QUANT_ALGOS
from pipeline.stages.package import eagle3_head, llmapi_yaml, pbtxt
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import LlmApiOptions
from pipeline.stages.package.package import PackageResult, current_repo, repo_path
from pipeline.stages.package.render import render, templates_hash, templates_root
from pipeline.stages.package.repo_check import validate_repo



class LlmapiModel(Protocol):
    """What serves the `tensorrt_llm` model of an `llmapi` repository (`LLMAPI_MODELS`, by the row's `repo_kind`)."""

    model_py: str  # model.py's template
    files: tuple[str, ...]  # the files beside it

    def check_sources(self, sources: dict[str, dict[str, Any] | None]) -> None:
        """Refuse a checkpoint this model cannot load (`sources`: what -> checkpoint facts or None)."""
        ...

    def parameters(self, spec) -> dict[str, str]:
        """config.pbtxt parameters of the model."""
        ...


class TrtllmModel:
    """TensorRT-LLM's LLM on GPUs (the PyTorch backend)."""

    model_py: str = "model_trtllm.py"
    files: tuple[str, ...] = ("llmapi_io.py",)

    def check_sources(self, sources: dict[str, dict[str, Any] | None]) -> None:
        return None

    def parameters(self, spec) -> dict[str, str]:
        return {}


class ReferenceModel:
    """The CPU reference: transformers over the dequantized checkpoint."""

    model_py: str = "model_reference.py"
    files: tuple[str, ...] = ("llmapi_io.py", "hf_reference.py")

    def check_sources(self, sources: dict[str, dict[str, Any] | None]) -> None:
        for what, facts in sources.items():
            if facts and facts["quant_algo"] not in REFERENCE_QUANT_ALGOS:  # what the CPU reference dequantizes
                raise PackageError(f"{what} is {facts['quant_algo']}: the CPU reference dequantizes only FP8, "
                                   "W4A16_AWQ and W4A8_AWQ; package it with --target trtllm")

    def parameters(self, spec) -> dict[str, str]:
        """The reference's dtype and KV block size."""
        return {"reference_dtype": "float64" if spec.model.source == "generated" else "float32",
                "tokens_per_block": str(spec.limits.tokens_per_block)}


LLMAPI_MODELS: dict[str, LlmapiModel] = {"llmapi": TrtllmModel(), "reference": ReferenceModel()}


def read_hf_checkpoint(path: Path, *, what: str) -> dict[str, Any]:
    """Facts of an exported HF checkpoint dir: {"quant_algo", "kv_cache_quant_algo", "architectures"}."""
    path = Path(path)
    config = read_config_json(path / "config.json", PackageError,
                              missing=f"{what} {path} has no config.json; run `invoke calibrate --runtime pytorch`",
                              fix="re-export it (invoke calibrate --runtime pytorch --force)")
    if not isinstance(config, dict) or not config.get("architectures"):
        raise PackageError(f"{what} {path} is not a Hugging Face checkpoint (config.json has no architectures)")
    if not list(path.glob("*.safetensors")):
        raise PackageError(f"{what} {path} holds no *.safetensors; the export did not finish")
    quant: dict[str, Any] = {}
    qfile = path / HF_QUANT_CONFIG
    if qfile.exists():
        fix = "re-export it (invoke calibrate --runtime pytorch --force)"
        quant = read_config_json(qfile, PackageError, missing=f"{qfile} is gone; {fix}", fix=fix).get(
            "quantization") or {}
        if not isinstance(quant, dict):
            raise PackageError(f"{qfile} is not a ModelOpt hf_quant_config.json (no 'quantization' mapping); {fix}")
    return {"quant_algo": quant.get("quant_algo"), "kv_cache_quant_algo": quant.get("kv_cache_quant_algo"),
            "architectures": config["architectures"]}


def model_yaml(spec, options: LlmApiOptions, *, model: str, draft: str | None, tokenizer: str | None) -> dict:
    """The model.yaml mapping: `model`, `backend`, the options (draft dir replaced by `draft`), `triton_config`."""
    llm = options.as_dict()
    if (draft is None) != ("speculative_model_dir" not in llm.get("speculative_config", {})):
        raise PackageError("the LLM-API options and the draft checkpoint disagree: pass both or neither")
    if draft is not None:
        llm["speculative_config"]["speculative_model_dir"] = draft
    head = {"model": model, **({"tokenizer": tokenizer} if tokenizer else {}), "backend": "pytorch"}
    # The 1.2 llmapi model serves one prompt per request (Triton max_batch_size 0); the LLM batches in flight.
    # Streaming (decoupled) unless the spec says otherwise: the draft runs inside the LLM, so it streams too.
    decoupled = True if spec.serving.decoupled is None else spec.serving.decoupled
    return {**head, **llm, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}


def _speculation(spec: BuildSpec) -> dict[str, Any] | None:
    """The manifest's record of how the repository speculates (None: it does not)."""
    if spec.speculation_mode is None:
        return None
    draft = spec.draft_model.name if spec.draft_model is not None else None
    return {"mode": spec.speculation_mode, "draft": draft, "num_draft_tokens": spec.draft_len}


def write_llmapi_repo(dest: Path, *, model: LlmapiModel, data: dict, parameters: dict[str, str]) -> None:
    """Render the tensorrt_llm model into `dest` (existing, empty)."""
    root = templates_root("llmapi") / llmapi_yaml.MODEL
    out = dest / llmapi_yaml.MODEL
    (out / "1").mkdir(parents=True)
    text = render((root / "config.pbtxt").read_text(), {
        "triton_max_batch_size": data["triton_config"]["max_batch_size"],
        "decoupled_mode": data["triton_config"]["decoupled"]}, name="llmapi/tensorrt_llm/config.pbtxt")
    if parameters:
        text = pbtxt.with_parameters(text, parameters, name="llmapi/tensorrt_llm/config.pbtxt")
    (out / "config.pbtxt").write_text(text)
    shutil.copy2(root / "1" / model.model_py, out / "1" / "model.py")
    for name in model.files:
        shutil.copy2(root / "1" / name, out / "1" / name)
    llmapi_yaml.write(dest / llmapi_yaml.MODEL_YAML, data)


def _llmapi_backend(target: str) -> RuntimeTarget:
    """The backend whose repository has the `llmapi` layout for `target` (the PyTorch runtime's)."""
    try:
        return runtime_named("pytorch", target)
    except PipelineError:
        raise PackageError(f"target {target!r} is not one of trtllm, reference") from None


def check_model_yaml(path: Path) -> LlmApiOptions:
    """Read a written model.yaml back and validate its LLM arguments against `LlmApiOptions`."""
    data = llmapi_yaml.read(path)
    rest = {k: v for k, v in data.items() if k not in ("model", "tokenizer", "backend", "triton_config")}
    try:
        return LlmApiOptions.from_mapping(rest, what=str(path))
    except PipelineError as exc:
        raise PackageError(str(exc)) from None


def _sources(model: LlmapiModel, checkpoint_dir, draft_dir):
    ckpt = read_hf_checkpoint(checkpoint_dir, what="checkpoint")
    draft = read_hf_checkpoint(draft_dir, what="draft checkpoint") if draft_dir is not None else None
    model.check_sources({"checkpoint": ckpt, "draft checkpoint": draft})
    return ckpt, draft


def package_llmapi_repo(spec, inputs: PackageInputs, *, options: LlmApiOptions, target: str | None = None,
                        force: bool = False, check_only: bool = False, verify: bool = False) -> PackageResult:
    """Render, validate and publish the `llmapi` repository of `spec` for `target` ("trtllm" | "reference").

    `inputs.checkpoint`/`inputs.draft_checkpoint`: the exported HF checkpoints (the draft exactly when `options`
    speculate); `inputs.tokenizer`: the tokenizer when not the checkpoint's. Same output, naming, caching, `force`,
    `check_only` and `verify` semantics as `package_repo`.

    Raises:
        PackageError: missing/invalid checkpoints, a quantization the reference cannot serve, a draft with another
            tokenizer, options that disagree with the draft, or a repository that fails validation.
        IntegrityError: the current repository differs from its manifest (exit 3).
    """
    if inputs.checkpoint is None:
        raise PackageError("the llmapi repository serves the checkpoint: pass --checkpoint-dir")
    backend = _llmapi_backend(target or spec.target)
    model = LLMAPI_MODELS[backend.repo_kind]
    checkpoint_dir = Path(inputs.checkpoint).resolve()
    draft_dir = Path(inputs.draft_checkpoint).resolve() if inputs.draft_checkpoint is not None else None
    head = draft_dir if spec.speculation_mode == EAGLE3 else None
    head_files = eagle3_head.read_head(head, spec, verify=verify) if head is not None else None
    ckpt, draft = _sources(model, checkpoint_dir, None if head else draft_dir)
    tokenizer_dir = Path(inputs.tokenizer).resolve() if inputs.tokenizer is not None else None
    tok = find_tokenizer(tokenizer_dir, checkpoint_dir, error=PackageError)
    if draft is not None and draft_dir is not None:  # an EAGLE-3 head shares the target's tokenizer (read_head)
        why = mismatch(identity(tok), identity(find_tokenizer(draft_dir, error=PackageError)))
        if why:
            raise PackageError(f"the draft {draft_dir} has a different tokenizer than the target's {tok} ({why})")
    build_id = inputs.build_id or (checkpoint_dir.parent.name if checkpoint_dir.name.endswith("checkpoint")
                                   else checkpoint_dir.name)
    final = repo_path(inputs.output, inputs.name, build_id, backend, inputs.spec_key)
    base = (final / llmapi_yaml.MODEL_YAML).parent

    def rel(p: Path) -> str:
        return os.path.relpath(p, base.resolve())

    draft_path = eagle3_head.HEAD_DIR if head else rel(draft_dir) if draft_dir else None
    data = model_yaml(spec, options, model=rel(checkpoint_dir), draft=draft_path,
                      tokenizer=rel(tok) if tok != checkpoint_dir else None)
    parameters = model.parameters(spec)
    key = stage_key({"stage": "package", "layout": "llmapi", "target": backend.target,
                     "templates": templates_hash("llmapi"), "model_yaml": data,
                     "parameters": parameters, "sources": {"llm": Upstream.of_dir(checkpoint_dir).key,
                                                            "draft": Upstream.of_dir(draft_dir).key if draft_dir else None}})
    cached = current_repo(final, key, force=force, verify=verify, check_only=check_only)
    if cached is not None:
        return cached
    with atomic_dir(final) as tmp:
        write_llmapi_repo(tmp, model=model, data=data, parameters=parameters)
        carried = (llmapi_yaml.MODEL_YAML.parent / eagle3_head.HEAD_DIR).as_posix()
        if head is not None and head_files is not None:
            eagle3_head.carry_head(head, tmp / carried, head_files)
        check_model_yaml(tmp / llmapi_yaml.MODEL_YAML)
        summary = validate_repo(tmp)
        files = file_table(tmp)
        if head_files is not None:
            eagle3_head.check_carried(files, carried, head_files)
        manifest = RepoManifest(
            key=key, target=backend.target, runtime=backend.runtime, build_id=build_id, spec=spec.summary(),
            spec_key=inputs.spec_key,
            models=sorted(summary.models),
            speculation=_speculation(spec),
            sources={"llm": str(checkpoint_dir), "draft": str(draft_dir) if draft_dir else None,
                     "tokenizer": str(tok.resolve())},
            gpt_model_path={llmapi_yaml.MODEL: data["model"]},
            world_size=options.tensor_parallel_size * options.pipeline_parallel_size,
            kv_cache_reuse=options.kv_cache_config.enable_block_reuse,
            warnings=[], files=files,
        )
        manifest.write(tmp)
    return PackageResult(final, manifest, "built")
