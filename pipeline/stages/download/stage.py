"""Checkpoint acquisition: pinned, verified Hugging Face Hub downloads (and generated tiny models, same interface).

A branch or tag resolves to a commit SHA once and is written to the revision lock file (`models.lock.json` in the
output tree); later runs use the locked SHA unless `update=True`. Files are fetched in parallel, one streamed GET
each through huggingface_hub's public HTTP session (`fetch.py`), into a hidden staging directory (interrupted
downloads resume from there); every file is checked against the Hub's oids (sha256 for LFS files, computed while it
is written; git blob sha1 otherwise), corrupt files are re-fetched, `config.json` is cross-checked against the
registry, and only then is the directory renamed to `cache_dir()/downloads/<org>--<name>/<sha>/` with a
`manifest.json`. A finished download is re-used after a size/mtime check (no network, no hashing) unless
`verify=True`. The token is never logged or written anywhere.
Every call returns a `StageResult[DownloadManifest]` (status "built" when something was fetched or generated).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from filelock import FileLock

from pipeline.core.architectures import HF_KEYS, UnsupportedArchitecture, UnusableConfigField, trtllm_config_fields
from pipeline.core.artifacts import (
    MANIFEST,
    cache_dir,
    output_root,
    remove_stale_temps,
    safe_join,
    sha256_file,
    stage_key,
    stage_lock,
)
from pipeline.core.errors import DownloadError, IntegrityError, PipelineError
from pipeline.core.hub_entry import read_config
from pipeline.core.manifests import DownloadManifest, GeneratedManifest, StageResult, integrity_error
from pipeline.core.registry import Architecture, ModelEntry, check_repo_id, hub_architecture
from pipeline.core.tokenizer import token_count
from pipeline.core.untrusted import parse_json, read_bytes
from pipeline.stages.download import tinymodel
from pipeline.stages.download.fetch import fetch_file
from pipeline.stages.stage import BuildOptions, BuildOutputs, StageOutcome, outcome

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

# Files a later stage uses (top level of the repo only).
ALLOW_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
# An EAGLE-3 head (a registry entry with `eagle3`) may ship its weights as one pickled `pytorch_model.bin` (the
# yuhuili heads upstream's tests load have no safetensors); it is verified by the Hub's LFS sha256, never unpickled
# here (TensorRT-LLM loads it), and fetched only when the revision has no safetensors. It needs no tokenizer: it
# shares its target's.
HEAD_PICKLE = "pytorch_model.bin"
MAX_WORKERS = 8
MAX_LOCK_BYTES = 16 << 20  # models.lock.json: a few hundred bytes a model
LOCK_FILE_NAME = "models.lock.json"
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_ATTEMPTS = 3  # fetch rounds: resume after a dropped connection / re-fetch corrupt files


DownloadResult = StageResult[DownloadManifest]


@dataclass(frozen=True)
class HubAccess:
    """How to reach the Hub: its URL (None: HF_ENDPOINT or https://huggingface.co), the token (None: HF_TOKEN or the
    token saved by `hf auth login`; never logged or stored) and the parallel file downloads."""

    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)
    max_workers: int = MAX_WORKERS


@dataclass(frozen=True)
class Snapshot:
    """One pinned commit of a model's repo and the files the pipeline fetches from it (name -> size and oids)."""

    entry: ModelEntry
    requested: str  # the branch, tag or commit asked for
    sha: str
    files: dict[str, dict[str, Any]]

    @property
    def where(self) -> str:
        return f"{self.entry.repo_id}@{self.sha[:12]}"


# --------------------------------------------------------------------------------------------------------------
# Revision lock file


def lock_file_path() -> Path:
    """Default revision lock file: `<output root>/models.lock.json` (commit it to pin every model)."""
    return output_root() / LOCK_FILE_NAME


def read_lock(path: Path) -> dict[str, Any]:
    fix = "fix or delete it"
    try:
        data = parse_json(read_bytes(path, cap=MAX_LOCK_BYTES, what=f"revision lock file {path}", fix=fix,
                                     error=DownloadError), what=f"revision lock file {path}", fix=fix, error=DownloadError)
    except FileNotFoundError:
        return {"version": 1, "models": {}}
    except ValueError:  # not UTF-8 or not JSON
        raise DownloadError(f"revision lock file {path} is not valid JSON; fix or delete it") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise DownloadError(f"revision lock file {path} has no 'models' mapping; fix or delete it")
    return data


def locked_sha(path: Path, entry: ModelEntry, revision: str) -> str | None:
    """The locked commit of `entry` at the requested `revision`, if the lock file has one for the same repo."""
    rec = read_lock(path)["models"].get(entry.name)
    if isinstance(rec, dict) and rec.get("repo_id") == entry.repo_id and rec.get("revision") == revision:
        sha = rec.get("sha")
        return sha if isinstance(sha, str) and _SHA_RE.match(sha) else None
    return None


def write_lock(path: Path, entry: ModelEntry, revision: str, sha: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        data = read_lock(path)
        data["models"][entry.name] = {"repo_id": entry.repo_id, "revision": revision, "sha": sha}
        data["models"] = dict(sorted(data["models"].items()))
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------------------
# Checks


def check_architecture(config: dict[str, Any], arch: Architecture, *, where: str, model: str) -> None:
    """Raise `DownloadError` when a downloaded config.json is unusable (`registry.hub_architecture`: a class no
    family covers, a number of the wrong type or out of range) or disagrees with the registry's architecture."""
    if not config.get("architectures"):
        raise DownloadError(f"{where}: config.json has no 'architectures'; this is not a causal-LM checkpoint")
    try:
        got = hub_architecture(config)
        trtllm_config_fields(config)  # the numbers calibration's export reads too
    except UnusableConfigField as exc:
        raise DownloadError(f"{where}: {exc}; check the repo/revision") from None
    except UnsupportedArchitecture as exc:
        raise DownloadError(f"{where}: {exc}; this pipeline builds only those families") from None
    for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                 "vocab_size", "max_position_embeddings", "tie_word_embeddings", "rope_theta"):
        want, found = getattr(arch, name), getattr(got, name)
        if want != found:
            raise DownloadError(
                f"{where}: config.json {HF_KEYS.get(name, name)}={found} does not match the registry's {want} for "
                f"model '{model}'; fix the registry entry (or --models-file) or the repo/revision"
            )
    for key in ("family", "num_experts", "experts_per_token"):
        if getattr(got, key) != getattr(arch, key):
            raise DownloadError(
                f"{where}: config.json gives {key}={getattr(got, key)} but the registry says {getattr(arch, key)} "
                f"for model '{model}'; fix the registry entry (or --models-file) or the repo/revision"
            )


def check_head_config(config: dict[str, Any], entry: ModelEntry, *, where: str) -> None:
    """Raise `DownloadError` unless an EAGLE-3 head's config.json is one TensorRT-LLM 1.2 loads as EAGLE-3
    (`_torch/models/modeling_auto.py` makes the class `EAGLE3<arch>` only when `draft_vocab_size` is present; else
    it would load a plain one-layer model) and has the registry entry's hidden size, vocabulary and draft
    vocabulary (the head reads the target's hidden states and maps its drafts into the target's vocabulary)."""
    assert entry.eagle3 is not None
    if not config.get("architectures"):
        raise DownloadError(f"{where}: config.json has no 'architectures'; this is not a checkpoint")
    if "draft_vocab_size" not in config:
        raise DownloadError(f"{where}: config.json has no draft_vocab_size, so TensorRT-LLM 1.2 would not load it as "
                            f"an EAGLE-3 head; '{entry.name}' must name an EAGLE-3 head's repo/revision")
    for key, want in (("hidden_size", entry.architecture.hidden_size), ("vocab_size", entry.architecture.vocab_size),
                      ("draft_vocab_size", entry.eagle3.draft_vocab_size)):
        found = config.get(key)
        if found != want or isinstance(found, bool):
            raise DownloadError(f"{where}: config.json {key}={found!r} does not match the registry's {want} for "
                                f"EAGLE-3 head '{entry.name}'; fix the registry entry (or --models-file) or the "
                                "repo/revision")


def check_model_config(model_dir: Path, config: dict[str, Any], entry: ModelEntry, *, where: str) -> None:
    """A downloaded (or generated) config.json against the registry: a model's architecture and tokenizer, or an
    EAGLE-3 head's own rule (`check_head_config`: no tokenizer, its target's)."""
    if entry.is_eagle3_head:
        check_head_config(config, entry, where=where)
        return
    check_architecture(config, entry.architecture, where=where, model=entry.name)
    check_tokenizer_size(model_dir, config, entry, where=where)


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check_file(path: Path, meta: dict[str, Any]) -> str | None:
    """None when `path` matches the Hub's metadata, else a short reason."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if meta.get("size") is not None and size != meta["size"]:
        return f"size {size} != {meta['size']}"
    if meta.get("lfs_sha256"):
        got = sha256_file(path)
        return None if got == meta["lfs_sha256"] else f"sha256 {got[:12]}… != {meta['lfs_sha256'][:12]}…"
    if meta.get("blob_id"):
        got = _git_blob_sha1(path)
        return None if got == meta["blob_id"] else f"git sha1 {got[:12]}… != {meta['blob_id'][:12]}…"
    return None


def _with_mtimes(root: Path, m: DownloadManifest) -> DownloadManifest:
    """`m` with the files' current mtimes recorded (after their bytes were checked)."""
    files = {n: r.model_copy(update={"mtime_ns": (root / n).stat().st_mtime_ns}) for n, r in m.files.items()}
    return m.model_copy(update={"files": files})


def _unchanged(root: Path, m: DownloadManifest) -> bool:
    """Cheap re-use check: exactly the manifest's files, each with its recorded size and mtime."""
    try:
        if {p.name for p in root.iterdir()} != set(m.files) | {MANIFEST}:
            return False
        return bool(m.files) and all(
            (st := (root / n).stat()).st_size == r.size and st.st_mtime_ns == r.mtime_ns and not (root / n).is_symlink()
            for n, r in m.files.items()
        )
    except OSError:
        return False


def _remove_extras(root: Path, names: set[str]) -> None:
    """Delete what a download dir holds beyond its files (never part of the pinned snapshot)."""
    for p in root.iterdir():
        if p.name not in names | {MANIFEST}:
            print(f"warning: {p} is not part of the download; removing it", file=sys.stderr)
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


# --------------------------------------------------------------------------------------------------------------
# Generated models


def source_id(manifest: dict[str, Any] | None) -> str | None:
    """The id that names a model source in calibration keys, from its directory's manifest: the Hub commit of a
    download, or for a generated model its generation key cut to a commit's length. None without a manifest.

    The only place the id is derived: `download_model` records it and `calibrate` reads it back from a directory.
    """
    if not manifest:
        return None
    if manifest.get("sha"):
        return str(manifest["sha"])
    return str(manifest["key"])[:40] if manifest.get("key") else None


def check_tokenizer_size(model_dir: Path, config: dict[str, Any], entry: ModelEntry, *, where: str) -> int:
    """The downloaded tokenizer's size, checked against the entry's declared `tokenizer_size` (when set) and the
    checkpoint's `vocab_size` (a padded embedding may be larger, never smaller); returns it.

    Raises:
        DownloadError: either disagrees (exit 2: the registry entry or the repo/revision is wrong).
    """
    try:
        tokens = token_count(model_dir)
    except PipelineError as exc:
        raise DownloadError(f"{where}: {exc}") from None
    if entry.tokenizer_size is not None and tokens != entry.tokenizer_size:
        raise DownloadError(
            f"{where}: the tokenizer has {tokens} tokens but the registry declares tokenizer_size "
            f"{entry.tokenizer_size} for model '{entry.name}'; fix the registry entry (or --models-file) or the "
            "repo/revision")
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and tokens > vocab:
        raise DownloadError(
            f"{where}: the tokenizer has {tokens} tokens, more than config.json's vocab_size {vocab} (ids past it have "
            f"no embedding) for model '{entry.name}'; pick a repo/revision whose tokenizer matches its weights")
    return tokens


def _generated_hint(entry: ModelEntry) -> str:
    return (f"`invoke download --model {entry.name} --verify` or `invoke build --force download` regenerates it")


def _download_generated(entry: ModelEntry, verify: bool, check_only: bool) -> DownloadResult:
    path = tinymodel.model_dir(entry.name)
    remove_stale_temps(path)  # a killed generation's temporary, even when this run finds the model current
    gen = GeneratedManifest.read(path) if path.is_dir() else None
    if gen is not None and gen.key != tinymodel.generation_key(entry.name):
        gen = None  # another generator's output: generated again
    if check_only and gen is None:
        raise DownloadError(f"{entry.name} has not been generated in {path.parent}; run `invoke build` first",
                            path=path)
    problems = gen.problems(path, full=verify) if gen is not None else []
    if problems and (check_only or not verify):
        raise integrity_error(path, problems, fix=_generated_hint(entry))
    status: Literal["built", "cached"] = "cached" if gen is not None and not problems else "built"
    if gen is None or problems:
        if problems:
            print(f"warning: generated model {entry.name} in {path} is corrupt; regenerating", file=sys.stderr)
            with stage_lock(path):
                shutil.rmtree(path, ignore_errors=True)
        path = tinymodel.ensure_tiny_model(entry.name)
        gen = GeneratedManifest.read(path)
        if gen is None:
            raise integrity_error(path, ["manifest.json is missing"], fix=_generated_hint(entry))
    config = json.loads((path / "config.json").read_text())
    check_model_config(path, config, entry, where=f"{entry.repo_id} (generated)")
    sha = source_id(gen.model_dump())
    manifest = DownloadManifest(
        key=stage_key({"repo_id": entry.repo_id, "sha": sha, "files": {k: v.sha256 for k, v in gen.files.items()}}),
        model=entry.name,
        repo_id=entry.repo_id,
        revision=entry.revision,
        sha=sha,
        source="generated",
        generator_version=gen.generator_version,
        files=gen.files,
        total_bytes=sum(v.size for v in gen.files.values()),
    )
    return DownloadResult(path, manifest, status)


# --------------------------------------------------------------------------------------------------------------
# Hub downloads


def download_dir(entry: ModelEntry) -> Path:
    """Where `entry`'s downloads live: one directory per pinned commit below it (a generated model's own dir)."""
    return tinymodel.model_dir(entry.name) if entry.source == "generated" else _repo_dir(entry.repo_id)


def _repo_dir(repo_id: str) -> Path:
    try:
        check_repo_id(repo_id)
    except ValueError as exc:
        raise DownloadError(f"repo_id: {exc}; fix the registry entry (your own via --models-file)") from None
    return safe_join(cache_dir() / "downloads", repo_id.replace("/", "--"))


def allow_patterns(entry: ModelEntry) -> tuple[str, ...]:
    """The file patterns fetched for `entry` (an EAGLE-3 head may also have its pickled weights)."""
    return (*ALLOW_PATTERNS, HEAD_PICKLE) if entry.is_eagle3_head else ALLOW_PATTERNS


def _select(siblings: list[Any], *, where: str, head: bool = False) -> dict[str, dict[str, Any]]:
    """Pick the files the pipeline needs from the Hub's sibling list; name -> {size, lfs_sha256, blob_id}.
    `head`: an EAGLE-3 head's rule (safetensors or, failing those, an LFS `pytorch_model.bin`; no tokenizer)."""
    out = {}
    patterns = (*ALLOW_PATTERNS, HEAD_PICKLE) if head else ALLOW_PATTERNS
    for s in siblings or []:
        name = s.rfilename
        if "/" not in name and any(fnmatch.fnmatchcase(name, p) for p in patterns):
            out[name] = {
                "size": s.lfs.size if s.lfs else s.size,
                "lfs_sha256": s.lfs.sha256 if s.lfs else None,
                "blob_id": s.blob_id,
            }
    safetensors = any(n.endswith(".safetensors") for n in out)
    if head and safetensors:
        out.pop(HEAD_PICKLE, None)  # the safe format when the revision has both
    if HEAD_PICKLE in out and not out[HEAD_PICKLE]["lfs_sha256"]:
        raise DownloadError(f"{where}/{HEAD_PICKLE} is not an LFS file, so the Hub gives no sha256 to verify it "
                            "against; pick a revision with safetensors weights")
    missing = [n for n in ("config.json",) if n not in out]
    if not safetensors and HEAD_PICKLE not in out:
        missing.append(f"*.safetensors or {HEAD_PICKLE}" if head else "*.safetensors")
    if not head and not any(n in out for n in ("tokenizer.json", "tokenizer.model")):
        missing.append("tokenizer.json")
    if missing:
        needs = ("an EAGLE-3 head needs config.json and its weights" if head else
                 "the pipeline needs safetensors weights, config and tokenizer files")
        raise DownloadError(f"{where} has no {', '.join(missing)}; {needs}: pick a revision that has them")
    return out


class _HubErrors:
    """Translate huggingface_hub/requests exceptions into one-line `DownloadError`s (never mentioning the token)."""

    def __init__(self, entry: ModelEntry, revision: str, endpoint: str, have_token: bool):
        self.entry, self.revision, self.endpoint, self.have_token = entry, revision, endpoint, have_token

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or isinstance(exc, DownloadError):
            return False
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        repo, url = self.entry.repo_id, f"{self.endpoint}/{self.entry.repo_id}"
        if isinstance(exc, GatedRepoError):
            msg = _gated_message(repo, url, self.have_token)
        elif isinstance(exc, RevisionNotFoundError):
            msg = (f"revision '{self.revision}' does not exist in {repo}; fix 'revision' in the registry or pass "
                   "--revision with an existing branch, tag or commit")
        elif isinstance(exc, RepositoryNotFoundError):
            msg = (f"repo {repo} was not found on {self.endpoint} (or it is private); fix 'repo_id' in the registry"
                   + ("" if self.have_token else " or set HF_TOKEN for a private repo"))
        elif isinstance(exc, EntryNotFoundError):
            msg = (f"a file listed in {repo}@{self.revision} could not be fetched (404: {_url_tail(exc)}); "
                   "pin another revision or retry later")
        elif isinstance(exc, OfflineModeIsEnabled):
            msg = "HF_HUB_OFFLINE=1 forbids network access; pass --offline to use the cache or unset HF_HUB_OFFLINE"
        elif _connection_lost(exc):
            msg = (f"cannot reach {self.endpoint} to fetch {repo} ({type(exc).__name__}); check the network, or use "
                   "--offline with a previous download; re-running resumes partial files")
        elif isinstance(exc, HfHubHTTPError):
            code = exc.response.status_code if exc.response is not None else "?"
            msg = f"the Hub answered HTTP {code} for {repo}@{self.revision}; retry later or check the endpoint"
        else:
            return False
        raise DownloadError(msg) from None


def _gated_message(repo: str, url: str, have_token: bool) -> str:
    if have_token:
        return f"{repo} is a gated repo and your Hugging Face token has no access to it; request access at {url}"
    return (f"{repo} is a gated repo and no Hugging Face token was found; accept its license at {url}, "
            "then set HF_TOKEN or run `hf auth login`")


def _url_tail(exc: Exception) -> str:
    resp = getattr(exc, "response", None)
    url = getattr(resp, "url", None) or ""
    return url.rsplit("/", 1)[-1] or "?"


_HASH_THREADS = 2  # files hashed from disk at once (resumed downloads, non-LFS files, --verify)


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _verify_staging(staging: Path, files: dict[str, dict[str, Any]], verified: dict[str, Any],
                    streams: dict[str, tuple[str | None, Any]] | None = None) -> dict[str, str]:
    """Check every file not yet verified (or changed since): by the sha256 computed while it was written
    (`streams`: name -> (digest, stat key right after the write)) when there is one, else hashed from disk.
    Records the good ones in `verified`; returns name -> reason for the bad ones."""
    from concurrent.futures import ThreadPoolExecutor

    streams = streams or {}
    bad, to_hash = {}, []
    for name, meta in files.items():
        key = _stat_key(staging / name)
        digest, written = streams.get(name, (None, None))
        if key is None:
            bad[name] = "missing"
        elif verified.get(name) == key:
            continue
        elif meta.get("size") is not None and key[1] != meta["size"]:
            bad[name] = f"size {key[1]} != {meta['size']}"
        elif meta.get("lfs_sha256") and digest is not None and written == key:
            if digest == meta["lfs_sha256"]:
                verified[name] = key
            else:
                bad[name] = f"sha256 {digest[:12]}… != {meta['lfs_sha256'][:12]}…"
        else:
            to_hash.append((name, key))
    with ThreadPoolExecutor(max_workers=_HASH_THREADS) as pool:
        reasons = list(pool.map(lambda nk: _check_file(staging / nk[0], files[nk[0]]), to_hash))
    for (name, key), reason in zip(to_hash, reasons):
        if reason:
            bad[name] = reason
        else:
            verified[name] = key
    return bad


def _connection_lost(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError))


def _fetch_round(snap: Snapshot, names: list[str], staging: Path, *, hub: HubAccess, headers: dict[str, str],
                 streams: dict[str, tuple[str | None, Any]]) -> BaseException | None:
    """Fetch `names` into `staging` in parallel (largest first), recording each file's streamed sha256 in
    `streams`; returns the first lost connection (those files resume next round), raises any other error."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import tqdm

    files = snap.files
    bar = tqdm(total=sum(files[n]["size"] or 0 for n in names), unit="B", unit_scale=True,
               desc=f"Fetching {len(names)} files", name="huggingface_hub.snapshot_download")

    def one(name: str) -> tuple[str | None, Any]:
        url = hf_hub_url(snap.entry.repo_id, name, revision=snap.sha, endpoint=hub.endpoint)
        digest = fetch_file(url, staging / name, headers=headers, size=files[name]["size"], progress=bar.update)
        return digest, _stat_key(staging / name)

    lost = None
    with bar, ThreadPoolExecutor(max_workers=max(1, hub.max_workers)) as pool:
        jobs = {pool.submit(one, n): n for n in sorted(names, key=lambda n: -(files[n]["size"] or 0))}
        for job in as_completed(jobs):
            exc = job.exception()
            if exc is None:
                streams[jobs[job]] = job.result()
            elif _connection_lost(exc):
                lost = lost or exc
            else:
                pool.shutdown(cancel_futures=True)
                raise exc
    return lost


def _fetch_verified(snap: Snapshot, staging: Path, *, hub: HubAccess, errors: _HubErrors) -> list[str]:
    """Fetch every file `staging` lacks until each matches its oid; returns the names fetched again."""
    from huggingface_hub.utils import build_hf_headers

    files = snap.files
    headers = build_hf_headers(token=hub.token or False)
    staging.mkdir(parents=True, exist_ok=True)
    refetched: list[str] = []
    bad: dict[str, str] = {}
    verified: dict[str, Any] = {}
    streams: dict[str, tuple[str | None, Any]] = {}
    for attempt in range(1, _ATTEMPTS + 1):
        todo = [n for n in files if not (staging / n).is_file()]
        with errors:
            lost = _fetch_round(snap, todo, staging, hub=hub, headers=headers, streams=streams)
            if lost is not None and attempt == _ATTEMPTS:
                raise lost
        if lost is not None:
            print(f"warning: connection to {hub.endpoint} lost while fetching {snap.entry.repo_id}; resuming",
                  file=sys.stderr)
            continue
        bad = _verify_staging(staging, files, verified, streams)
        if not bad:
            return refetched
        for name, reason in bad.items():
            print(f"warning: {snap.where}/{name} failed verification ({reason}); fetching it again",
                  file=sys.stderr)
            (staging / name).unlink(missing_ok=True)
            refetched.append(name)
    name, reason = next(iter(bad.items()))
    raise DownloadError(f"{snap.where}/{name} still fails verification after {_ATTEMPTS} fetches "
                        f"({reason}); the server or a proxy is serving corrupt data, retry later")


def is_cached(entry: ModelEntry, *, revision: str | None = None, update: bool = False,
              lock_file: Path | None = None) -> bool:
    """Whether `download_model` would reuse a finished download without fetching anything: a current generated
    model, or a commit pinned (or locked) whose directory still matches its manifest's sizes and mtimes. Reads
    manifests and stats only."""
    if entry.source == "generated":
        path = tinymodel.model_dir(entry.name)
        gen = GeneratedManifest.read(path) if path.is_dir() else None
        return gen is not None and gen.key == tinymodel.generation_key(entry.name)
    requested = revision or entry.revision
    lock_path = Path(lock_file) if lock_file else lock_file_path()
    sha = requested if _SHA_RE.match(requested) else (None if update else locked_sha(lock_path, entry, requested))
    if sha is None:
        return False
    final = _repo_dir(entry.repo_id) / sha
    m = _read(final)
    return m is not None and _unchanged(final, m)


def download_model(
    entry: ModelEntry,
    *,
    revision: str | None = None,
    update: bool = False,
    offline: bool = False,
    verify: bool = False,
    hub: HubAccess = HubAccess(),
    lock_file: Path | None = None,
    check_only: bool = False,
) -> DownloadResult:
    """Acquire `entry`'s checkpoint as a verified local HF-format directory (generated models: the generator's).

    Args:
        entry: registry entry (repo id, requested revision, architecture to cross-check).
        revision: branch, tag or commit overriding the registry's.
        update: re-resolve a branch/tag to its current commit instead of using the lock file.
        offline: no network; use a previous download (HF_HUB_OFFLINE=1 implies it).
        verify: re-hash every file of an existing download (corrupt files are fetched again when online).
        hub: the Hub's URL, the token and the parallel file downloads.
        lock_file: revision lock file (default `<output root>/models.lock.json`).
        check_only: return the existing download (offline) or fail; never fetch or generate anything.

    Raises:
        DownloadError: unreachable Hub, gated/missing repo, revision or file, corrupt data, config mismatch, or an
            offline request for something not downloaded before.
        IntegrityError: a generated model no longer matches its manifest (exit 3).
    """
    if entry.source == "generated":
        if revision not in (None, entry.revision):
            raise DownloadError(f"--revision {revision}: {entry.name} is generated locally and has no Hub revisions; "
                                "drop --revision")
        return _download_generated(entry, verify, check_only)

    from huggingface_hub import constants

    offline = offline or constants.HF_HUB_OFFLINE or check_only
    if offline and update:
        raise DownloadError("--update needs the network to re-resolve the revision; drop --offline")
    requested = revision or entry.revision
    endpoint = (hub.endpoint or constants.ENDPOINT).rstrip("/")
    lock_path = Path(lock_file) if lock_file else lock_file_path()
    repo_dir = _repo_dir(entry.repo_id)

    sha = requested if _SHA_RE.match(requested) else (None if update else locked_sha(lock_path, entry, requested))
    if offline:
        return _offline(entry, requested, sha, repo_dir, verify)

    if sha is not None:  # pinned: a finished, unchanged download needs no network at all
        m = _read(repo_dir / sha)
        if m and not verify and _unchanged(repo_dir / sha, m):
            return DownloadResult(repo_dir / sha, m, "cached")

    from huggingface_hub import HfApi, get_token

    token = hub.token or get_token()
    hub = replace(hub, endpoint=endpoint, token=token)
    if entry.gated and not token:  # the registry knows it is gated: fail before any request
        raise DownloadError(_gated_message(entry.repo_id, f"{endpoint}/{entry.repo_id}", False))
    errors = _HubErrors(entry, requested, endpoint, have_token=bool(token))
    api = HfApi(endpoint=endpoint, token=token or False)
    snap = _resolve_files(api, errors, entry, requested, sha, lock_path, endpoint)
    return _fetch_download(snap, repo_dir, verify=verify, hub=hub, errors=errors)


def _resolve_files(api: Any, errors: _HubErrors, entry: ModelEntry, requested: str, sha: str | None,
                   lock_path: Path, endpoint: str) -> Snapshot:
    """The commit and the files to fetch, from the Hub; an unpinned revision is resolved and written to the lock
    file."""
    with errors:
        info = api.model_info(entry.repo_id, revision=sha or requested, files_metadata=True)
    if sha is None:
        sha = info.sha
        if not sha or not _SHA_RE.match(sha):
            raise DownloadError(f"{endpoint} returned no commit SHA for {entry.repo_id}@{requested}; retry later")
        write_lock(lock_path, entry, requested, sha)
    return Snapshot(entry, requested, sha, _select(info.siblings, where=f"{entry.repo_id}@{sha[:12]}",
                                                   head=entry.is_eagle3_head))


def _fetch_download(snap: Snapshot, repo_dir: Path, *, verify: bool, hub: HubAccess,
                    errors: _HubErrors) -> DownloadResult:
    """Reuse `<repo_dir>/<sha>` when it still matches the snapshot's files; otherwise fetch what is missing into a
    staging dir, verify it and publish it atomically."""
    final = repo_dir / snap.sha
    staging = repo_dir / f".partial-{snap.sha}"
    with stage_lock(final):
        reused = _reuse_or_stage(final, staging, snap.files, where=snap.where, verify=verify)
        if reused is not None:
            return reused
        t0 = time.monotonic()
        refetched = _fetch_verified(snap, staging, hub=hub, errors=errors)
        manifest = _finish_staging(snap, staging, refetched=refetched, seconds=time.monotonic() - t0)
        os.replace(staging, final)
    return DownloadResult(final, manifest, "built")


def _reuse_or_stage(final: Path, staging: Path, files: dict[str, dict[str, Any]], *, where: str,
                    verify: bool) -> DownloadResult | None:
    """Reuse a finished download that still matches the Hub's file list (re-hashing with `verify`); otherwise move
    what is still good into `staging` (files that failed verification lose their local metadata, so they are
    fetched again) and return None."""
    m = _read(final)
    if m and not verify and _unchanged(final, m):
        return DownloadResult(final, m, "cached")
    if m:
        _remove_extras(final, set(m.files))
        bad = _verify_staging(final, files, {})
        if not bad and set(m.files) == set(files):
            m = _with_mtimes(final, m)
            m.write(final)
            return DownloadResult(final, m, "cached")
        for name, reason in bad.items():
            print(f"warning: {where}/{name} in {final} failed verification ({reason}); fetching it again",
                  file=sys.stderr)
        shutil.rmtree(staging, ignore_errors=True)
        os.replace(final, staging)
        (staging / "manifest.json").unlink(missing_ok=True)
        for name in bad:
            (staging / name).unlink(missing_ok=True)
    elif final.exists():  # a directory without a manifest is not ours to trust
        shutil.rmtree(final)
    return None


def _finish_staging(snap: Snapshot, staging: Path, *, refetched: list[str], seconds: float) -> DownloadManifest:
    """Check the fetched config against the registry, drop everything not in the snapshot's files, write the
    manifest."""
    entry, files, sha, where = snap.entry, snap.files, snap.sha, snap.where
    config = read_config(staging / "config.json", where=where)
    check_model_config(staging, config, entry, where=where)
    for extra in {p.name for p in staging.iterdir()} - set(files):
        p = staging / extra
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    table = {n: {"sha256": files[n]["lfs_sha256"] or sha256_file(staging / n), "size": files[n]["size"],
                 "mtime_ns": (staging / n).stat().st_mtime_ns} for n in sorted(files)}
    manifest = DownloadManifest(
        key=stage_key({"repo_id": entry.repo_id, "sha": sha, "files": {n: t["sha256"] for n, t in table.items()}}),
        model=entry.name,
        repo_id=entry.repo_id,
        revision=snap.requested,
        sha=sha,
        source="hub",
        allow_patterns=list(allow_patterns(entry)),
        files=table,
        total_bytes=sum(t["size"] for t in table.values()),
        refetched=refetched,
        seconds=round(seconds, 2),
    )
    manifest.write(staging)
    return manifest


def _read(final: Path) -> DownloadManifest | None:
    """The manifest of a finished download; None when there is none or it is unusable (it is then re-verified)."""
    try:
        return DownloadManifest.read(final) if final.is_dir() else None
    except IntegrityError:
        return None


def _offline(entry: ModelEntry, requested: str, sha: str | None, repo_dir: Path, verify: bool) -> DownloadResult:
    """Re-use a previous download with no network; fail clearly when there is none or it is damaged."""
    if sha is None:  # no lock entry: the newest finished download of the same requested revision
        found = []
        for d in repo_dir.glob("*") if repo_dir.is_dir() else []:
            m = _read(d) if _SHA_RE.match(d.name) else None
            if m and m.revision == requested:
                found.append(((d / MANIFEST).stat().st_mtime_ns, d.name))
        sha = max(found)[1] if found else None
    m = _read(repo_dir / sha) if sha else None
    if sha is None or m is None:
        raise DownloadError(f"offline: {entry.repo_id}@{requested} has not been downloaded to {cache_dir()}; "
                            f"run `invoke download --model {entry.name}` with network access first")
    final = repo_dir / sha
    unchanged = _unchanged(final, m)
    if (verify or not unchanged) and m.problems(final, full=True):
        raise DownloadError(f"offline: the download of {entry.repo_id}@{sha[:12]} in {final} is incomplete or "
                            f"corrupt; re-run `invoke download --model {entry.name} --verify` (or `invoke build "
                            "--verify-download`) with network access", path=final)
    if not unchanged:  # same bytes, new timestamps (copied cache): remember them
        with stage_lock(final):
            m = _with_mtimes(final, m)
            m.write(final)
    return DownloadResult(final, m, "cached")


class DownloadStage:
    """The download stage of a build (`download_model` for the target and the draft): a cache found by each model's
    pinned revision, so it has no build ref; `locate` asks it check-only (offline, nothing fetched)."""

    name = "download"

    def identity(self, spec: BuildSpec) -> None:
        return None

    def doing(self, spec: BuildSpec) -> str:
        """Each model is either cached (checked from manifests and stats) or fetched."""
        return " + ".join(f"{e.repo_id}@{e.revision} cached" if is_cached(e) else f"fetching {e.repo_id}@{e.revision}"
                          for e in (spec.model, spec.draft_model) if e)

    def locate(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions) -> None:
        self._fetch(spec, outputs, options, force=False, check_only=True)

    def run(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions, *, force: bool) -> StageOutcome:
        self._fetch(spec, outputs, options, force=force, check_only=False)
        found = (outputs.download, outputs.draft_download)
        detail = " ".join(f"{r.manifest.model}@{r.manifest.sha[:12]}" for r in found if r)
        return outcome("download", {"model": outputs.download, "draft": outputs.draft_download}, detail)

    @staticmethod
    def _fetch(spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions, *, force: bool,
               check_only: bool) -> None:
        for role, entry in (("model", spec.model), ("draft", spec.draft_model)):
            if entry is None:
                continue
            res = download_model(
                entry, revision=(options.revision or None) if role == "model" else None,
                offline=options.offline, update=options.update and not check_only,
                verify=options.verify_download or options.verify or force, check_only=check_only,
                hub=HubAccess(endpoint=options.endpoint, token=options.token))
            if role == "model":
                outputs.download = res
            else:
                outputs.draft_download = res


DOWNLOAD = DownloadStage()
