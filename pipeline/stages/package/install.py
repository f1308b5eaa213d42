"""Install a Triton model repository for serving: every path parameter made absolute and checked.

`invoke package` writes `gpt_model_path` and `tokenizer_dir` relative to each model's directory, so a repository
and its `engines/` move together. The C++ `tensorrtllm` backend would resolve a relative path against the server's
working directory, and upstream's Python models read a relative `tokenizer_dir` as a Hugging Face Hub id; so before
a bare `tritonserver --model-repository DIR` the repository is *installed*: every path parameter of every model
(`PATH_KEYS`, where non-empty) becomes an absolute path that exists on this host. Configs are edited through
protobuf (`pipeline.stages.package.pbtxt`) and written atomically; the result is validated.

In place (`dest=None`) or into a copy at `dest`. In a copy, paths that point inside the source repository (its
tokenizers) point inside the copy, so the copy stands alone.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import PackageError
from pipeline.stages.package import llmapi_yaml, pbtxt
from pipeline.stages.package.package import read_engine_source
from pipeline.stages.package.repo_check import validate_repo

PATH_KEYS = (
    "gpt_model_path",
    "tokenizer_dir",
    "encoder_model_path",
    "multimodal_model_path",
    "hf_model_path",
    "xgrammar_tokenizer_info_path",
    "lora_prefetch_dir",
)
# Models that cannot run without the path (when the repository has the model).
REQUIRED = {
    "tensorrt_llm": ("gpt_model_path",),
    "tensorrt_llm_draft": ("gpt_model_path",),
    "preprocessing": ("tokenizer_dir",),
    "postprocessing": ("tokenizer_dir",),
}
ENGINE_MODELS = {"engine_dir": "tensorrt_llm", "draft_engine_dir": "tensorrt_llm_draft"}


@dataclass
class InstallResult:
    """The installed repository (`.path`) and the absolute value now held by each path parameter."""

    path: Path
    paths: dict[str, dict[str, str]] = field(default_factory=dict)  # model -> key -> absolute path


def _configs(repo: Path) -> dict[str, object]:
    files = sorted(repo.glob("*/config.pbtxt"))
    if not files:
        raise PackageError(f"{repo} holds no */config.pbtxt; pass a Triton model repository (`invoke package`)")
    return {f.parent.name: pbtxt.read(f) for f in files}


def _check_engine(model: str, cfg, path: Path) -> None:
    if not path.is_dir():
        raise PackageError(f"{model}: engine dir {path} does not exist; pass an existing --engine-dir")
    if cfg.backend == "tensorrtllm":
        read_engine_source(path)


def _overrides(cfgs: dict, engine_dir, draft_engine_dir) -> dict[str, Path]:
    """model -> absolute engine dir given on the command line (checked)."""
    out = {}
    for flag, value in (("engine_dir", engine_dir), ("draft_engine_dir", draft_engine_dir)):
        if value is None:
            continue
        model = ENGINE_MODELS[flag]
        if model not in cfgs:
            raise PackageError(f"--{flag.replace('_', '-')} given but the repository has no {model} model; drop it")
        path = Path(value).expanduser().resolve()
        _check_engine(model, cfgs[model], path)
        out[model] = path
    return out


def resolve_paths(repo: Path, cfgs: dict, overrides: dict[str, Path]) -> dict[str, dict[str, Path]]:
    """model -> key -> absolute, existing path for every non-empty path parameter (PackageError otherwise).
    An LLM-API repository's tensorrt_llm model names its checkpoint in model.yaml instead (`llmapi_yaml`)."""
    result: dict[str, dict[str, Path]] = {}
    required = {} if llmapi_yaml.is_llmapi_repo(repo) else REQUIRED
    for model, cfg in cfgs.items():
        found = {}
        for key in PATH_KEYS:
            value = pbtxt.parameter(cfg, key).strip()
            if key == "gpt_model_path" and model in overrides:
                value = str(overrides[model])
            if not value:
                if key in required.get(model, ()):
                    raise PackageError(f"{model}: parameter {key} is empty; re-run `invoke package` (or pass "
                                       f"--engine-dir)")
                continue
            path = Path(value).expanduser()
            path = (path if path.is_absolute() else repo / model / path).resolve()
            if not path.exists():
                raise PackageError(f"{model}: {key} {value!r} -> {path} does not exist on this host; fix the path "
                                   "(`invoke install-repo --engine-dir ...`) or re-run `invoke package`")
            found[key] = path
        result[model] = found
    return result


def _relocate(path: Path, repo: Path, dest: Path) -> Path:
    """`path` inside `repo` -> the same place inside `dest`; anything else unchanged."""
    try:
        return dest / path.relative_to(repo)
    except ValueError:
        return path


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _copy_repo(repo: Path, dest: Path, *, link: bool) -> None:
    """Copy `repo` to `dest` (which must not exist), staged next to it and renamed into place."""
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(repo, tmp, copy_function=_link_or_copy if link else shutil.copy2,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_dest(repo: Path, dest: Path) -> None:
    if dest == repo or repo in dest.parents:
        raise PackageError(f"--dest {dest} is (inside) the repository itself; omit --dest to install in place")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PackageError(f"--dest {dest} already exists; remove it or choose another directory")


def install_repo(repo: Path, dest: Path | None = None, *, engine_dir: Path | None = None,
                 draft_engine_dir: Path | None = None, link: bool = False, validate: bool = True) -> InstallResult:
    """Make every path parameter of `repo` absolute (in place, or in a copy at `dest`) and validate the result.

    `engine_dir`/`draft_engine_dir` point `tensorrt_llm`/`tensorrt_llm_draft` at engines stored elsewhere.
    `link` hard-links the copy's unchanged files instead of copying them (short-lived launch copies);
    `validate=False` skips `validate_repo` (hand-written repositories in tests).

    Raises:
        PackageError: not a repository, a path parameter names nothing on this host, or validation fails.
    """

    repo = Path(repo).expanduser().resolve()
    if not repo.is_dir():
        raise PackageError(f"model repository {repo} does not exist; run `invoke package` first")
    cfgs = _configs(repo)
    if llmapi_yaml.is_llmapi_repo(repo) and (engine_dir or draft_engine_dir):
        raise PackageError(f"{repo} serves a Hugging Face checkpoint (PyTorch runtime), not engines; drop "
                           "--engine-dir/--draft-engine-dir")
    paths = resolve_paths(repo, cfgs, _overrides(cfgs, engine_dir, draft_engine_dir))
    target = repo
    if dest is not None:
        target = Path(dest).expanduser().resolve()
        _check_dest(repo, target)
        paths = {m: {k: _relocate(p, repo, target) for k, p in kv.items()} for m, kv in paths.items()}
        if target.is_dir():
            target.rmdir()
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_repo(repo, target, link=link)
    try:
        for model, kv in paths.items():
            cfg = cfgs[model]
            changed = {k: str(p) for k, p in kv.items() if pbtxt.parameter(cfg, k) != str(p)}
            if changed:  # written to a new file and renamed: a hard-linked copy never writes through
                pbtxt.set_parameters(cfg, changed)
                pbtxt.write(target / model / "config.pbtxt", cfg)
        yaml_paths = llmapi_yaml.install_paths(repo, target) if llmapi_yaml.is_llmapi_repo(repo) else {}
        if validate:
            validate_repo(target)
    except BaseException:
        if dest is not None:
            shutil.rmtree(target, ignore_errors=True)
        raise
    result = {m: {k: str(p) for k, p in kv.items()} for m, kv in paths.items() if kv}
    if yaml_paths:
        result.setdefault(llmapi_yaml.MODEL, {}).update(yaml_paths)
    return InstallResult(target, result)


def install_command(repo, *, dest=None, engine_dir=None, draft_engine_dir=None) -> InstallResult:
    """Body of `invoke install-repo`: install and print one line per rewritten path, then `ok: ...`."""
    res = install_repo(Path(repo), Path(dest) if dest else None,
                       engine_dir=Path(engine_dir) if engine_dir else None,
                       draft_engine_dir=Path(draft_engine_dir) if draft_engine_dir else None)
    for model, kv in sorted(res.paths.items()):
        for key, value in sorted(kv.items()):
            print(f"  {model}.{key} = {value}")
    print(f"ok: {res.path} installed; serve it with `tritonserver --model-repository {res.path}`")
    return res
