"""What `package` reads: the directories and names of its inputs (`located.package_inputs` fills in those a caller
leaves out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping


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
