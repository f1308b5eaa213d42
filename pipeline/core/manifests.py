"""Typed stage seams: one pydantic manifest per stage output and the one result type every stage returns.

Every finished stage directory holds `manifest.json`: its `key` (the hash of exactly the stage's inputs) and the
file table of everything in the directory. A stage output is *cached* (reused) only when its key matches and its
files still match that table (`Manifest.problems`); anything else is rebuilt, or refused with one line naming
`--force STAGE`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from pipeline.core.artifacts import MANIFEST, check_files, remove_stale_temps, write_manifest
from pipeline.core.errors import IntegrityError
from pipeline.core.untrusted import read_bytes



class SpecFacts(Protocol):
    """What a record is compared with (`PrecisionSearch.differences`): a `pipeline.core.spec.BuildSpec`."""

    @property
    def model(self) -> Any: ...

    @property
    def hardware(self) -> Any: ...

    @property
    def runtime(self) -> str: ...

    @property
    def max_ppl_delta_pct(self) -> float: ...


MAX_LISTED = 3
MAX_RECORD_BYTES = 16 << 20  # manifest.json, precision_search.json: a few KB (a file table of thousands of files)


class FileRecord(BaseModel):
    """One file of an output: sha256, size, and the mtime it had when recorded (the fast re-use check)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: StrictInt = Field(ge=0)
    mtime_ns: StrictInt | None = None


class TokenizerIdentity(BaseModel):
    """What decides token ids: sha256 over tokenizer.json's model/added_tokens/normalizer/pre_tokenizer sections,
    or of tokenizer.model (sentencepiece). Two tokenizers are the same when their identities are equal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: Literal["tokenizer.json", "tokenizer.model"]
    sha256: str


class Manifest(BaseModel):
    """Base of every stage manifest."""

    model_config = ConfigDict(extra="forbid")

    stage: str  # the stage that wrote it: the name `--force` takes
    key: str = Field(min_length=1)
    files: dict[str, FileRecord]

    @classmethod
    def read(cls, directory: Path, *, strict: bool = True) -> Self | None:
        """The manifest of `directory`, None when it has none (or, unless `strict`, when it is unusable: a stage
        about to build treats that like a stale output and replaces it).

        Raises:
            IntegrityError: manifest.json is unreadable or not this stage's manifest (corrupt, or another version).
        """
        path = Path(directory) / MANIFEST
        try:
            return cls.model_validate_json(read_bytes(path, cap=MAX_RECORD_BYTES, what=str(path), fix="delete it",
                                                      error=IntegrityError))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (ValidationError, ValueError, OSError, IntegrityError):
            if not strict:
                return None
            raise IntegrityError(
                f"{path} is corrupt or from another pipeline version; re-run `invoke build --force {cls.stage_name()}`",
                path=path,
            ) from None

    @classmethod
    def current(cls, directory: Path, key: str | None, *, verify: bool = False, strict: bool = False) -> Self | None:
        """The manifest of `directory` when it is the output for `key` (None: any key) and its files still match
        it; None when there is none, it is for other inputs, or (unless `strict`) it is unreadable. Temporaries a
        killed run left beside `directory` are removed first, so a cached re-run cleans up too.

        Raises:
            IntegrityError: the output for `key` differs from its file table (exit 3, naming `--force STAGE`).
        """
        remove_stale_temps(directory)  # what a killed run of this stage left beside it (dead owners only)
        m = cls.read(directory, strict=strict)
        if m is None or (key is not None and m.key != key):
            return None
        m.check(directory, full=verify)
        return m

    @classmethod
    def stage_name(cls) -> str:
        name: str = cls.model_fields["stage"].default
        return name

    def write(self, directory: Path) -> Path:
        return write_manifest(directory, self.model_dump(mode="json"))

    def problems(self, directory: Path, *, full: bool = False) -> list[str]:
        """How `directory` differs from this manifest's file table ([] when it matches)."""
        return check_files(Path(directory), self.files, full=full)

    def check(self, directory: Path, *, full: bool = False) -> None:
        """Raise `IntegrityError` (exit 3, naming `--force STAGE`) unless `directory` matches the file table."""
        problems = self.problems(directory, full=full)
        if problems:
            raise integrity_error(directory, problems, fix=f"re-run `invoke build --force {self.stage}`")


def integrity_error(directory: Path, problems: list[str], *, fix: str) -> IntegrityError:
    shown = "; ".join(problems[:MAX_LISTED]) + (f" (+{len(problems) - MAX_LISTED} more)"
                                                 if len(problems) > MAX_LISTED else "")
    return IntegrityError(f"{directory} differs from its manifest: {shown}; {fix}", path=directory,
                          actual=problems)


class GeneratedManifest(Manifest):
    """A generated tiny model (`pipeline.stages.download.tinymodel`)."""

    stage: Literal["download"] = "download"

    name: str
    generator_version: str
    train_steps: int
    final_train_loss: float | None
    heldout_perplexity_fp32: float | None
    seconds: float


class DownloadManifest(Manifest):
    """A Hub snapshot pinned to a commit (or a generated model, described the same way)."""

    stage: Literal["download"] = "download"

    model: str
    repo_id: str
    revision: str
    sha: str
    source: Literal["hub", "generated"]
    total_bytes: int
    allow_patterns: list[str] = []
    refetched: list[str] = []
    seconds: float | None = None
    generator_version: str | None = None


class SourceRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    repo_id: str
    sha: str
    revision: str
    source_dir: str


class DeviceRecord(BaseModel):
    """Where a checkpoint was calibrated: cuda or cpu, the device's name and how many were visible."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["cuda", "cpu"]
    name: str
    count: int | None = None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecipeRecord(_Record):
    """The quantization recipe a checkpoint was made with (ModelOpt config name, the algos written into it)."""

    precision: str
    kv_cache: str
    modelopt_config: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    export_dtype: str
    awq_block_size: int | None


class CalibrationRecord(_Record):
    """The calibration token set: where it came from, its fingerprint and how it was packed and batched."""

    source: str
    fingerprint: str
    samples: int
    requested_samples: int
    seq_len: int
    tokens: int
    batch_size: int
    seed: int


class TrtllmCheckpointRecord(_Record):
    """A TensorRT-LLM checkpoint's config.json sections, as the exporter wrote them, and the tokenizer files."""

    # TensorRT-LLM's own config.json sections, mirrored as written (their schema is TensorRT-LLM's)
    quantization: dict[str, Any] | None
    mapping: dict[str, Any] | None
    dtype: str | None
    tokenizer_files: list[str]


class HfCheckpointRecord(_Record):
    """A unified Hugging Face checkpoint: its hf_quant_config.json mapping, weight dtype and tokenizer files."""

    format: Literal["hf"]
    hf_quant_config: dict[str, Any]  # ModelOpt's own file, mirrored as written
    dtype: str
    tokenizer_files: list[str]


class QualityRecord(_Record):
    """The held-out quality gate: perplexities, KL and top-1 agreement of quantized vs unquantized."""

    ppl_base: float
    ppl_quant: float
    ppl_delta_pct: float
    kl_mean: float
    top1_agreement: float
    tokens: int
    threshold_pct: float
    passed: bool
    enforced: bool
    heldout_fingerprint: str


class RoundtripTolerance(_Record):
    max_rel_logit_err: float
    min_top1: float
    max_ppl_rel_diff_pct: float


class RoundtripCheck(_Record):
    """The re-loaded export compared with the fake-quant model on held-out tokens."""

    max_rel_logit_err: float
    top1_agreement: float
    ppl_rel_diff_pct: float
    tokens: int
    passed: bool
    tolerance: RoundtripTolerance


class RoundtripSkipped(_Record):
    """The round-trip check was not run (why: `skipped`)."""

    passed: None = None
    skipped: str


class CheckpointManifest(Manifest):
    """An exported TensorRT-LLM checkpoint (calibrate stage) with its tokenizer and quality-gate numbers."""

    stage: Literal["calibrate"] = "calibrate"

    build_id: str
    role: Literal["target", "draft"]
    factors: dict[str, Any]  # exactly what the stage key hashes: free-form by design
    model: SourceRecord
    tokenizer: TokenizerIdentity
    recipe: RecipeRecord
    calibration: CalibrationRecord
    parallelism: dict[str, int]
    checkpoint: TrtllmCheckpointRecord | HfCheckpointRecord
    quality: QualityRecord
    roundtrip: RoundtripCheck | RoundtripSkipped
    toolchain: dict[str, str]
    device: DeviceRecord
    timings: dict[str, float]
    peak_memory: dict[str, int]
    argv: list[str]


class PrecisionCandidate(_Record):
    """One calibrated `precision: auto` candidate: its held-out perplexity delta and whether it passed the gate."""

    precision: str
    kv_cache: str
    ppl_delta_pct: float
    passed: bool
    build_id: str  # the candidate's checkpoint build (kept when it failed too: its manifest records the delta)


class PrecisionSearch(_Record):
    """What `precision: auto` tried (in order), what each measured, which passed the gate and which it chose.

    Written in the chosen build's directory (`BuildLayout.precision_search`) with a sha256 sidecar
    (`precision_search.json.sha256`, as `sha256sum` writes it); `passing` is the set a later search (cost, SLO) may
    choose from without calibrating again. A record is consistent or refused: candidates tried, a finite threshold,
    each verdict its delta against it, `passing` exactly those that passed (in order), `chosen` the last of them."""

    model: str
    gpu: str
    runtime: str
    threshold_pct: float
    candidates: list[PrecisionCandidate]
    refused: dict[str, str]  # candidates the spec's rules refused, with why (never calibrated)
    not_tried: list[str]  # cheaper candidates skipped because a more precise one failed the gate
    passing: list[str]  # the candidates that passed the gate, most precise first
    chosen: str  # the cheapest passing candidate

    @model_validator(mode="after")
    def _consistent(self) -> PrecisionSearch:
        t = self.threshold_pct
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"threshold_pct {t} is not a positive finite number")
        if not self.candidates:
            raise ValueError("no candidates were tried")
        for c in self.candidates:
            if c.passed != (c.ppl_delta_pct <= t):
                raise ValueError(f"{c.precision}: delta {c.ppl_delta_pct} % {'passed' if c.passed else 'failed'} "
                                 f"a {t} % gate")
        passed = [c.precision for c in self.candidates if c.passed]
        if self.passing != passed:
            raise ValueError(f"passing {self.passing} is not the candidates that passed {passed}")
        if not passed or self.chosen != passed[-1]:
            raise ValueError(f"chosen {self.chosen!r} is not the cheapest passing candidate")
        return self

    def differences(self, spec: SpecFacts) -> list[str]:
        """How this record's model, GPU, runtime and gate threshold differ from `spec`'s ([]: it is for `spec`)."""
        mine = {"model": self.model, "gpu": self.gpu, "runtime": self.runtime, "threshold": self.threshold_pct}
        theirs = {"model": spec.model.name, "gpu": spec.hardware.gpu, "runtime": spec.runtime,
                  "threshold": spec.max_ppl_delta_pct}
        return [f"{k} {mine[k]} (this spec: {theirs[k]})" for k in mine if mine[k] != theirs[k]]

    def write(self, path: Path) -> Path:
        """Write the record and its sha256 sidecar to `path` atomically (a reader sees the old pair or this one,
        or a pair it refuses when a crash fell between the two renames)."""
        path = Path(path)
        data = (self.model_dump_json(indent=2) + "\n").encode()
        pairs = ((path, data), (_sidecar(path), f"{hashlib.sha256(data).hexdigest()}  {path.name}\n".encode()))
        tmps = [(p.with_name(f".{p.name}.{os.getpid()}.tmp"), p, d) for p, d in pairs]
        try:
            for tmp, _, d in tmps:
                tmp.write_bytes(d)
            for tmp, final, _ in tmps:
                os.replace(tmp, final)
        finally:
            for tmp, _, _ in tmps:
                tmp.unlink(missing_ok=True)
        return path

    @classmethod
    def read(cls, path: Path) -> PrecisionSearch | None:
        """The record at `path`, None when there is none.

        Raises:
            IntegrityError: the file or its sidecar is unreadable, they disagree, or it is no consistent record
                (the message names the file, what is wrong and the fix).
        """
        fix = "re-run `invoke build --precision auto`"
        what = f"precision search {path}"
        try:
            data = read_bytes(path, cap=MAX_RECORD_BYTES, what=what, fix=fix, error=IntegrityError)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            raise IntegrityError(f"{path} is unreadable; {fix}", path=path) from None
        try:
            recorded = read_bytes(_sidecar(path), cap=1024, what=f"{what} sidecar", fix=fix,
                                  error=IntegrityError).split(maxsplit=1)[0].decode("ascii", "replace")
        except (OSError, IndexError):
            raise IntegrityError(f"{what} has no readable sha256 sidecar {_sidecar(path).name}; {fix}",
                                 path=path) from None
        if recorded != hashlib.sha256(data).hexdigest():
            raise IntegrityError(f"{what} differs from its sha256 sidecar (modified or truncated); {fix}", path=path)
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            why = ".".join(map(str, err["loc"])) + ": " if err["loc"] else ""
            why += err["msg"].removeprefix("Value error, ")
            raise IntegrityError(f"{what} is not a consistent record ({why}); {fix}", path=path) from None
        except ValueError:
            raise IntegrityError(f"{path} is corrupt or from another pipeline version; {fix}", path=path) from None


def _sidecar(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".sha256")


class GpuRecord(_Record):
    """The GPU an engine was built on (None: not known to the toolchain probe)."""

    name: str | None
    sm: int | None
    count: int | None


class InputRecord(_Record):
    """How a manifest records its input directory: path, key, manifest hash; for a directory from outside the
    pipeline, how its key was made (`key_source`, absent for a pipeline output)."""

    path: str
    key: str
    manifest_sha256: str | None
    key_source: str | None = Field(default=None, exclude_if=lambda v: v is None)


class DraftRecord(BaseModel):
    """How a target engine records the draft engine it pairs with."""

    model_config = ConfigDict(extra="forbid")

    path: str
    model: str | None
    key: str
    manifest_sha256: str
    tokenizer: TokenizerIdentity


class EngineManifest(Manifest):
    """A verified TensorRT-LLM engine directory (compile stage)."""

    stage: Literal["compile"] = "compile"

    role: str
    model: str
    precision: str
    kv_cache: str
    tp: int
    pp: int
    world_size: int
    engine_version: str
    toolchain: dict[str, str | None]
    gpu: GpuRecord
    argv: list[str]
    planned_build_config: dict[str, Any]  # TensorRT-LLM's own build_config, mirrored: its schema is TensorRT-LLM's
    build_config_sha256: str
    checkpoint: InputRecord
    tokenizer: TokenizerIdentity | None = None
    draft: DraftRecord | None = None
    build_seconds: float | None = None
    log: str | None = None
    created: str


class SpeculationRecord(BaseModel):
    """How a repository speculates: its mode, the model it drafts with (draft-target: the draft model; eagle3: the
    EAGLE-3 head, served as downloaded; ngram: none), and the draft tokens per step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["draft-target", "eagle3", "ngram"] = "draft-target"
    draft: str | None = None
    num_draft_tokens: StrictInt = Field(ge=1)

    @model_validator(mode="after")
    def _draft_for_draft_target(self) -> Self:
        drafted = self.mode != "ngram"
        if (self.draft is not None) != drafted:
            raise ValueError(f"speculation mode {self.mode} {'needs a' if drafted else 'takes no'} draft model")
        return self


class RepoManifest(Manifest):
    """A validated Triton model repository (package stage)."""

    stage: Literal["package"] = "package"

    target: Literal["trtllm", "reference"]
    runtime: Literal["engine", "pytorch"] = "engine"  # pytorch: the LLM-API (llmapi) model layout
    build_id: str
    spec: str
    spec_key: str | None = None
    models: list[str]
    speculation: SpeculationRecord | None = None
    sources: dict[str, str | None]
    gpt_model_path: dict[str, str]
    world_size: int
    kv_cache_reuse: bool
    warnings: list[str] = []


class ReleaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: StrictInt = Field(ge=0)


class ReleaseDocument(BaseModel):
    """`release.json`: the release's metadata and the sha256 of every file it holds (never empty).

    Format 2 also records the tarball's directory entries and its files packed 0755, so the tarball is a function of
    this document and its sha256 pins the whole release; format 1 (earlier releases) was pinned by the tarball's own.
    """

    model_config = ConfigDict(extra="allow")

    format: Literal[1, 2]
    name: str = Field(min_length=1)
    version: str | None = None
    components: dict[str, list[str]] = {}
    files: dict[str, ReleaseFile] = Field(min_length=1)
    dirs: list[str] = []
    executable: list[str] = []

    def canonical(self) -> bytes:
        """The deterministic bytes of release.json (sorted keys, no timestamps)."""
        return (json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()


M = TypeVar("M", bound=Manifest, covariant=True)  # a StageResult[EngineManifest] is a StageResult[Manifest]


@dataclass(frozen=True)
class StageResult(Generic[M]):
    """What every stage returns: where its output is, its manifest, and whether this call built it."""

    path: Path
    manifest: M
    status: Literal["built", "cached"]

    @property
    def built(self) -> bool:
        return self.status == "built"
