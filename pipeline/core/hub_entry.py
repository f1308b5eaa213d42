"""`--model hf:ORG/NAME[@REVISION]`: a registry entry built from the repo's `config.json` alone, before any weights.

The file is fetched with huggingface_hub's `hf_hub_download` (into `$PIPELINE_CACHE/hub-configs`, so a second run and
`HF_HUB_OFFLINE=1` reuse it), size-capped, parsed, and turned into architecture numbers by the family adapters
(`pipeline.core.registry.hub_architecture`), which refuse a class no family covers and a number of the wrong type or
out of range. Gated repos take the token the download stage takes (`HF_TOKEN` or `hf auth login`); it is never
logged. A draft pair with an `hf:` model compares the two repos' `tokenizer.json` (fetched alone the same way)
instead of a declared tokenizer family.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pipeline.core.architectures import UnsupportedArchitecture, UnusableConfigField
from pipeline.core.errors import PipelineError, RegistryError, SpecError
from pipeline.core.manifests import TokenizerIdentity
from pipeline.core.model_entry import check_repo_id, hub_architecture
from pipeline.core.tokenizer import identity, token_count
from pipeline.core.untrusted import parse_json, read_bytes

PREFIX = "hf:"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; refuse anything that is not one
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")


def parse_ref(ref: str) -> tuple[str, str]:
    """`hf:ORG/NAME[@REVISION]` -> (repo id, revision, default "main").

    Raises:
        RegistryError: not a Hub repo id or revision.
    """
    body = ref[len(PREFIX):]
    repo, _, revision = body.partition("@")
    try:
        check_repo_id(repo)
    except ValueError as exc:
        raise RegistryError(f"--model {ref}: {exc}; use hf:ORG/NAME[@REVISION]") from None
    revision = revision or "main"
    if not _REVISION.match(revision) or ".." in revision:
        raise RegistryError(f"--model {ref}: revision {revision!r} is not a branch, tag or commit; "
                            "use hf:ORG/NAME@REVISION")
    return repo, revision


def entry_name(repo_id: str) -> str:
    """The build-id-safe name of a Hub model: 'hf-ORG--NAME' (one path component; repo ids never hold '--')."""
    return "hf-" + repo_id.replace("/", "--")


def _cache_dir() -> Path:
    root = os.environ.get("PIPELINE_CACHE") or str(Path.home() / ".cache" / "trtllm-pipeline")
    return Path(root) / "hub-configs"


def read_config(path: Path, *, where: str) -> dict[str, Any]:
    """A Hub `config.json`: a regular file of at most `MAX_CONFIG_BYTES` holding a JSON object within the limits of
    `pipeline.core.untrusted`.

    Raises:
        RegistryError: not such a file, not JSON or not an object (one line each).
    """
    what, fix = f"config.json of {where}", f"it is not a model config; delete {path} and check the repo"
    try:
        config = parse_json(read_bytes(path, cap=MAX_CONFIG_BYTES, what=what, fix=fix, error=RegistryError),
                            what=what, fix=fix, error=RegistryError)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RegistryError(f"{what} is not JSON; it is not a transformers model repo") from None
    if not isinstance(config, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return config


def _fetch_file(repo_id: str, revision: str, filename: str, *, endpoint: str | None, token: str | None,
                missing: str) -> Path:
    """One file of the repo at `revision`, fetched alone into the hub-configs cache; `missing` is the error when
    the repo has no such file.

    Raises:
        RegistryError: unreachable, missing, gated without access (one line each).
    """
    from huggingface_hub import constants, get_token, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    token = token or get_token()
    where = f"{repo_id}@{revision}"
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=_cache_dir(),
                                    endpoint=endpoint, token=token or False))
    except GatedRepoError:
        access = "your Hugging Face token has no access to it" if token else "no Hugging Face token was found"
        raise RegistryError(f"{repo_id} is a gated repo and {access}; accept its license at {endpoint}/{repo_id}, "
                            "then set HF_TOKEN or run `hf auth login`") from None
    except RevisionNotFoundError:
        raise RegistryError(f"revision '{revision}' does not exist in {repo_id}; pass hf:{repo_id}@REVISION "
                            "with an existing branch, tag or commit") from None
    except RepositoryNotFoundError:
        raise RegistryError(f"repo {repo_id} was not found on {endpoint} (or it is private); check the name"
                            + ("" if token else " or set HF_TOKEN")) from None
    except LocalEntryNotFoundError as exc:  # a subclass of EntryNotFoundError: offline without a cached copy
        raise RegistryError(f"cannot fetch {filename} of {where} from {endpoint} ({type(exc).__name__}); check "
                            "the network, or unset HF_HUB_OFFLINE") from None
    except EntryNotFoundError:
        raise RegistryError(missing) from None
    except OSError as exc:
        raise RegistryError(f"cannot fetch {filename} of {where} from {endpoint} ({type(exc).__name__}); check "
                            "the network, or unset HF_HUB_OFFLINE") from None


def hub_tokenizer(repo_id: str, revision: str) -> tuple[TokenizerIdentity, int]:
    """(identity, token count) of the repo's `tokenizer.json` at `revision`, fetched alone (no weights).

    Raises:
        RegistryError: the repo has none, it cannot be fetched, or it is not a tokenizer.
    """
    where = f"{repo_id}@{revision}"
    path = _fetch_file(repo_id, revision, "tokenizer.json", endpoint=None, token=None,
                       missing=f"{where} has no tokenizer.json, so its tokenizer cannot be compared before download; "
                               "declare the pair in a --models-file with one tokenizer_family")
    try:
        return identity(path.parent), token_count(path.parent)
    except PipelineError as exc:
        raise RegistryError(f"tokenizer.json of {where}: {exc}") from None


def tokenizer_mismatch(target: Any, draft: Any) -> str | None:
    """None when the Hub tokenizers of `target` and `draft` (`registry.ModelEntry`, source hub) give the same
    token ids (tokenizer.json's id sections and size), else why not.

    Raises:
        RegistryError: a tokenizer cannot be fetched, or an entry is generated locally (no Hub tokenizer).
    """
    found = []
    for entry in (target, draft):
        if entry.source != "hub":
            raise RegistryError(f"{entry.name} is generated locally: its tokenizer cannot be compared with a Hub "
                                "model's; pair hf: models with Hub models")
        found.append(hub_tokenizer(entry.repo_id, entry.revision))
    (t_id, t_n), (d_id, d_n) = found
    if t_id == d_id and t_n == d_n:
        return None
    return (f"tokenizer.json {d_id.sha256[:12]} ({d_n} tokens) vs {target.name}'s {t_id.sha256[:12]} "
            f"({t_n} tokens)")


def check_hub_tokenizers(target: Any, draft: Any) -> None:
    """Where the draft or the target is an `hf:` model (no tokenizer family declared), their Hub tokenizer.json files
    (fetched alone, before any weights) must give the same token ids.

    Raises:
        SpecError: they differ. RegistryError: a tokenizer cannot be fetched.
    """
    if PREFIX not in (target.tokenizer_family[:3], draft.tokenizer_family[:3]):
        return
    mismatch = tokenizer_mismatch(target, draft)
    if mismatch is not None:
        raise SpecError(f"speculation.draft={draft.name}: its tokenizer differs: {mismatch}; draft and target must "
                        "share one tokenizer")


def hub_entry_fields(ref: str, *, endpoint: str | None = None, token: str | None = None) -> dict[str, Any]:
    """`registry.ModelEntry` fields for `hf:ORG/NAME[@REVISION]`, numbers from its config.json.

    Raises:
        RegistryError: the ref, the fetch or the architecture is unusable (the message names the supported
            architectures when the class is the problem).
    """
    repo_id, revision = parse_ref(ref)
    where = f"{repo_id}@{revision}"
    path = _fetch_file(repo_id, revision, "config.json", endpoint=endpoint, token=token,
                       missing=f"{where} has no config.json; it is not a transformers model repo")
    config = read_config(path, where=where)
    try:
        arch = hub_architecture(config)
    except UnusableConfigField as exc:
        raise RegistryError(f"--model {ref}: {exc}; check the repo, or delete the cached copy {path} if it is "
                            "stale") from None
    except UnsupportedArchitecture as exc:
        raise RegistryError(f"--model {ref}: {exc}") from None
    return {"name": entry_name(repo_id), "repo_id": repo_id, "revision": revision, "source": "hub",
            "tokenizer_family": f"hf:{repo_id}", "architecture": arch}
