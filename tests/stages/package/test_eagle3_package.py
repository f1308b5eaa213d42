"""An EAGLE-3 head in the `llmapi` repository: carried in beside model.yaml exactly as downloaded (its files checked
against the download manifest, nothing extra), `speculative_config` in 1.2.1's Eagle spelling pointing at it, the
manifest's speculation record, and the one-line refusals (a head without draft_vocab_size, for another target, over
another vocabulary, with an extra file)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from pipeline.core.errors import PackageError
from pipeline.core.manifests import DownloadManifest, FileRecord, RepoManifest
from pipeline.core.registry import get_model
from pipeline.core.spec import resolve_spec
from pipeline.stages.package import llmapi_yaml
from pipeline.stages.package.eagle3_head import HEAD_DIR
from pipeline.stages.package.inputs import PackageInputs
from pipeline.stages.package.llmapi_options import llm_api_options
from pipeline.stages.package.llmapi_package import check_model_yaml, package_llmapi_repo
from tests.support.llmapi_fixtures import fabricated_fp8_export

HEAD = "tiny-llama-eagle3"


def fake_head(dest: Path, **config_override) -> Path:
    """A downloaded head as the download stage leaves it: config.json, a pickled pytorch_model.bin (random bytes:
    nothing here unpickles it) and the download manifest of exactly those files."""
    entry = get_model(HEAD)
    assert entry.eagle3 is not None
    a = entry.architecture
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden_size,
              "num_hidden_layers": 1, "vocab_size": a.vocab_size, "draft_vocab_size": entry.eagle3.draft_vocab_size,
              "torch_dtype": "float16", **config_override}
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    (dest / "pytorch_model.bin").write_bytes(os.urandom(4096))
    files = {p.name: FileRecord(sha256=hashlib.sha256(p.read_bytes()).hexdigest(), size=p.stat().st_size,
                                mtime_ns=p.stat().st_mtime_ns) for p in sorted(dest.iterdir())}
    DownloadManifest(key="k" * 64, model=HEAD, repo_id=entry.repo_id, revision="main", sha="a" * 40, source="hub",
                     total_bytes=sum(f.size for f in files.values()), files=files).write(dest)
    return dest


@pytest.fixture(scope="module")
def target_export(tiny_models, tmp_path_factory) -> Path:
    return fabricated_fp8_export(tiny_models["tiny-llama"], tmp_path_factory.mktemp("exports") / "hf_checkpoint")


def _spec(**overrides):
    return resolve_spec(model="tiny-llama", precision="fp8", speculative_decoding="eagle3", draft=HEAD,
                        target="reference", runtime="pytorch", max_batch_size=4, **overrides)


def _package(spec, target_export, head: Path, out: Path):
    inputs = PackageInputs(checkpoint=target_export, draft_checkpoint=head, output=out, build_id="tiny-llama-fp8-e3")
    return package_llmapi_repo(spec, inputs, options=llm_api_options(spec, draft_dir=head))


def test_the_head_is_carried_into_the_repository_and_named_by_model_yaml(tmp_path, target_export):
    head = fake_head(tmp_path / "head")
    spec = _spec()
    res = _package(spec, target_export, head, tmp_path / "repos")
    data = llmapi_yaml.read(res.path / llmapi_yaml.MODEL_YAML)
    config = data["speculative_config"]
    assert config == {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model_dir": HEAD_DIR,
                      "eagle3_layers_to_capture": [0, 1, 2], "max_concurrency": 8}
    carried = (res.path / llmapi_yaml.MODEL_YAML).parent / HEAD_DIR
    assert sorted(p.name for p in carried.iterdir()) == ["config.json", "pytorch_model.bin"]
    assert (carried / "pytorch_model.bin").read_bytes() == (head / "pytorch_model.bin").read_bytes()
    m = res.manifest
    assert f"tensorrt_llm/1/{HEAD_DIR}/pytorch_model.bin" in m.files  # the repository's file table covers it
    assert m.speculation is not None and m.speculation.model_dump() == {
        "mode": "eagle3", "draft": HEAD, "num_draft_tokens": 4}
    assert RepoManifest.read(res.path).problems(res.path, full=True) == []
    assert check_model_yaml(res.path / llmapi_yaml.MODEL_YAML).speculative_config is not None
    again = _package(spec, target_export, head, tmp_path / "repos")
    assert again.status == "cached"


@pytest.mark.parametrize("change, message", [
    ("no_draft_vocab", r"config\.json has no draft_vocab_size, so TensorRT-LLM 1\.2 would load it as a plain model"),
    ("other_vocab", r"config\.json vocab_size=2048 is not the target tiny-llama's 1024"),
    ("extra_file", r"differs from its download manifest \(notes\.txt: not in the manifest\)"),
    ("changed_file", r"differs from its download manifest \(pytorch_model\.bin: "),
    ("no_manifest", r"has no download manifest, so its files cannot be verified"),
])
def test_head_refusals_are_one_line(tmp_path, target_export, change, message):
    override = {"no_draft_vocab": {"draft_vocab_size": None}, "other_vocab": {"vocab_size": 2048}}.get(change, {})
    head = fake_head(tmp_path / "head", **override)
    if change == "extra_file":
        (head / "notes.txt").write_text("slipped in")
    elif change == "changed_file":
        (head / "pytorch_model.bin").write_bytes(os.urandom(10))
    elif change == "no_manifest":
        (head / "manifest.json").unlink()
    with pytest.raises(PackageError, match=message) as err:
        _package(_spec(), target_export, head, tmp_path / "repos")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "repos").exists() or not any((tmp_path / "repos").iterdir())


def test_a_head_of_another_target_is_refused(tmp_path, target_export):
    from pipeline.stages.package.eagle3_head import read_head

    head = fake_head(tmp_path / "head")
    spec = _spec()
    other = spec.model_copy(update={"model": spec.model.model_copy(update={"name": "tiny-other"})})
    with pytest.raises(PackageError, match=r"EAGLE-3 head tiny-llama-eagle3 is trained for tiny-llama, not "
                                           r"tiny-other; pass --draft with a head of tiny-other"):
        read_head(head, other)


def test_serve_print_only_shows_the_model_yaml_the_llm_api_gets(tmp_path, monkeypatch, capsys):
    """`invoke serve --print-only` of an EAGLE-3 spec, no build: under the launch plan, the model.yaml that the
    Triton LLM-API model passes to tensorrt_llm.LLM (1.2.1's `decoding_type: Eagle`, the head carried beside it);
    nothing is downloaded or written."""
    import yaml

    from pipeline.cli.commands import serve_command

    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    spec = resolve_spec(model="llama3.3-70b", precision="fp8", tp=4, runtime="pytorch",
                        speculative_decoding="eagle3", draft="auto", max_batch_size=16)
    serve_command(spec, print_only=True)
    text = capsys.readouterr().out
    block = text[text.index("tensorrt_llm/1/model.yaml (written by package"):].splitlines()[1:]
    data = yaml.safe_load("\n".join(line.removeprefix("#   ") for line in block))
    head = data["speculative_config"].pop("speculative_model_dir")
    assert data["speculative_config"] == {"decoding_type": "Eagle", "max_draft_len": 3, "max_concurrency": 8}
    assert head.endswith(f"/tensorrt_llm/1/{HEAD_DIR}") and head.startswith(str(tmp_path / "out"))  # as model is
    assert data["tensor_parallel_size"] == 4 and data["backend"] == "pytorch"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_the_build_serves_the_heads_download_and_a_draft_models_checkpoint(tmp_path):
    from pipeline.core.manifests import StageResult
    from pipeline.stages.package.inputs import served_draft
    from pipeline.stages.stage import BuildOutputs

    head_dir = fake_head(tmp_path / "head")
    download = StageResult(head_dir, DownloadManifest.read(head_dir), "cached")
    checkpoint = StageResult(tmp_path / "draft_ckpt", None, "cached")
    out = BuildOutputs(draft_download=download, draft_checkpoint=checkpoint)  # type: ignore[arg-type]
    assert served_draft(_spec(), out) == head_dir
    draft_target = resolve_spec(model="tiny-llama", precision="fp8", draft="auto", runtime="pytorch")
    assert served_draft(draft_target, out) == tmp_path / "draft_ckpt"
    plain = resolve_spec(model="tiny-llama", precision="fp8", runtime="pytorch")
    assert served_draft(plain, out) is None
    assert served_draft(_spec(), BuildOutputs()) is None  # not found: the package stage says what to pass
