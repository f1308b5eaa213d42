"""What `invoke serve --mode trtllm-serve` serves on this host: the build's model directory, tokenizer and options.

A finished build is located check-only (`locate_outputs`, nothing is built): runtime pytorch serves its Hugging Face
checkpoint (engines/<build-id>/hf_checkpoint, tokenizer at its root), runtime engine its target engine
(engines/<build-id>/engine) with the checkpoint's tokenizer (engines/<build-id>/checkpoint/tokenizer). The options
YAML goes next to them, engines/<build-id>/llm_api_options-<spec-key8>.yaml.

`--print-only` needs no build: without one the paths are those the build will have, with `<build-id>` standing for
the id calibration gives it (it hashes the downloaded revision and the calibration set, as `compile --dry-run`
shows), and nothing is written; the options the YAML will hold are printed instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.artifacts import engines_dir
from pipeline.core.errors import BuildError, IntegrityError, PipelineError, io_error
from pipeline.core.layout import PENDING
from pipeline.core.runtimes import runtime_of
from pipeline.core.spec import BuildSpec
from pipeline.stages.build import locate_outputs
from pipeline.stages.download.stage import download_dir
from pipeline.stages.package.inputs import served_draft
from pipeline.stages.package.serve_plan import TrtllmServeBackend, trtllm_serve_backend

PENDING_COMMIT = "<commit>"  # the Hub commit a download pins


@dataclass(frozen=True)
class LocalServeInputs:
    model_dir: Path  # the HF checkpoint (pytorch) or the engine directory (engine)
    tokenizer_dir: Path | None  # engine only: engines hold no tokenizer
    options_file: Path
    options_yaml: str
    found: bool  # a finished build: the paths exist
    reason: str = ""  # why no finished build was found (print-only)

    def pending_options(self) -> str:
        """The options YAML as `#` lines under the path it will be written to (for a build not finished here)."""
        head = (f"# {self.options_file} (written when served; {PENDING} is the id calibration gives the build, "
                "known once the model is downloaded):")
        return "\n".join([head, *(f"#   {line}" for line in self.options_yaml.splitlines())])

    def write_options(self) -> None:
        """Write the options YAML atomically (only for a finished build)."""
        tmp = self.options_file.with_name(f".{self.options_file.name}.{os.getpid()}")
        try:
            tmp.write_text(self.options_yaml)
            os.replace(tmp, self.options_file)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise io_error(exc, f"writing {self.options_file}") from None


def options_file_name(spec: BuildSpec) -> str:
    return f"llm_api_options-{spec.identity()[:8]}.yaml"


def locate_serve_inputs(spec: BuildSpec, *, allow_pending: bool = False) -> LocalServeInputs:
    """The inputs of the finished build of `spec`; with `allow_pending`, the planned ones when there is none.

    Raises:
        SpecError: the build cannot be served by trtllm-serve (reference target, engine with a draft).
        PipelineError: no finished build (the message says what to run), unless `allow_pending`.
        IntegrityError: a build output differs from its manifest (exit 3), even with `allow_pending`.
    """
    served = trtllm_serve_backend(spec)
    try:
        out = locate_outputs(spec, until=served.served_stage)
    except IntegrityError:
        raise
    except PipelineError as exc:
        if not allow_pending:
            raise
        return _pending(spec, served, reason=str(exc))
    if out.checkpoint is None or out.layout is None:  # located up to the served stage, which follows calibrate
        raise BuildError(f"the build of {spec.model.name} has no checkpoint located; run `invoke build`")
    model_dir, tokenizer_dir, draft = served.served_dirs(
        checkpoint=out.checkpoint.path, engine=out.engine.path if out.engine else None, tokenizer=out.layout.tokenizer,
        draft_checkpoint=served_draft(spec, out))
    options_file = out.checkpoint.path.parent / options_file_name(spec)
    return LocalServeInputs(model_dir, tokenizer_dir, options_file, served.options(spec, draft).to_yaml(), True)


def _pending_draft(spec: BuildSpec, dirname: str) -> Path | None:
    """Where the draft will be served from: the draft's checkpoint (its own build id), an EAGLE-3 head's download
    (`<commit>`: the revision the download pins)."""
    if spec.draft_model is None:
        return None
    if spec.quantized_draft is not None:
        return engines_dir() / f"{PENDING}-draft" / dirname
    where = download_dir(spec.draft_model)
    return where if spec.draft_model.source == "generated" else where / PENDING_COMMIT


def _pending(spec: BuildSpec, served: TrtllmServeBackend, *, reason: str) -> LocalServeInputs:
    base = engines_dir() / PENDING
    ckpt = runtime_of(spec).checkpoint
    model_dir, tokenizer_dir, draft = served.served_dirs(
        checkpoint=base / ckpt.dirname, engine=base / "engine", tokenizer=ckpt.tokenizer_dir(base / ckpt.dirname),
        draft_checkpoint=_pending_draft(spec, ckpt.dirname))
    options_file = base / options_file_name(spec)
    return LocalServeInputs(model_dir, tokenizer_dir, options_file, served.options(spec, draft).to_yaml(), False,
                            reason)
