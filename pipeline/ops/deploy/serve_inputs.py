"""On a serving node: what `trtllm-serve` takes, from the release's installed repository.

After `invoke install-repo` the repository holds absolute paths on this node. Runtime pytorch (the `llmapi`
repository): from its model.yaml this writes `OUT/llm_api_options.yaml` (validated against `LlmApiOptions`) and the
link `OUT/NAME` to the Hugging Face checkpoint (trtllm-serve names the served model after the directory it loads);
a speculative build's draft checkpoint or EAGLE-3 head is also linked as `OUT/NAME.draft` (a path known before the
node exists: Dynamo's worker options name it, pipeline.ops.deploy.dynamo).
An engine release served by trtllm-serve (`--engine`): from the `tensorrt_llm` and `preprocessing` configs it links
`OUT/NAME` to the engine directory and `OUT/tokenizer` to the tokenizer, and writes the engine's runtime options
(`EngineServeOptions`: the KV-cache share, reuse and chunked context the packaged repository settled on). Both add
`return_perf_metrics: true` (BaseLlmArgs), without which trtllm-serve 1.2 mounts no `/prometheus/metrics` for the
deployment's monitoring rules, and runtime pytorch `enable_iter_perf_stats: true` (TorchLlmArgs; the KV-cache gauges).
fetch-verify.sh runs

    python3 -m pipeline.ops.deploy.serve_inputs [--engine] REPO OUT NAME
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from pipeline.core.artifacts import check_name
from pipeline.core.errors import DeployError, PipelineError, io_error
from pipeline.stages.package import llmapi_yaml, pbtxt
from pipeline.stages.package.llmapi_options import DraftTargetConfig, EagleConfig, EngineServeOptions, KvCacheConfig
from pipeline.stages.package.llmapi_package import check_model_yaml

OPTIONS_FILE = "llm_api_options.yaml"
PERF_METRICS = {"return_perf_metrics": True}  # trtllm-serve's Prometheus metrics (monitoring.rules)
PYTORCH_METRICS = {**PERF_METRICS, "enable_iter_perf_stats": True}  # and its KV-cache gauges (TorchLlmArgs only)
TOKENIZER_LINK = "tokenizer"  # OUT/tokenizer: an engine's tokenizer
DRAFT_SUFFIX = ".draft"  # OUT/NAME.draft: a speculative build's draft checkpoint or EAGLE-3 head


def _absolute_dir(value: object, key: str, path: Path) -> Path:
    p = Path(str(value))
    if not p.is_absolute() or not p.is_dir():
        raise DeployError(f"{path}: {key} {value!r} is not an existing absolute directory on this node; run "
                          "`invoke install-repo --repo <repo>` on the unpacked release first")
    return p


def write_serve_inputs(repo: Path, out: Path, name: str) -> tuple[Path, Path]:
    """(checkpoint link, options file) for `trtllm-serve`, written under `out` from the installed `repo`."""
    name = check_name(name, what="served model name", fix="use the deployment name, e.g. llama-405b-bf16")
    path = Path(repo) / llmapi_yaml.MODEL_YAML
    if not path.is_file():
        raise DeployError(f"{repo}: no {llmapi_yaml.MODEL_YAML}; a runtime-pytorch release holds the llmapi "
                          "repository (re-release the build with --runtime pytorch)")
    data = llmapi_yaml.read(path)
    options = check_model_yaml(path)
    model = _absolute_dir(data["model"], "model", path)
    tokenizer = data.get("tokenizer")
    if tokenizer and Path(str(tokenizer)) != model:
        raise DeployError(f"{path}: tokenizer {tokenizer!r} is not the checkpoint's own; trtllm-serve is given the "
                          "checkpoint only, so export the tokenizer into it (`invoke build --runtime pytorch`)")
    links = {name: model}
    if isinstance(options.speculative_config, (DraftTargetConfig, EagleConfig)):  # n-gram names no model
        links[name + DRAFT_SUFFIX] = _absolute_dir(options.speculative_config.speculative_model_dir,
                                                   "speculative_model_dir", path)
    return _write(Path(out), links, {**options.as_dict(), **PYTORCH_METRICS})


def _write(out: Path, links: dict[str, Path], options: dict) -> tuple[Path, Path]:
    """Write `options` to `out/OPTIONS_FILE` atomically and the links `out/<name> -> target`; (first link, options
    file)."""
    options_file = out / OPTIONS_FILE
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = options_file.with_name(f".{OPTIONS_FILE}.{os.getpid()}")
        tmp.write_text(yaml.safe_dump(options, sort_keys=False))
        os.replace(tmp, options_file)
        for link_name, target in links.items():
            link = out / link_name
            if link.is_symlink():
                link.unlink()
            link.symlink_to(target, target_is_directory=True)
    except OSError as exc:
        raise io_error(exc, f"writing the trtllm-serve inputs under {out}") from None
    return out / next(iter(links)), options_file


def _config(repo: Path, model: str):
    path = repo / model / "config.pbtxt"
    if not path.is_file():
        raise DeployError(f"{repo}: no {model}/config.pbtxt; an engine release holds the Triton repository of its "
                          "engines (release the build with --runtime engine)")
    return pbtxt.read(path), path


def write_engine_serve_inputs(repo: Path, out: Path, name: str) -> tuple[Path, Path]:
    """(engine link, options file) for `trtllm-serve --backend tensorrt`, written under `out` from the installed
    engine `repo`; `out/tokenizer` links the tokenizer."""
    name = check_name(name, what="served model name", fix="use the deployment name, e.g. llama-70b-fp8")
    if name in (TOKENIZER_LINK, OPTIONS_FILE):
        raise DeployError(f"served model name {name!r} is reserved; use the deployment name, e.g. llama-70b-fp8")
    repo = Path(repo)
    if (repo / "tensorrt_llm_draft").is_dir():
        raise DeployError(f"{repo}: a draft-target release; TensorRT-LLM 1.2.1's tensorrt backend has no draft-target "
                          "speculation, so deploy it with --serve-mode triton (or re-release without --draft)")
    llm, llm_path = _config(repo, "tensorrt_llm")
    pre, pre_path = _config(repo, "preprocessing")
    engine = _absolute_dir(pbtxt.parameter(llm, "gpt_model_path"), "gpt_model_path", llm_path)
    tokenizer = _absolute_dir(pbtxt.parameter(pre, "tokenizer_dir"), "tokenizer_dir", pre_path)
    fraction = pbtxt.parameter(llm, "kv_cache_free_gpu_mem_fraction") or "0.9"  # the backend's default when empty
    try:
        kv = KvCacheConfig(enable_block_reuse=pbtxt.parameter(llm, "enable_kv_cache_reuse") == "true",
                           free_gpu_memory_fraction=float(fraction))
    except ValueError:
        raise DeployError(f"{llm_path}: kv_cache_free_gpu_mem_fraction {fraction!r} is not a fraction in (0, 1]; "
                          "re-package the build") from None
    options = EngineServeOptions(kv_cache_config=kv,
                                 enable_chunked_prefill=pbtxt.parameter(llm, "enable_chunked_context") == "true")
    return _write(Path(out), {name: engine, TOKENIZER_LINK: tokenizer}, {**options.as_dict(), **PERF_METRICS})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipeline.ops.deploy.serve_inputs", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", action="store_true",
                        help="an engine release served by trtllm-serve --backend tensorrt")
    parser.add_argument("repo", type=Path, help="the installed repository (triton_repo/<name>)")
    parser.add_argument("out", type=Path, help="directory for the model link and the options YAML")
    parser.add_argument("name", help="served model name (the link's name)")
    args = parser.parse_args(argv)
    write = write_engine_serve_inputs if args.engine else write_serve_inputs
    try:
        link, options_file = write(args.repo, args.out, args.name)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"ok: {link} -> {link.resolve()}; options {options_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
