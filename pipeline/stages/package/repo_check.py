"""Validate a Triton model repository before it is published (and before a server is started on it).

Checks: every `config.pbtxt` parses as `tritonclient.grpc.model_config_pb2.ModelConfig` (unknown fields, bad enums
and leftover `${...}` are errors); `name` equals the directory; a numeric version directory exists; python models
have `<version>/model.py`; every ensemble step names a model of the repository, maps only tensors that model
declares, and each ensemble-internal tensor is produced before it is consumed and every ensemble output is
produced; python models that tokenize have their tokenizer; with speculation the draft model (which the BLS calls
non-streaming) is not decoupled, the BLS names existing models, and the draft + target KV memory fractions sum to
<= 0.95; an LLM-API repository's model.yaml parses and agrees with its config.pbtxt (decoupled, max_batch_size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import PackageError
from pipeline.stages.package import llmapi_yaml, pbtxt
from pipeline.stages.package.render import check_no_placeholders

MAX_MEMORY_FRACTION_SUM = 0.95
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class RepoSummary:
    """What validation found: model name -> parsed ModelConfig, plus derived facts."""

    models: dict[str, Any] = field(default_factory=dict)

    def param(self, model: str, key: str, default: str = "") -> str:
        return pbtxt.parameter(self.models[model], key, default)

    def decoupled(self, model: str) -> bool:
        return self.models[model].model_transaction_policy.decoupled


def parse_config(path: Path):
    """Parse one config.pbtxt strictly; PackageError with the file and the parser's message on failure."""
    text = Path(path).read_text()
    check_no_placeholders(text, name=str(path))
    return pbtxt.parse(text, name=str(path))


def _io(cfg) -> tuple[set[str], set[str]]:
    return {t.name for t in cfg.input}, {t.name for t in cfg.output}


def _check_ensemble(name: str, cfg, models: dict[str, Any]) -> None:
    ins, outs = _io(cfg)
    available = set(ins)
    produced: set[str] = set()
    for i, step in enumerate(cfg.ensemble_scheduling.step):
        where = f"ensemble {name!r} step {i} ({step.model_name})"
        if step.model_name not in models:
            raise PackageError(f"{where}: model {step.model_name!r} is not in the repository; fix model_name")
        m_in, m_out = _io(models[step.model_name])
        required = {t.name for t in models[step.model_name].input if not t.optional}
        for key, tensor in step.input_map.items():
            if key not in m_in:
                raise PackageError(f"{where}: input_map key {key!r} is not an input of {step.model_name}; "
                                   f"valid: {', '.join(sorted(m_in))}")
            if tensor not in available:
                raise PackageError(f"{where}: input_map value {tensor!r} is neither an ensemble input nor produced "
                                   "by an earlier step; map a real tensor")
        unmapped = required - set(step.input_map)
        if unmapped:
            raise PackageError(f"{where}: required input(s) {', '.join(sorted(unmapped))} of {step.model_name} "
                               "are not mapped")
        for key, tensor in step.output_map.items():
            if key not in m_out:
                raise PackageError(f"{where}: output_map key {key!r} is not an output of {step.model_name}; "
                                   f"valid: {', '.join(sorted(m_out))}")
            available.add(tensor)
            produced.add(tensor)
    missing = outs - produced
    if missing:
        raise PackageError(f"ensemble {name!r}: output(s) {', '.join(sorted(missing))} are produced by no step; "
                           "map them in an output_map")


def validate_repo(repo: Path, *, require_tokenizer: bool = True) -> RepoSummary:
    """Validate the repository at `repo`; returns a summary. Raises PackageError with one clear line."""
    repo = Path(repo)
    if not repo.is_dir():
        raise PackageError(f"model repository {repo} does not exist; run `invoke package`")
    summary = RepoSummary()
    dirs = sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not dirs:
        raise PackageError(f"{repo} holds no models")
    for d in dirs:
        cfg_path = d / "config.pbtxt"
        if not cfg_path.is_file():
            raise PackageError(f"{d}: no config.pbtxt (every directory of a model repository is a model)")
        cfg = parse_config(cfg_path)
        if cfg.name != d.name:
            raise PackageError(f"{cfg_path}: name {cfg.name!r} differs from its directory {d.name!r}")
        versions = [v for v in d.iterdir() if v.is_dir() and v.name.isdigit()]
        if not versions:
            raise PackageError(f"{d}: no version directory (e.g. {d.name}/1/)")
        if cfg.backend == "python":
            for v in versions:
                if not (v / "model.py").is_file():
                    raise PackageError(f"{v}: python model without model.py")
        if not cfg.backend and cfg.platform != "ensemble":
            raise PackageError(f"{cfg_path}: neither backend nor platform set")
        summary.models[cfg.name] = cfg
    for name, cfg in summary.models.items():
        if cfg.platform == "ensemble":
            _check_ensemble(name, cfg, summary.models)
    if require_tokenizer:
        for name in ("preprocessing", "postprocessing"):
            if name in summary.models:
                tok = summary.param(name, "tokenizer_dir") or "tokenizer"
                tok_path = Path(tok) if Path(tok).is_absolute() else repo / name / tok
                if not any((tok_path / f).is_file() for f in TOKENIZER_FILES):
                    raise PackageError(f"{name}: tokenizer missing at {tok_path} (tokenizer_dir={tok!r}); "
                                       "re-run `invoke package` so the tokenizer is copied into the repository")
    _check_speculation(summary)
    _check_llmapi(repo, summary)
    return summary


def _check_llmapi(repo: Path, summary: RepoSummary) -> None:
    """An LLM-API model's model.yaml parses and agrees with its config.pbtxt on decoupled and max_batch_size."""
    if not llmapi_yaml.is_llmapi_repo(repo):
        return
    tc = llmapi_yaml.read(repo / llmapi_yaml.MODEL_YAML)["triton_config"]
    cfg = summary.models.get(llmapi_yaml.MODEL)
    if cfg is None or not {"decoupled", "max_batch_size"} <= set(tc):
        raise PackageError(f"{repo}: model.yaml needs triton_config.decoupled and .max_batch_size beside a "
                           f"{llmapi_yaml.MODEL} model; re-run `invoke package`")
    if bool(tc["decoupled"]) != cfg.model_transaction_policy.decoupled or tc["max_batch_size"] != cfg.max_batch_size:
        raise PackageError(f"{llmapi_yaml.MODEL}: model.yaml triton_config (decoupled {tc['decoupled']}, max_batch_size "
                           f"{tc['max_batch_size']}) differs from config.pbtxt (decoupled "
                           f"{cfg.model_transaction_policy.decoupled}, max_batch_size {cfg.max_batch_size}); "
                           "re-run `invoke package`")


def _check_speculation(summary: RepoSummary) -> None:
    if "tensorrt_llm_bls" not in summary.models:
        return
    target = summary.param("tensorrt_llm_bls", "tensorrt_llm_model_name", "tensorrt_llm")
    draft = summary.param("tensorrt_llm_bls", "tensorrt_llm_draft_model_name")
    for role, model in (("target", target), ("draft", draft)):
        if model and model not in summary.models:
            raise PackageError(f"tensorrt_llm_bls: {role} model {model!r} is not in the repository")
    if not draft:
        return
    if summary.decoupled(draft):
        raise PackageError(f"{draft}: the draft model must not be decoupled (the BLS asks it for K tokens in one "
                           "non-streaming call); set decoupled: false")
    if summary.decoupled("tensorrt_llm_bls"):
        raise PackageError("tensorrt_llm_bls: must not be decoupled with speculation (no streaming on that route)")
    fractions = []
    for model in (target, draft):
        value = summary.param(model, "kv_cache_free_gpu_mem_fraction")
        if value:
            fractions.append(float(value))
    if sum(fractions) > MAX_MEMORY_FRACTION_SUM + 1e-9:
        raise PackageError(f"kv_cache_free_gpu_mem_fraction of {target} + {draft} = {sum(fractions):.2f} > "
                           f"{MAX_MEMORY_FRACTION_SUM}; lower --mem-fraction or the draft's fraction")
