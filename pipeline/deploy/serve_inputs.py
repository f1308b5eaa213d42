"""On a serving node (runtime pytorch): what `trtllm-serve` takes, from the release's installed `llmapi` repository.

After `invoke install-repo` the repository's model.yaml holds absolute paths on this node. From it this writes
`OUT/llm_api_options.yaml` (the LLM-API options, validated against `LlmApiOptions`) and the link `OUT/NAME` to the
Hugging Face checkpoint (trtllm-serve names the served model after the directory it loads). fetch-verify.sh runs

    python3 -m pipeline.deploy.serve_inputs REPO OUT NAME
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..artifacts import check_name
from ..errors import DeployError, PipelineError, io_error
from ..triton import llmapi_yaml
from ..triton.llmapi_package import check_model_yaml

OPTIONS_FILE = "llm_api_options.yaml"


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
    if options.speculative_config is not None:
        _absolute_dir(options.speculative_config.speculative_model_dir, "speculative_model_dir", path)
    link, options_file = Path(out) / name, Path(out) / OPTIONS_FILE
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        tmp = options_file.with_name(f".{OPTIONS_FILE}.{os.getpid()}")
        tmp.write_text(options.to_yaml())
        os.replace(tmp, options_file)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(model, target_is_directory=True)
    except OSError as exc:
        raise io_error(exc, f"writing the trtllm-serve inputs under {out}") from None
    return link, options_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipeline.deploy.serve_inputs", description=__doc__.split("\n")[0])
    parser.add_argument("repo", type=Path, help="the installed llmapi repository (triton_repo/<name>)")
    parser.add_argument("out", type=Path, help="directory for the checkpoint link and the options YAML")
    parser.add_argument("name", help="served model name (the link's name)")
    args = parser.parse_args(argv)
    try:
        link, options_file = write_serve_inputs(args.repo, args.out, args.name)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"ok: {link} -> {link.resolve()}; options {options_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
