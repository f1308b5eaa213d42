"""`--model hf:ORG/NAME[@REVISION]`: a registry entry built from the repo's `config.json` alone, before any weights.

The file is fetched with huggingface_hub's `hf_hub_download` (into `$PIPELINE_CACHE/hub-configs`, so a second run and
`HF_HUB_OFFLINE=1` reuse it), size-capped, parsed, and turned into architecture numbers by the family adapters
(`pipeline.core.architectures.architecture_fields`), which refuse a class no family covers. Gated repos take the
token the download stage takes (`HF_TOKEN` or `hf auth login`); it is never logged.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pipeline.core.architectures import UnsupportedArchitecture, architecture_fields
from pipeline.core.errors import RegistryError

PREFIX = "hf:"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; refuse anything that is not one
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")


def parse_ref(ref: str) -> tuple[str, str]:
    """`hf:ORG/NAME[@REVISION]` -> (repo id, revision, default "main").

    Raises:
        RegistryError: not a Hub repo id or revision.
    """
    from pipeline.core.registry import check_repo_id

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


def fetch_config(repo_id: str, revision: str, *, endpoint: str | None = None, token: str | None = None) -> dict:
    """The repo's `config.json` at `revision`, fetched alone.

    Raises:
        RegistryError: unreachable, missing, gated without access, too large or not JSON (one line each).
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
        path = Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=_cache_dir(),
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
        raise RegistryError(f"cannot fetch config.json of {where} from {endpoint} ({type(exc).__name__}); check "
                            "the network, or unset HF_HUB_OFFLINE") from None
    except EntryNotFoundError:
        raise RegistryError(f"{where} has no config.json; it is not a transformers model repo") from None
    except OSError as exc:
        raise RegistryError(f"cannot fetch config.json of {where} from {endpoint} ({type(exc).__name__}); check "
                            "the network, or unset HF_HUB_OFFLINE") from None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise RegistryError(f"config.json of {where} is over {MAX_CONFIG_BYTES} bytes; it is not a model config")
    try:
        config = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RegistryError(f"config.json of {where} is not JSON; it is not a transformers model repo") from None
    if not isinstance(config, dict):
        raise RegistryError(f"config.json of {where} is not a JSON object")
    return config


def hub_entry_fields(ref: str, *, endpoint: str | None = None, token: str | None = None) -> dict[str, Any]:
    """`registry.ModelEntry` fields for `hf:ORG/NAME[@REVISION]`, numbers from its config.json.

    Raises:
        RegistryError: the ref, the fetch or the architecture is unusable (the message names the supported
            architectures when the class is the problem).
    """
    repo_id, revision = parse_ref(ref)
    config = fetch_config(repo_id, revision, endpoint=endpoint, token=token)
    try:
        arch = architecture_fields(config)
    except UnsupportedArchitecture as exc:
        raise RegistryError(f"--model {ref}: {exc}") from None
    return {"name": entry_name(repo_id), "repo_id": repo_id, "revision": revision, "source": "hub",
            "tokenizer_family": f"hf:{repo_id}", "architecture": arch}
