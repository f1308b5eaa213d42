"""install-repo: every path parameter made absolute through protobuf, checked, in place or into a copy; the CLI;
and serve's launch copies (hand-written repositories in tmp dirs; no server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PackageError
from pipeline.stages.package import pbtxt
from pipeline.stages.package.install import install_repo
from tests.support.triton_fixtures import fabricated_engine, fake_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def _params(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in values.items())


def _model(repo: Path, name: str, backend: str, python: bool, **params: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(
        f'# hand-written, upstream style\nname: "{name}"\nbackend: "{backend}"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]\n' + _params(**params))
    if python:
        (d / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")


def hand_repo(root: Path, *, draft: bool = True, **extra: str) -> Path:
    """A repository shaped like `invoke package` writes it: relative engine and tokenizer paths."""
    repo = root / "triton_repo" / "tiny"
    engines = root / "engines" / "tiny"
    fabricated_engine(engines / "engine", max_batch_size=4, world=1, max_draft_len=4 if draft else 0)
    for model in ("preprocessing", "postprocessing"):
        _model(repo, model, "python", True, tokenizer_dir="tokenizer",
               **({"gpt_model_path": "", "multimodal_model_path": "", "hf_model_path": ""}
                  if model == "preprocessing" else {}))
        fake_tokenizer(repo / model / "tokenizer")
    llm = {"tokenizer_dir": "", "encoder_model_path": "", "xgrammar_tokenizer_info_path": "", "lora_prefetch_dir": "",
           "executor_worker_path": "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"}
    _model(repo, "tensorrt_llm", "tensorrtllm", False,
           **{"gpt_model_path": "../../../engines/tiny/engine", **llm, **extra})
    if draft:
        fabricated_engine(engines / "draft_engine", max_batch_size=4, world=1)
        _model(repo, "tensorrt_llm_draft", "tensorrtllm", False, gpt_model_path="../../../engines/tiny/draft_engine",
               **llm)
    return repo


def param(repo: Path, model: str, key: str) -> str:
    return pbtxt.parameter(pbtxt.read(repo / model / "config.pbtxt"), key)


def snapshot(repo: Path) -> dict[str, bytes]:
    return {p.relative_to(repo).as_posix(): p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()}


def test_in_place_makes_every_path_absolute_and_is_idempotent(tmp_path):
    repo = hand_repo(tmp_path)
    res = install_repo(repo)
    assert res.path == repo.resolve()
    engines = (tmp_path / "engines" / "tiny").resolve()
    assert param(repo, "tensorrt_llm", "gpt_model_path") == str(engines / "engine")
    assert param(repo, "tensorrt_llm_draft", "gpt_model_path") == str(engines / "draft_engine")
    for model in ("preprocessing", "postprocessing"):
        assert param(repo, model, "tokenizer_dir") == str(repo.resolve() / model / "tokenizer")
    # empty ones stay empty; non-path parameters untouched; the result still parses as a ModelConfig
    assert param(repo, "tensorrt_llm", "encoder_model_path") == ""
    assert param(repo, "preprocessing", "gpt_model_path") == ""
    assert param(repo, "tensorrt_llm", "executor_worker_path").startswith("/opt/tritonserver/")
    assert res.paths["tensorrt_llm"] == {"gpt_model_path": str(engines / "engine")}
    before = snapshot(repo)
    install_repo(repo)  # absolute already: nothing rewritten
    assert snapshot(repo) == before
    assert not list(repo.rglob("*.tmp"))


def test_copy_leaves_the_source_alone_and_stands_alone(tmp_path):
    repo = hand_repo(tmp_path)
    before = snapshot(repo)
    for link in (False, True):
        dest = tmp_path / f"installed-{link}"
        res = install_repo(repo, dest, link=link)
        assert res.path == dest.resolve() and snapshot(repo) == before
        assert param(dest, "preprocessing", "tokenizer_dir") == str(dest.resolve() / "preprocessing" / "tokenizer")
        assert param(dest, "tensorrt_llm", "gpt_model_path") == str((tmp_path / "engines/tiny/engine").resolve())
        assert (dest / "preprocessing" / "1" / "model.py").is_file()
        assert not list(tmp_path.glob(".tmp-*"))


def test_optional_paths_are_resolved_when_set(tmp_path):
    (tmp_path / "lora").mkdir()
    (tmp_path / "xgrammar.json").write_text("{}")
    repo = hand_repo(tmp_path, draft=False, lora_prefetch_dir="../../../lora",
                     xgrammar_tokenizer_info_path="../../../xgrammar.json", tokenizer_dir="../preprocessing/tokenizer")
    install_repo(repo)
    assert param(repo, "tensorrt_llm", "lora_prefetch_dir") == str((tmp_path / "lora").resolve())
    assert param(repo, "tensorrt_llm", "xgrammar_tokenizer_info_path") == str((tmp_path / "xgrammar.json").resolve())
    assert param(repo, "tensorrt_llm", "tokenizer_dir") == str(repo.resolve() / "preprocessing" / "tokenizer")


def test_missing_path_is_one_line_and_nothing_is_written(tmp_path):
    repo = hand_repo(tmp_path)
    (tmp_path / "engines" / "tiny" / "engine" / "config.json").unlink()
    import shutil

    shutil.rmtree(tmp_path / "engines" / "tiny" / "engine")
    before = snapshot(repo)
    with pytest.raises(PackageError) as info:
        install_repo(repo)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("tensorrt_llm: gpt_model_path '../../../engines/tiny/engine' -> ")
    assert "does not exist" in msg and "--engine-dir" in msg
    assert snapshot(repo) == before
    with pytest.raises(PackageError):
        install_repo(repo, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_empty_required_path_is_refused(tmp_path):
    repo = hand_repo(tmp_path, draft=False, gpt_model_path="")
    with pytest.raises(PackageError, match="tensorrt_llm: parameter gpt_model_path is empty"):
        install_repo(repo)


def test_engine_dir_overrides_are_checked(tmp_path):
    repo = hand_repo(tmp_path)
    moved = fabricated_engine(tmp_path / "moved" / "engine", max_batch_size=4, world=1, max_draft_len=4)
    res = install_repo(repo, tmp_path / "out", engine_dir=moved)
    assert param(res.path, "tensorrt_llm", "gpt_model_path") == str(moved.resolve())
    broken = fabricated_engine(tmp_path / "broken" / "engine", max_batch_size=4, world=2)
    (broken / "rank1.engine").unlink()
    with pytest.raises(PackageError, match="rank1.engine"):
        install_repo(repo, engine_dir=broken)
    with pytest.raises(PackageError, match="engine dir .* does not exist"):
        install_repo(repo, engine_dir=tmp_path / "nowhere")
    plain = hand_repo(tmp_path / "plain", draft=False)
    with pytest.raises(PackageError, match="--draft-engine-dir given but the repository has no tensorrt_llm_draft"):
        install_repo(plain, draft_engine_dir=moved)


def test_bad_destinations_are_refused(tmp_path):
    repo = hand_repo(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(PackageError, match="already exists"):
        install_repo(repo, tmp_path / "full")
    with pytest.raises(PackageError, match="inside\\) the repository"):
        install_repo(repo, repo / "sub")
    (tmp_path / "empty").mkdir()
    assert install_repo(repo, tmp_path / "empty").path == (tmp_path / "empty").resolve()


def test_not_a_repository(tmp_path):
    with pytest.raises(PackageError, match="does not exist"):
        install_repo(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackageError, match="holds no"):
        install_repo(tmp_path / "empty")


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def test_invoke_install_repo(tmp_path):
    repo = hand_repo(tmp_path)
    done = _invoke("install-repo", "--repo", str(repo), "--dest", str(tmp_path / "served"))
    assert done.returncode == 0, done.stderr
    assert f"ok: {(tmp_path / 'served').resolve()} installed" in done.stdout
    assert "tensorrt_llm.gpt_model_path = /" in done.stdout
    bad = _invoke("install-repo", "--repo", str(tmp_path / "missing"))
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: ") and len(bad.stderr.splitlines()) == 1


# --------------------------------------------------------------------------------------------- serve launches
def test_launch_copy_is_installed_and_stale_ones_are_pruned(tmp_path, monkeypatch):
    from pipeline.serving import serve

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    repo = hand_repo(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = serve.launch_root() / f"tiny-{dead.pid}-deadbeef"
    stale.mkdir(parents=True)
    mine = serve.launch_root() / f"tiny-{os.getpid()}-cafecafe"
    mine.mkdir()
    launch = serve.launch_repo(repo)
    assert launch.parent == serve.launch_root() and launch.name.startswith(f"tiny-{os.getpid()}-")
    assert not stale.exists() and mine.exists()
    assert param(launch, "preprocessing", "tokenizer_dir") == str(launch / "preprocessing" / "tokenizer")
    assert param(repo, "preprocessing", "tokenizer_dir") == "tokenizer"  # the packaged repo is unchanged
