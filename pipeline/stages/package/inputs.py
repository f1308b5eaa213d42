"""What `package` reads: the directories and names of its inputs (`located.package_inputs` fills in those a caller
leaves out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec
    from pipeline.stages.stage import BuildOutputs


def served_draft(spec: BuildSpec, outputs: BuildOutputs) -> Path | None:
    """The directory a build serves its draft from: the draft model's calibrated checkpoint (draft-target), the
    EAGLE-3 head's download (eagle3: served as downloaded); None without a draft or when it is not found."""
    if spec.quantized_draft is not None:
        return outputs.draft_checkpoint.path if outputs.draft_checkpoint else None
    if spec.draft_model is not None:
        return outputs.draft_download.path if outputs.draft_download else None
    return None


@dataclass(frozen=True)
class PackageInputs:
    """Directories and names the package step reads (None: not given; the layout says which it needs).

    `output` is the directory the repository is published under; `build_id`, `name` and `spec_key` name it (see
    `pipeline.stages.package.package.repo_path`).
    """

    checkpoint: Path | None = None
    draft_checkpoint: Path | None = None
    engine: Path | None = None
    draft_engine: Path | None = None
    tokenizer: Path | None = None
    draft_tokenizer: Path | None = None
    output: Path | None = None
    build_id: str | None = None
    name: str | None = None
    spec_key: str | None = None

    @classmethod
    def of(cls, flags: Mapping[str, Any]) -> PackageInputs:
        """The directories `invoke package`'s typed flags name (`--engine-dir` and the like; empty or absent: None)."""

        def path(flag: str) -> Path | None:
            return Path(flags[flag]) if flags.get(flag) else None

        return cls(output=path("output"), engine=path("engine_dir"), draft_engine=path("draft_engine_dir"),
                   checkpoint=path("checkpoint_dir"), draft_checkpoint=path("draft_checkpoint_dir"),
                   tokenizer=path("tokenizer_dir"), draft_tokenizer=path("draft_tokenizer_dir"))
