"""Download stage against a local Hub server (tests/support/hubserver.py), fetched over huggingface_hub's public HTTP session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import DownloadError
from pipeline.core.manifests import StageResult
from pipeline.core.registry import get_model
from pipeline.stages.download.stage import HubAccess, download_model, lock_file_path, read_lock
from tests.support.hubserver import LocalHub, serve_directory

REPO = Path(__file__).resolve().parents[3]
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
TOKEN = "hf_test_secret_token_123"


def _entry(repo_id="test-org/tiny", **kw):
    return get_model("tiny-llama").model_copy(update={"name": "hub-tiny", "repo_id": repo_id, "source": "hub", **kw})


def _config(**override) -> bytes:
    cfg = get_model("tiny-llama").architecture.hf_config()
    return json.dumps({**cfg, **override}).encode()


def _tokenizer_json(n: int = 4) -> bytes:
    """A real tokenizer.json of `n` tokens (WordLevel), small enough to serve."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    return Tokenizer(WordLevel({"<unk>": 0, **{f"t{i}": i for i in range(1, n)}}, unk_token="<unk>")).to_str().encode()


def _files(seed: int = 0, **override) -> dict[str, bytes]:
    rnd = __import__("random").Random(seed)
    files = {
        "config.json": _config(),
        "generation_config.json": b'{"bos_token_id": 0, "eos_token_id": 1}',
        "tokenizer.json": _tokenizer_json(),
        "tokenizer_config.json": b"{}",
        SHARD1: rnd.randbytes(3_000_000),
        SHARD2: rnd.randbytes(1_000_000),
        "model.safetensors.index.json": b'{"weight_map": {}}',
        "README.md": b"# not needed",
        "original/consolidated.00.pth": b"not needed either",
    }
    files.update(override)
    return {k: v for k, v in files.items() if v is not None}


@pytest.fixture
def env(monkeypatch, tmp_path, hub_online):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256 * 1024)  # small chunks: a cut mid-file leaves bytes
    return tmp_path


@pytest.fixture
def hub(env):
    with LocalHub(tokens={TOKEN}) as server:
        yield server


def _hub_requests(hub) -> int:
    return len(hub.requests)


def test_download_pins_verifies_and_second_run_is_a_noop(hub, env, monkeypatch):
    import pipeline.stages.download.stage as dl

    hashed_from_disk = []
    check = dl._check_file
    monkeypatch.setattr(dl, "_check_file", lambda path, meta: hashed_from_disk.append(path.name) or check(path, meta))
    sha = hub.add_commit("test-org/tiny", _files())
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert not [n for n in hashed_from_disk if n.endswith(".safetensors")]  # LFS files were hashed while streaming
    assert isinstance(res, StageResult) and res.status == "built" and res.manifest.sha == sha
    assert res.path == env / "cache" / "downloads" / "test-org--tiny" / sha
    expected = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", SHARD1, SHARD2,
                "model.safetensors.index.json"}
    assert {p.name for p in res.path.iterdir()} == expected | {"manifest.json"}  # allow_patterns; no .cache left
    files = _files()
    for name in expected:
        assert (res.path / name).read_bytes() == files[name]
    m = res.manifest
    assert m.repo_id == "test-org/tiny" and m.sha == sha and m.revision == "main" and m.source == "hub"
    assert m.files[SHARD1].sha256 == __import__("hashlib").sha256(files[SHARD1]).hexdigest()
    assert json.loads((res.path / "manifest.json").read_text())["key"] == m.key
    assert read_lock(lock_file_path())["models"]["hub-tiny"] == {"repo_id": "test-org/tiny", "revision": "main",
                                                                 "sha": sha}
    # the second run touches no network and no file contents
    before = _hub_requests(hub)
    manifest_mtime = (res.path / "manifest.json").stat().st_mtime_ns
    again = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert again.status == "cached" and again.path == res.path and again.manifest.key == m.key
    assert _hub_requests(hub) == before
    assert (res.path / "manifest.json").stat().st_mtime_ns == manifest_mtime


def test_locked_revision_holds_until_update(hub, env):
    old = hub.add_commit("test-org/tiny", _files(seed=1))
    assert download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint)).manifest.sha == old
    new = hub.add_commit("test-org/tiny", _files(seed=2))  # the branch moves
    assert download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint)).manifest.sha == old
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint), update=True)
    assert res.manifest.sha == new and res.status == "built"
    assert read_lock(lock_file_path())["models"]["hub-tiny"]["sha"] == new
    assert download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint), revision=old).manifest.sha == old  # explicit commit


def test_resume_after_dropped_connection(hub, env, capsys):
    hub.add_commit("test-org/tiny", _files())
    hub.drop[SHARD1] = 1_400_000
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert (res.path / SHARD1).read_bytes() == _files()[SHARD1]
    ranges = hub.file_gets(SHARD1)
    assert ranges[0] is None and len(ranges) == 2 and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert int(ranges[1].split("=")[1].rstrip("-")) > 0  # resumed, not restarted
    assert "resuming" in capsys.readouterr().err


def test_resume_against_a_server_that_ignores_range(hub, env):
    hub.add_commit("test-org/tiny", _files())
    hub.drop[SHARD1] = 1_400_000
    hub.ignore_range = True  # the client must restart the file from byte 0 (and the stream hash with it)
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert (res.path / SHARD1).read_bytes() == _files()[SHARD1] and res.manifest.refetched == []
    assert len(hub.file_gets(SHARD1)) == 2


def test_corrupt_file_is_reported_and_refetched(hub, env, capsys):
    hub.add_commit("test-org/tiny", _files())
    hub.corrupt[SHARD2] = 1
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert res.manifest.refetched == [SHARD2]
    assert (res.path / SHARD2).read_bytes() == _files()[SHARD2]
    assert f"{SHARD2} failed verification (sha256" in capsys.readouterr().err


def test_xet_backed_file_is_fetched_and_verified_like_any_other(hub, env, capsys):
    """A file the Hub marks as Xet-backed (huggingface_hub's own download would hand it to hf_xet) is streamed from
    its resolve URL and checked on the bytes written: a corrupt copy is caught and fetched again."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    sha = hub.add_commit("test-org/tiny", _files())
    hub.xet.add(SHARD2)
    hub.corrupt[SHARD2] = 1
    meta = get_hf_file_metadata(hf_hub_url("test-org/tiny", SHARD2, revision=sha, endpoint=hub.endpoint),
                                token=False, endpoint=hub.endpoint)
    assert meta.xet_file_data is not None  # what makes huggingface_hub's download take its xet_get path
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert res.manifest.refetched == [SHARD2] and (res.path / SHARD2).read_bytes() == _files()[SHARD2]
    assert f"{SHARD2} failed verification (sha256" in capsys.readouterr().err
    assert hub.file_gets(SHARD2) == [None, None]  # both copies came over the verified stream


def test_huggingface_hub_is_used_through_its_public_api_only():
    """The download package imports no private huggingface_hub names, assigns nothing on its modules and keeps
    no mutable state at module level."""
    import ast

    import pipeline.stages.download.fetch as fetch
    import pipeline.stages.download.stage as stage

    for mod in (stage, fetch):
        tree = ast.parse(Path(mod.__file__).read_text())
        hub_names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "huggingface_hub":
                assert not [p for p in node.module.split(".") if p.startswith("_")], node.module
                assert not [a.name for a in node.names if a.name.startswith("_")], ast.unparse(node)
                hub_names |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                hub_names |= {a.asname or a.name.split(".")[0] for a in node.names
                              if a.name.split(".")[0] == "huggingface_hub"}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                while isinstance(t, ast.Attribute):
                    t = t.value
                    assert not (isinstance(t, ast.Name) and t.id in hub_names), ast.unparse(node)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                assert not (isinstance(node.args[0], ast.Name) and node.args[0].id in hub_names), ast.unparse(node)
            assert not isinstance(node, ast.Global), ast.unparse(node)
        for node in tree.body:  # module level: constants only
            value = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            assert not isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)), \
                ast.unparse(node)
            assert not (isinstance(value, ast.Call) and getattr(value.func, "id", "") in
                        ("dict", "list", "set", "defaultdict", "OrderedDict", "deque")), ast.unparse(node)


_KILLED_CHILD = """
import sys, time
import pipeline.stages.download.stage as d
from pipeline.core.registry import get_model

def paused(*args, **kwargs):  # every file is fetched into the staging dir; stop before it is verified
    print("paused", flush=True)
    time.sleep(600)

d._verify_staging = paused
entry = get_model("tiny-llama").model_copy(update={"name": "hub-tiny", "repo_id": "test-org/tiny", "source": "hub"})
d.download_model(entry, hub=d.HubAccess(endpoint=sys.argv[1]))
"""


def test_sigkill_mid_download_then_rerun_resumes_and_leaves_nothing(hub, env):
    import signal

    sha = hub.add_commit("test-org/tiny", _files())
    child_env = dict(os.environ, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_PROGRESS_BARS="1")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, hub.endpoint], cwd=REPO, env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "paused", proc.stderr.read()[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    repo_dir = env / "cache" / "downloads" / "test-org--tiny"
    assert (repo_dir / f".partial-{sha}").is_dir() and not (repo_dir / sha).exists()
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert res.status == "built" and res.path == repo_dir / sha
    assert (res.path / SHARD1).read_bytes() == _files()[SHARD1]
    assert len(hub.file_gets(SHARD1)) == 1  # the killed run's bytes were kept, not fetched again
    assert sorted(p.name for p in repo_dir.iterdir() if not p.name.endswith(".lock")) == [sha]  # no staging left


def test_complete_incomplete_files_are_checked_not_fetched(hub, env, capsys):
    """A run killed after a file's last byte but before its rename leaves a whole `.incomplete` file: the next run
    hashes it instead of fetching it, and fetches it again only when those bytes are wrong."""
    sha = hub.add_commit("test-org/tiny", _files())
    staging = env / "cache" / "downloads" / "test-org--tiny" / f".partial-{sha}"
    staging.mkdir(parents=True)
    (staging / f"{SHARD1}.incomplete").write_bytes(_files()[SHARD1])
    bad = bytearray(_files()[SHARD2])
    bad[-1] ^= 0xFF
    (staging / f"{SHARD2}.incomplete").write_bytes(bytes(bad))
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert hub.file_gets(SHARD1) == [] and hub.file_gets(SHARD2) == [None]
    assert res.manifest.refetched == [SHARD2] and f"{SHARD2} failed verification (sha256" in capsys.readouterr().err
    for name in (SHARD1, SHARD2):
        assert (res.path / name).read_bytes() == _files()[name]


def test_persistently_corrupt_file_fails_and_publishes_nothing(hub, env):
    sha = hub.add_commit("test-org/tiny", _files())
    hub.corrupt[SHARD2] = 99
    with pytest.raises(DownloadError, match=f"{SHARD2} still fails verification after 3 fetches"):
        download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert not (env / "cache" / "downloads" / "test-org--tiny" / sha).exists()


def test_local_corruption_needs_verify_and_is_repaired(hub, env):
    hub.add_commit("test-org/tiny", _files())
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    shard = res.path / SHARD1
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only hashing can tell
    assert download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint)).status == "cached"
    with pytest.raises(DownloadError, match="incomplete or corrupt"):
        download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint), offline=True, verify=True)
    fixed = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint), verify=True)
    assert fixed.path == res.path and shard.read_bytes() == _files()[SHARD1]
    # a truncated file is caught by the cheap size check
    shard.write_bytes(b"short")
    assert download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint)).status == "built"
    assert shard.read_bytes() == _files()[SHARD1]


def test_offline_reuses_cache_without_network(hub, env):
    hub.add_commit("test-org/tiny", _files())
    with pytest.raises(DownloadError, match=r"offline: test-org/tiny@main has not been downloaded"):
        download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint), offline=True)
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    before = _hub_requests(hub)
    lock_file_path().unlink()  # even without the lock file, the cached download of 'main' is found
    off = download_model(_entry(), offline=True)
    assert off.path == res.path and off.status == "cached" and _hub_requests(hub) == before
    os.utime(res.path / SHARD1, ns=(1, 1))  # copied cache: new mtime, same bytes -> hashed once, accepted
    assert download_model(_entry(), offline=True).path == res.path
    assert json.loads((res.path / "manifest.json").read_text())["files"][SHARD1]["mtime_ns"] == 1
    (res.path / SHARD1).write_bytes(b"x" * len(_files()[SHARD1]))
    with pytest.raises(DownloadError, match="incomplete or corrupt"):
        download_model(_entry(), offline=True)
    with pytest.raises(DownloadError, match="--update needs the network"):
        download_model(_entry(), offline=True, update=True)


def test_hf_hub_offline_implies_offline(env, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DownloadError, match="offline: test-org/tiny@main has not been downloaded"):
        download_model(_entry())


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing_repo", r"repo test-org/nope was not found on http://127\.0\.0\.1:\d+ \(or it is private\)"),
        ("missing_revision", r"revision 'v9' does not exist in test-org/tiny; fix 'revision'"),
        ("gated_no_token", r"test-org/gated is a gated repo and no Hugging Face token was found; accept its license"),
        ("gated_bad_token", r"test-org/gated is a gated repo and your Hugging Face token has no access"),
        ("missing_file", r"a file listed in test-org/tiny@main could not be fetched \(404: " + SHARD2),
        ("no_tokenizer", r"test-org/tiny@[0-9a-f]{12} has no tokenizer\.json"),
        ("no_weights", r"has no \*\.safetensors"),
        ("config_mismatch", r"config\.json num_hidden_layers=7 does not match the registry's 4 for model 'hub-tiny'"),
        ("no_architectures", r"config\.json has no 'architectures'"),
        ("unreachable", r"cannot reach http://127\.0\.0\.1:9 to fetch test-org/tiny"),
        ("bad_repo_id", r"repo_id: '\.\./\.\./etc' is not a Hub repo id"),
        ("tokenizer_size", r"the tokenizer has 4 tokens but the registry declares tokenizer_size 1000 for model "
                           r"'hub-tiny'; fix the registry entry"),
        ("tokenizer_past_vocab", r"the tokenizer has 1030 tokens, more than config\.json's vocab_size 1024"),
        ("garbage_tokenizer", r"the tokenizer .*tokenizer\.json cannot be loaded \(.*\); re-fetch the model"),
    ],
)
def test_errors_are_one_line(hub, env, monkeypatch, case, message):
    files, entry, kw, access = _files(), _entry(), {}, HubAccess(endpoint=hub.endpoint)
    if case == "missing_repo":
        entry = _entry("test-org/nope")
    elif case == "missing_revision":
        kw["revision"] = "v9"
    elif case.startswith("gated"):
        hub.add_commit("test-org/gated", files, gated=True)
        entry = _entry("test-org/gated")
        if case == "gated_bad_token":
            access = HubAccess(endpoint=hub.endpoint, token="hf_wrong")
    elif case == "missing_file":
        hub.hide.add(SHARD2)
    elif case == "no_tokenizer":
        files = _files(**{"tokenizer.json": None})
    elif case == "no_weights":
        files = _files(**{SHARD1: None, SHARD2: None})
    elif case == "config_mismatch":
        files = _files(**{"config.json": _config(num_hidden_layers=7)})
    elif case == "no_architectures":
        files = _files(**{"config.json": _config(architectures=None)})
    elif case == "unreachable":
        access = HubAccess(endpoint="http://127.0.0.1:9")
    elif case == "bad_repo_id":
        entry = _entry("../../etc")
    elif case == "tokenizer_size":
        entry = _entry(tokenizer_size=1000)
    elif case == "tokenizer_past_vocab":
        files = _files(**{"tokenizer.json": _tokenizer_json(1030)})
    elif case == "garbage_tokenizer":
        files = _files(**{"tokenizer.json": b'{"version": "1.0"}'})
    if "test-org/tiny" not in hub.repos and entry.repo_id == "test-org/tiny":
        hub.add_commit("test-org/tiny", files)
    with pytest.raises(DownloadError, match=message) as err:
        download_model(entry, hub=access, **kw)
    assert "\n" not in str(err.value)
    assert not list((env / "cache" / "downloads").glob("*/[0-9a-f]*"))  # nothing published under a final name


def test_registry_gated_without_token_fails_before_any_request(hub, env, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    hub.add_commit("test-org/gated", _files(), gated=True)
    with pytest.raises(DownloadError, match=r"test-org/gated is a gated repo and no Hugging Face token") as err:
        download_model(_entry("test-org/gated", gated=True), hub=HubAccess(endpoint=hub.endpoint))
    assert "\n" not in str(err.value) and _hub_requests(hub) == 0
    assert not (env / "cache" / "downloads").exists() and not lock_file_path().exists()


def test_gated_repo_with_token_never_leaks_it(hub, env, capsys):
    hub.add_commit("test-org/gated", _files(), gated=True)
    res = download_model(_entry("test-org/gated"), hub=HubAccess(endpoint=hub.endpoint, token=TOKEN))
    assert res.status == "built"
    assert all(auth for m, p, _, auth in hub.requests if "/resolve/" in p)
    out = capsys.readouterr()
    for text in (out.out, out.err, lock_file_path().read_text(), (res.path / "manifest.json").read_text(),
                 res.manifest.model_dump_json()):
        assert TOKEN not in text


def test_generated_model_goes_through_the_same_function(pipeline_env):
    res = download_model(get_model("tiny-llama"))
    assert res.status == "cached" and res.path.name.startswith("tiny-llama-")
    assert res.manifest.source == "generated" and res.manifest.repo_id == "local/tiny-llama"
    assert res.status == "cached"  # the session fixture generated it already
    assert len(res.manifest.sha) == 40 and set(res.manifest.files) >= {"config.json", "model.safetensors"}
    assert download_model(get_model("tiny-llama"), verify=True).manifest == res.manifest
    assert not (pipeline_env / "out").exists()  # no lock file for generated models
    with pytest.raises(DownloadError, match=r"--revision v2: tiny-llama is generated locally"):
        download_model(get_model("tiny-llama"), revision="v2")  # never silently ignored


def test_generated_model_whose_tokenizer_disagrees_is_refused(pipeline_env):
    """The registry's declared tokenizer size is checked against the generated tokenizer (exit 2, one line)."""
    from pipeline.core.tokenizer import token_count

    entry = get_model("tiny-llama")
    tokens = token_count(download_model(entry).path)
    assert tokens <= entry.architecture.vocab_size
    assert download_model(entry.model_copy(update={"tokenizer_size": tokens})).status == "cached"
    with pytest.raises(DownloadError, match=rf"local/tiny-llama \(generated\): the tokenizer has {tokens} tokens "
                                            rf"but the registry declares tokenizer_size {tokens + 1}") as err:
        download_model(entry.model_copy(update={"tokenizer_size": tokens + 1}))
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


@pytest.mark.slow
def test_generated_files_round_trip_through_the_hub(tiny_models, hub, env):
    """The generated tiny model published on the local Hub downloads, verifies and loads with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sha = serve_directory(hub, "test-org/tiny-llama", tiny_models["tiny-llama"])
    res = download_model(_entry("test-org/tiny-llama"), hub=HubAccess(endpoint=hub.endpoint))
    assert res.manifest.sha == sha
    for name in res.manifest.files:
        assert (res.path / name).read_bytes() == (tiny_models["tiny-llama"] / name).read_bytes()
    assert AutoModelForCausalLM.from_pretrained(res.path).config.num_hidden_layers == 4
    assert AutoTokenizer.from_pretrained(res.path)("hello")["input_ids"][0] == 0


def test_test_suite_cannot_reach_the_real_hub(hub_online):
    import requests
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    assert constants.ENDPOINT == "http://127.0.0.1:9"
    with pytest.raises(requests.ConnectionError, match="non-loopback"):
        get_session().get("https://huggingface.co/api/models/gpt2", timeout=5)


def test_invoke_download_task(pipeline_env):
    env = {**os.environ, "PIPELINE_ROOT": str(pipeline_env / "out"), "PIPELINE_CACHE": str(pipeline_env / "cache")}
    ok = subprocess.run([sys.executable, "-m", "invoke", "download", "--model", "tiny-llama"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "tiny-llama" in ok.stdout and "generated" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "invoke", "download", "--model", "llama-8b", "--offline"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        (
            "error: offline: meta-llama/Llama-3.1-8B-Instruct@main has not been downloaded to "
            f"{pipeline_env / 'cache'}; run `invoke download --model llama-8b` with network access first"
        )
    ]


def test_stream_sha256_is_computed_off_the_writer_thread(tmp_path, monkeypatch):
    import hashlib
    import threading
    import types

    import pipeline.stages.download.fetch as dl

    hashed_on = []

    class Spy:
        def __init__(self):
            self._h = hashlib.sha256()

        def update(self, data):
            hashed_on.append(threading.current_thread().name)
            self._h.update(data)

        def hexdigest(self):
            return self._h.hexdigest()

    monkeypatch.setattr(dl, "hashlib", types.SimpleNamespace(sha256=Spy))
    chunks = [bytes([i]) * 100_000 for i in range(20)]
    with open(tmp_path / "f.incomplete", "wb") as f:
        stream = dl.HashingFile(f, 0)
        for c in chunks:
            stream.write(c)
        assert stream.digest() == hashlib.sha256(b"".join(chunks)).hexdigest() and stream.clean
    assert len(hashed_on) == 20 and threading.current_thread().name not in hashed_on
    assert set(hashed_on) == {"download-sha256"}
    with open(tmp_path / "f.incomplete", "r+b") as f:  # resuming: the bytes on disk are hashed first
        f.seek(0, 2)
        stream = dl.HashingFile(f, 1_000_000)
        for c in chunks[10:]:
            stream.write(c)
        assert stream.digest() == hashlib.sha256(b"".join(chunks)).hexdigest()


def test_a_cached_download_is_reported_as_cached_not_fetching(hub, env):
    from types import SimpleNamespace

    from pipeline.stages.build import _doing
    from pipeline.stages.download.stage import is_cached

    hub.add_commit("test-org/tiny", _files())
    spec = SimpleNamespace(model=_entry(), draft_model=None)
    assert not is_cached(_entry()) and _doing("download", spec) == "fetching test-org/tiny@main"
    res = download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint))
    assert is_cached(_entry()) and _doing("download", spec) == "test-org/tiny@main cached"
    (res.path / SHARD2).write_bytes(b"changed")  # no longer what the manifest records: it will be fetched
    assert not is_cached(_entry())


# ---------------------------------------------------------------------------------------------- EAGLE-3 heads
def _head(repo_id="test-org/head", **kw):
    return get_model("llama-8b-eagle3").model_copy(update={"name": "hub-head", "repo_id": repo_id, **kw})


def _head_files(**override) -> dict[str, bytes]:
    """A head as yuhuili publishes it: config.json with draft_vocab_size and one pickled pytorch_model.bin (the
    bytes are never unpickled: random ones verify as well), no tokenizer."""
    a = get_model("llama-8b-eagle3").architecture
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden_size,
              "num_hidden_layers": 1, "vocab_size": a.vocab_size, "draft_vocab_size": 32000, "torch_dtype": "float16"}
    files = {"config.json": json.dumps(config).encode(), "pytorch_model.bin": os.urandom(200_000),
             "README.md": b"# head"}
    files.update(override)
    return {k: v for k, v in files.items() if v is not None}


def test_eagle3_head_with_pickled_weights_and_no_tokenizer_is_pinned_and_verified(hub, env):
    files = _head_files()
    hub.add_commit("test-org/head", files)
    res = download_model(_head(), hub=HubAccess(endpoint=hub.endpoint))
    assert res.status == "built" and sorted(p.name for p in res.path.iterdir()) == [
        "config.json", "manifest.json", "pytorch_model.bin"]
    m = res.manifest
    assert m.files["pytorch_model.bin"].sha256 == __import__("hashlib").sha256(files["pytorch_model.bin"]).hexdigest()
    assert "pytorch_model.bin" in m.allow_patterns
    assert read_lock(lock_file_path())["models"]["hub-head"]["sha"] == m.sha  # pinned at first download
    again = download_model(_head(), hub=HubAccess(endpoint=hub.endpoint))
    assert again.status == "cached" and again.path == res.path


def test_eagle3_head_prefers_safetensors_and_a_model_never_fetches_pickles(hub, env):
    hub.add_commit("test-org/head", _head_files(**{"model.safetensors": os.urandom(1000)}))
    res = download_model(_head(), hub=HubAccess(endpoint=hub.endpoint))
    assert set(res.manifest.files) == {"config.json", "model.safetensors"}
    hub.add_commit("test-org/tiny", _files(**{"pytorch_model.bin": os.urandom(1000)}))
    assert "pytorch_model.bin" not in download_model(_entry(), hub=HubAccess(endpoint=hub.endpoint)).manifest.files


@pytest.mark.parametrize("override, message", [
    ({"config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                                 "vocab_size": 128256}).encode()},
     r"config\.json has no draft_vocab_size, so TensorRT-LLM 1\.2 would not load it as an EAGLE-3 head"),
    ({"config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "vocab_size": 32000,
                                 "draft_vocab_size": 32000}).encode()},
     r"config\.json vocab_size=32000 does not match the registry's 128256 for EAGLE-3 head 'hub-head'"),
    ({"config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "vocab_size": 128256,
                                 "draft_vocab_size": 32000}).encode()},
     r"config\.json hidden_size=8192 does not match the registry's 4096"),
    ({"pytorch_model.bin": None}, r"has no \*\.safetensors or pytorch_model\.bin; an EAGLE-3 head needs"),
])
def test_eagle3_head_refusals_are_one_line(hub, env, override, message):
    hub.add_commit("test-org/head", _head_files(**override))
    with pytest.raises(DownloadError, match=message) as err:
        download_model(_head(), hub=HubAccess(endpoint=hub.endpoint))
    assert "\n" not in str(err.value)
    assert not list((env / "cache" / "downloads").glob("*/[0-9a-f]*"))
