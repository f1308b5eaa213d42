"""The `trtllm-serve` plan: the exact OpenAI-compatible server command for a build (either runtime), and its checks.

TensorRT-LLM 1.2.1 `trtllm-serve MODEL` serves `/v1/completions`, `/v1/chat/completions`, `/v1/models` and `/health`
(`tensorrt_llm/commands/serve.py`, click options read at NVIDIA/TensorRT-LLM@00209af149e7774406881a37283dce303571eb11,
a 1.2-era copy, as no tagged 1.2.1 one is in the code index; tests/support/trtllm_serve_cli_table.py records them):

- runtime pytorch: `trtllm-serve HF_DIR --backend pytorch --tp_size N --pp_size M --host H --port P
  --extra_llm_api_options F` (the YAML `F`, our `LlmApiOptions`, overrides the CLI's defaults);
- runtime engine: `trtllm-serve ENGINE_DIR --backend tensorrt --tokenizer TOK_DIR --tp_size N --pp_size M
  --max_batch_size B --max_num_tokens T --max_seq_len S --host H --port P --extra_llm_api_options F`. The tensorrt
  backend builds `tensorrt_llm._tensorrt_engine.LLM` on the engine directory; an engine holds no tokenizer (hence
  `--tokenizer`), and its TP/PP must match the rank files. The CLI's batch/token/sequence values are *runtime*
  limits handed to the executor and checked against the build config (`TrtLlmArgs.
  validate_build_config_with_runtime_params`), so the plan passes the engine's own values instead of the CLI
  defaults. `F` (`EngineServeOptions`) sets only the KV-cache runtime settings and chunked prefill.
  Draft-target speculation is PyTorch-only there (`DraftTargetDecodingConfig.supports_backend` is
  `backend == "pytorch"`), so an engine build with a draft is refused (serve it with Triton).

Ranks spanning nodes are started the way upstream documents for Slurm: `srun --mpi=pmix --ntasks=<world>
--ntasks-per-node=<ranks per node> trtllm-llmapi-launch trtllm-serve ...` (every rank runs the launcher; rank 0 serves
HTTP). The launcher (`tensorrt_llm/llmapi/trtllm-llmapi-launch` @ 020c89e64e49f24102f1b62be96a1a68283cdf7a) only sets up
the MPI proxy the LLM API's executor uses, whichever backend, so the same wrapper starts engine ranks.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from pipeline.core.errors import HostError, SpecError
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.planning.placement import place
from pipeline.stages.compile.engine_plan import effective_max_num_tokens
from pipeline.stages.package.llmapi_options import (EngineServeOptions, LlmApiOptions, engine_serve_options,
                                                    llm_api_options)

TRTLLM_SERVE = "trtllm-serve"
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
ENGINE_BACKEND, CHECKPOINT_BACKEND = "tensorrt", "pytorch"  # trtllm-serve --backend: engines | an HF checkpoint


class TrtllmServePlan(BaseModel):
    """What `invoke serve --mode trtllm-serve` runs."""

    argv: list[str]
    options_file: str
    world_size: int
    nodes: int
    multi_node: bool
    backend: str = "pytorch"

    def command_line(self) -> str:
        """The argv as one /bin/sh line (every word quoted)."""
        return shlex.join(self.argv)


class TrtllmServeBackend(Protocol):
    """How `trtllm-serve` serves one runtime × target (`TRTLLM_SERVE_BACKENDS`, by the row's trtllm-serve mode)."""

    name: str  # trtllm-serve --backend
    served_stage: str  # the build stage whose output it serves

    def check(self, spec: BuildSpec) -> None:
        """Refuse what this backend cannot serve (SpecError with the way out)."""
        ...

    def argv(self, spec: BuildSpec, *, model_dir: Path, tokenizer_dir: Path | None, options_file: Path, host: str,
             port: int) -> list[str]:
        """The one-process `trtllm-serve` command over `model_dir`."""
        ...

    def options(self, spec: BuildSpec, draft_dir: Path | None) -> LlmApiOptions | EngineServeOptions:
        """The `--extra_llm_api_options` YAML's content."""
        ...

    def served_dirs(self, *, checkpoint: Path, engine: Path | None, tokenizer: Path,
                    draft_checkpoint: Path | None) -> tuple[Path, Path | None, Path | None]:
        """(model dir, tokenizer dir or None, draft dir or None) of a build's outputs."""
        ...


class EngineServe:
    """`trtllm-serve ENGINE --backend tensorrt --tokenizer TOK`: the target engine, the checkpoint's tokenizer."""

    name = ENGINE_BACKEND
    served_stage = "compile"

    def check(self, spec: BuildSpec) -> None:
        if spec.draft_model is not None:
            raise SpecError(f"trtllm-serve with draft {spec.draft_model.name}: TensorRT-LLM 1.2.1's tensorrt backend "
                            "has no draft-target speculation (PyTorch backend only); serve these engines with Triton "
                            "(serve --mode triton, deploy without --serve-mode), or build --runtime pytorch, or drop "
                            "--draft")

    def argv(self, spec: BuildSpec, *, model_dir: Path, tokenizer_dir: Path | None, options_file: Path, host: str,
             port: int) -> list[str]:
        if tokenizer_dir is None:
            raise SpecError("trtllm_serve_plan: an engine build needs its tokenizer directory")
        return engine_serve_argv(spec, engine_dir=model_dir, tokenizer_dir=tokenizer_dir, options_file=options_file,
                                 host=host, port=port)

    def options(self, spec: BuildSpec, draft_dir: Path | None) -> EngineServeOptions:
        return engine_serve_options(spec)

    def served_dirs(self, *, checkpoint: Path, engine: Path | None, tokenizer: Path,
                    draft_checkpoint: Path | None) -> tuple[Path, Path | None, Path | None]:
        if engine is None:
            raise SpecError("trtllm_serve_plan: an engine build needs its engine directory")
        return engine, tokenizer, None


class CheckpointServe:
    """`trtllm-serve HF_DIR --backend pytorch`: the Hugging Face checkpoint (tokenizer at its root), the draft's."""

    name = CHECKPOINT_BACKEND
    served_stage = "calibrate"

    def check(self, spec: BuildSpec) -> None:
        return None

    def argv(self, spec: BuildSpec, *, model_dir: Path, tokenizer_dir: Path | None, options_file: Path, host: str,
             port: int) -> list[str]:
        return serve_argv(spec, model_dir=model_dir, options_file=options_file, host=host, port=port)

    def options(self, spec: BuildSpec, draft_dir: Path | None) -> LlmApiOptions:
        return llm_api_options(spec, draft_dir=draft_dir)

    def served_dirs(self, *, checkpoint: Path, engine: Path | None, tokenizer: Path,
                    draft_checkpoint: Path | None) -> tuple[Path, Path | None, Path | None]:
        return checkpoint, None, draft_checkpoint


class NotServed(CheckpointServe):
    """The CPU reference: trtllm-serve serves only TensorRT-LLM builds."""

    def check(self, spec: BuildSpec) -> None:
        raise SpecError(f"trtllm-serve serves TensorRT-LLM builds, but this is --target {spec.target} (the CPU "
                        "reference backend); serve it with Triton (serve --mode triton)")


# the served runtime a row's `trtllm-serve` mode names (`RuntimeTarget.serve_modes`; None: the mode is refused)
TRTLLM_SERVE_BACKENDS: dict[str | None, TrtllmServeBackend] = {
    "trtllm-serve-engine": EngineServe(), "trtllm-serve-pytorch": CheckpointServe(), None: NotServed()}


def trtllm_serve_backend(spec: BuildSpec) -> TrtllmServeBackend:
    """How trtllm-serve serves `spec`, checked.

    Raises:
        SpecError: it cannot (the CPU reference target, an engine with a draft), with the way out (exit 2).
    """
    backend = TRTLLM_SERVE_BACKENDS[dict(runtime_of(spec).serve_modes).get("trtllm-serve")]
    backend.check(spec)
    return backend


def check_servable(spec: BuildSpec) -> None:
    """Refuse what `trtllm-serve` cannot serve: the CPU reference target, and a draft on the tensorrt backend.

    Raises:
        SpecError: with the way out (exit 2).
    """
    trtllm_serve_backend(spec)


def serve_argv(spec: BuildSpec, *, model_dir: Path | str, options_file: Path | str, host: str,
               port: int) -> list[str]:
    """`trtllm-serve MODEL --backend pytorch ...` for one process (the program every rank runs across nodes)."""
    p = spec.parallelism
    return [TRTLLM_SERVE, str(model_dir), "--backend", CHECKPOINT_BACKEND, "--tp_size", str(p.tp), "--pp_size", str(p.pp),
            "--host", host, "--port", str(port), "--extra_llm_api_options", str(options_file)]


def engine_serve_argv(spec: BuildSpec, *, engine_dir: Path | str, tokenizer_dir: Path | str,
                      options_file: Path | str, host: str, port: int) -> list[str]:
    """`trtllm-serve ENGINE --backend tensorrt --tokenizer TOK ...` for one process, with the engine's own limits."""
    check_servable(spec)
    p = spec.parallelism
    return [TRTLLM_SERVE, str(engine_dir), "--backend", ENGINE_BACKEND, "--tokenizer", str(tokenizer_dir),
            "--tp_size", str(p.tp), "--pp_size", str(p.pp), "--max_batch_size", str(spec.max_batch_size),
            "--max_num_tokens", str(effective_max_num_tokens(spec)), "--max_seq_len", str(spec.max_seq_len),
            "--host", host, "--port", str(port), "--extra_llm_api_options", str(options_file)]


def trtllm_serve_plan(spec: BuildSpec, *, model_dir: Path, options_file: Path, host: str = "127.0.0.1",
                      port: int = 8000, tokenizer_dir: Path | None = None) -> TrtllmServePlan:
    """The trtllm-serve command of `spec`: over its HF checkpoint `model_dir` (runtime pytorch) or its engine
    directory `model_dir` with `tokenizer_dir` (runtime engine), and the options YAML."""
    backend = trtllm_serve_backend(spec)
    p = spec.parallelism
    placement = place(p.tp, p.pp, spec.hardware)
    serve = backend.argv(spec, model_dir=model_dir, tokenizer_dir=tokenizer_dir, options_file=options_file, host=host,
                         port=port)
    multi = placement.nodes > 1
    launch = ["srun", "--mpi=pmix", f"--nodes={placement.nodes}", f"--ntasks={placement.world_size}",
              f"--ntasks-per-node={placement.ranks_per_node}", LLMAPI_LAUNCH] if multi else []
    return TrtllmServePlan(argv=launch + serve, options_file=str(options_file), world_size=placement.world_size,
                           nodes=placement.nodes, multi_node=multi,
                           backend=backend.name)


def require_trtllm_serve() -> str:
    """The trtllm-serve executable on PATH.

    Raises:
        HostError: not installed here (exit 4): it needs a GPU host with TensorRT-LLM 1.2.1.
    """
    exe = shutil.which(TRTLLM_SERVE)
    if exe is None:
        raise HostError(f"{TRTLLM_SERVE} is not on PATH: --mode trtllm-serve needs a GPU host with TensorRT-LLM "
                        "1.2.1 (pip install tensorrt_llm==1.2.1 or the NGC release container); pass --print-only "
                        "to see the command")
    return exe
