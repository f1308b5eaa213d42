"""An EAGLE-3 head in an `llmapi` repository: checked against the spec and its download manifest, then carried into
the repository beside model.yaml (`tensorrt_llm/1/eagle3_head/`), so the repository and a release of it hold the
exact files `speculative_config.speculative_model_dir` names.

The head is served as downloaded (TensorRT-LLM 1.2.1 loads its weights in the head's own dtype, its layer's KV cache
in the target's dtype): no calibration, no tokenizer of its own (it shares the target's), weights as `*.safetensors`
or a pickled `pytorch_model.bin` that only TensorRT-LLM opens.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pipeline.core.artifacts import MANIFEST, read_config_json
from pipeline.core.errors import PackageError
from pipeline.core.manifests import MAX_LISTED, DownloadManifest, FileRecord, GeneratedManifest, Manifest
from pipeline.core.spec import BuildSpec

HEAD_DIR = "eagle3_head"  # beside model.yaml: `speculative_model_dir: eagle3_head`
WEIGHTS = ("*.safetensors", "pytorch_model.bin")


def _download_manifest(path: Path, fix: str) -> Manifest:
    for kind in (DownloadManifest, GeneratedManifest):
        m = kind.read(path, strict=False)
        if m is not None:
            return m
    raise PackageError(f"EAGLE-3 head {path} has no download manifest, so its files cannot be verified; {fix}")


def read_head(path: Path, spec: BuildSpec, *, verify: bool = False) -> dict[str, FileRecord]:
    """The files of the EAGLE-3 head at `path` (name -> its download record) once it is shown to be the spec's head:
    exactly its download manifest's files (sha256 with `verify`), a config.json TensorRT-LLM loads as EAGLE-3
    (`draft_vocab_size`) over the target's vocabulary, trained for the spec's target.

    Raises:
        PackageError: one line naming what differs and the fix.
    """
    head = spec.draft_model
    if head is None or head.eagle3 is None:
        raise PackageError(f"the spec of {spec.model.name} has no EAGLE-3 head; pass --draft with one")
    path = Path(path)
    fix = f"re-fetch it (`invoke download --model {head.name} --verify`)"
    if head.eagle3.target_model != spec.model.name:
        raise PackageError(f"EAGLE-3 head {head.name} is trained for {head.eagle3.target_model}, not {spec.model.name}; "
                           f"pass --draft with a head of {spec.model.name}")
    m = _download_manifest(path, fix)
    problems = m.problems(path, full=verify)
    if problems:
        shown = "; ".join(problems[:MAX_LISTED])
        raise PackageError(f"EAGLE-3 head {path} differs from its download manifest ({shown}); {fix}")
    config = read_config_json(path / "config.json", PackageError, missing=f"EAGLE-3 head {path} has no config.json; "
                              f"{fix}", fix=fix)
    if "draft_vocab_size" not in config:
        raise PackageError(f"EAGLE-3 head {path}: config.json has no draft_vocab_size, so TensorRT-LLM 1.2 would load "
                           f"it as a plain model; {fix}")
    vocab = spec.model.architecture.vocab_size
    if config.get("vocab_size") != vocab:
        raise PackageError(f"EAGLE-3 head {path}: config.json vocab_size={config.get('vocab_size')!r} is not the "
                           f"target {spec.model.name}'s {vocab} (its d2t maps drafts into the target's vocabulary); "
                           f"pass --draft with a head of {spec.model.name}")
    if not any(Path(name).match(p) for name in m.files for p in WEIGHTS):
        raise PackageError(f"EAGLE-3 head {path} holds no *.safetensors or pytorch_model.bin; {fix}")
    return dict(m.files)


def carry_head(src: Path, dest: Path, files: dict[str, FileRecord]) -> None:
    """Put `files` of the head at `src` into `dest` (new): hard links where the filesystem allows, else copies."""
    dest.mkdir(parents=True)
    for name in sorted(files):
        if name == MANIFEST:
            continue
        try:
            os.link(src / name, dest / name)
        except OSError:
            shutil.copy2(src / name, dest / name)


def check_carried(table: dict[str, dict[str, Any]], prefix: str, files: dict[str, FileRecord]) -> None:
    """The carried head's bytes, hashed into the repository's file table under `prefix`, are its download's.

    Raises:
        PackageError: a file changed between its check and the copy.
    """
    for name, rec in files.items():
        sha = table.get(f"{prefix}/{name}", {}).get("sha256")
        if sha != rec.sha256:
            raise PackageError(f"EAGLE-3 head file {name} changed while it was carried into the repository (sha256 "
                               f"{str(sha)[:12]}… != {rec.sha256[:12]}…); re-fetch it and re-run `invoke package`")
