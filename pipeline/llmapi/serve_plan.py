"""The `trtllm-serve` plan (runtime pytorch): the exact OpenAI-compatible server command for a build, and running it.

TensorRT-LLM 1.2.1 `trtllm-serve MODEL --backend pytorch --tp_size N --pp_size M --host H --port P
--extra_llm_api_options F` serves `/v1/completions`, `/v1/chat/completions` and `/v1/models`; the YAML `F` (our
`LlmApiOptions`) overrides the CLI's defaults. Ranks spanning nodes are started the way upstream documents for
Slurm: `srun --mpi=pmix --ntasks=<world> --ntasks-per-node=<ranks per node> trtllm-llmapi-launch trtllm-serve ...`
(every rank runs the launcher; rank 0 serves HTTP).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel

from ..errors import HostError
from ..placement import place
from ..spec import BuildSpec

TRTLLM_SERVE = "trtllm-serve"
LLMAPI_LAUNCH = "trtllm-llmapi-launch"


class TrtllmServePlan(BaseModel):
    """What `invoke serve --mode trtllm-serve` runs."""

    argv: list[str]
    options_file: str
    world_size: int
    nodes: int
    multi_node: bool

    def command_line(self) -> str:
        return " ".join(self.argv)


def serve_argv(spec: BuildSpec, *, model_dir: Path | str, options_file: Path | str, host: str,
               port: int) -> list[str]:
    """`trtllm-serve MODEL --backend pytorch ...` for one process (the program every rank runs across nodes)."""
    p = spec.parallelism
    return [TRTLLM_SERVE, str(model_dir), "--backend", "pytorch", "--tp_size", str(p.tp), "--pp_size", str(p.pp),
            "--host", host, "--port", str(port), "--extra_llm_api_options", str(options_file)]


def trtllm_serve_plan(spec: BuildSpec, *, model_dir: Path, options_file: Path, host: str = "127.0.0.1",
                      port: int = 8000) -> TrtllmServePlan:
    """The trtllm-serve command of `spec` over its exported checkpoint `model_dir` and options YAML."""
    p = spec.parallelism
    placement = place(p.tp, p.pp, spec.hardware)
    serve = serve_argv(spec, model_dir=model_dir, options_file=options_file, host=host, port=port)
    multi = placement.nodes > 1
    launch = ["srun", "--mpi=pmix", f"--nodes={placement.nodes}", f"--ntasks={placement.world_size}",
              f"--ntasks-per-node={placement.ranks_per_node}", LLMAPI_LAUNCH] if multi else []
    return TrtllmServePlan(argv=launch + serve, options_file=str(options_file), world_size=placement.world_size,
                           nodes=placement.nodes, multi_node=multi)


def require_trtllm_serve() -> str:
    """The trtllm-serve executable on PATH.

    Raises:
        HostError: not installed here (exit 4): it needs a GPU host with TensorRT-LLM 1.2.1.
    """
    exe = shutil.which(TRTLLM_SERVE)
    if exe is None:
        raise HostError(f"{TRTLLM_SERVE} is not on PATH: serving runtime pytorch needs a GPU host with TensorRT-LLM "
                        "1.2.1 (pip install tensorrt_llm==1.2.1 or the NGC release container); pass --print-only "
                        "to see the command")
    return exe
