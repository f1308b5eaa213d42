"""Build refs (pipeline/core/refs.py): readers follow the pointer a finished stage left and check its file table; they
never recompute a key from this host. User stories: a host library bump or a moved calibration file leaves serve
and release working and `build` rebuilding only what changed; price and node count never rename an output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline import __version__
from pipeline.core.artifacts import file_table
from pipeline.core.errors import CalibrationError, IntegrityError, PackageError, PipelineError
from pipeline.core.manifests import RepoManifest, StageResult
from pipeline.core.refs import lookup, read_ref, ref_path, write_ref
from pipeline.core.spec import resolve_spec

IDENT = "ab" * 32
SPEC = resolve_spec(model="tiny-llama", precision="fp8", target="reference")


def _repo(root: Path, name: str, key: str, spec_key: str = SPEC.identity("package"),
          target: str = "reference") -> StageResult:
    repo = root / "triton_repo" / name
    (repo / "ensemble" / "1").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\n')
    m = RepoManifest(key=key, target=target, build_id="b", spec="ok", spec_key=spec_key, models=["ensemble"],
                     sources={}, gpt_model_path={}, world_size=1, kv_cache_reuse=True, files=file_table(repo))
    m.write(repo)
    return StageResult(repo, m, "built")


def test_a_ref_is_found_stale_or_absent_and_never_written_by_a_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    ident = SPEC.identity("package")
    assert lookup("package", SPEC).state == "absent"
    res = _repo(tmp_path, "r1", "k1")
    ref = write_ref("package", ident, {"triton_repo": res})
    assert ref.outputs["triton_repo"].path == "triton_repo/r1"  # relative: the output tree may move
    assert json.loads(ref_path("package", ident).read_text())["outputs"]["triton_repo"]["key"] == "k1"
    found = lookup("package", SPEC)
    assert found.state == "found" and found.results["triton_repo"].path == res.path
    assert found.results["triton_repo"].status == "cached"
    (res.path / "ensemble" / "config.pbtxt").write_text('name: "changed"\n')
    stale = lookup("package", SPEC)
    assert stale.state == "stale" and "differs from its manifest" in stale.reason
    assert any("config.pbtxt" in p for p in stale.problems)
    _repo(tmp_path, "r2", "k2").manifest.write(res.path)  # another build's manifest now lives there
    assert "rebuilt for other inputs" in lookup("package", SPEC).reason
    shutil.rmtree(res.path)
    assert "is gone" in lookup("package", SPEC).reason
    assert sorted(p.name for p in (tmp_path / "engines" / ".refs" / "package").iterdir()) == [f"{ident}.json"]


def test_bad_refs_and_identities_are_refused_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    with pytest.raises(PipelineError, match="no build ref for stage 'package' and identity '../x'"):
        ref_path("package", "../x")
    with pytest.raises(PipelineError, match="no build ref for stage 'serve'"):
        ref_path("serve", IDENT)
    path = ref_path("calibrate", IDENT)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(PipelineError, match="is not a build ref .* delete it and run `invoke build`"):
        read_ref("calibrate", IDENT)
    path.write_text(json.dumps({"stage": "package", "identity": IDENT, "outputs": {"triton_repo": {
        "path": "x", "key": "k"}}}))
    with pytest.raises(PipelineError, match="the ref of another stage or spec"):
        read_ref("calibrate", IDENT)


def _point(stage: str, ident: str, path: str, key: str) -> None:
    """Edit a ref by hand: its output now names `path` and `key`."""
    role = {"calibrate": "checkpoint", "compile": "engine", "package": "triton_repo"}[stage]
    ref_path(stage, ident).parent.mkdir(parents=True, exist_ok=True)
    ref_path(stage, ident).write_text(json.dumps({"stage": stage, "identity": ident, "outputs": {
        role: {"path": path, "key": key}}}))


def test_a_ref_edited_to_point_at_another_specs_repository_is_refused_with_exit_3(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    bf16 = resolve_spec(model="tiny-llama", precision="bf16", target="reference")
    other = _repo(tmp_path, "bf16", "k-bf16", spec_key=bf16.identity("package"))
    assert lookup("package", bf16).state == "absent"
    write_ref("package", bf16.identity("package"), {"triton_repo": other})
    assert lookup("package", bf16).state == "found"
    _point("package", SPEC.identity("package"), "triton_repo/bf16", "k-bf16")  # fp8's ref -> bf16's repository
    with pytest.raises(IntegrityError) as err:
        lookup("package", SPEC)
    msg = str(err.value)
    assert err.value.exit_code == 3 and str(ref_path("package", SPEC.identity("package"))) in msg
    assert str(other.path) in msg and f"spec key {bf16.identity('package')} (this spec: " in msg
    assert "run `invoke build`" in msg and "target" not in msg  # only what differs is named
    trtllm = _repo(tmp_path, "trt", "k-trt", target="trtllm")
    _point("package", SPEC.identity("package"), "triton_repo/trt", trtllm.manifest.key)
    with pytest.raises(IntegrityError, match=r"target trtllm \(this spec: reference\)"):
        lookup("package", SPEC)


@pytest.mark.parametrize("recorded", ["/etc", "triton_repo/../engines/x", "engines/x", "triton_repo", "../x",
                                      "triton_repo/link"])
def test_a_ref_path_outside_its_stage_area_is_refused_with_exit_3(tmp_path, monkeypatch, recorded):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    outside = _repo(tmp_path / "elsewhere", "r", "k")  # a real repository, outside the output tree
    (tmp_path / "triton_repo").mkdir(exist_ok=True)
    (tmp_path / "triton_repo" / "link").symlink_to(outside.path)
    _point("package", SPEC.identity("package"), str(outside.path) if recorded == "/etc" else recorded, "k")
    with pytest.raises(IntegrityError, match="run `invoke build` to rewrite it") as err:
        lookup("package", SPEC)
    assert err.value.exit_code == 3


def test_write_ref_keeps_paths_relative_and_refuses_an_output_outside_the_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    outside = _repo(tmp_path, "r", "k")  # tmp_path/triton_repo/r: outside PIPELINE_ROOT
    with pytest.raises(PipelineError, match="is outside .*out/triton_repo; a build ref points only inside"):
        write_ref("package", IDENT, {"triton_repo": outside})
    assert not ref_path("package", IDENT).exists()
    disk = tmp_path / "disk"  # triton_repo/ a symlink to another disk: the ref stays relative and is followed
    disk.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "triton_repo").symlink_to(disk, target_is_directory=True)
    res = _repo(tmp_path / "out", "r", "k")
    assert write_ref("package", SPEC.identity("package"), {"triton_repo": res}).outputs["triton_repo"].path == \
        "triton_repo/r"
    assert lookup("package", SPEC).state == "found"


def test_write_ref_replaces_a_directory_in_its_place_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    res = _repo(tmp_path, "r1", "k1")
    ident = SPEC.identity("package")
    (ref_path("package", ident) / "junk").mkdir(parents=True)
    with pytest.raises(PipelineError, match="is a directory, not a regular file; delete it and run `invoke build`"):
        lookup("package", SPEC)
    said = []
    write_ref("package", ident, {"triton_repo": res}, say=said.append)
    assert said == [f"warning: replaced the directory at {ref_path('package', ident)} with the build ref"]
    assert lookup("package", SPEC).state == "found"
    assert [p.name for p in ref_path("package", ident).parent.iterdir()] == [f"{ident}.json"]  # no temp left


def test_write_ref_leaves_a_symlinked_refs_directory_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    res = _repo(tmp_path / "out", "r1", "k1")
    theirs = tmp_path / "theirs"
    (theirs / f"{IDENT}.json").mkdir(parents=True)
    (tmp_path / "out" / "engines" / ".refs").mkdir(parents=True)
    (tmp_path / "out" / "engines" / ".refs" / "package").symlink_to(theirs, target_is_directory=True)
    with pytest.raises(PipelineError, match="reached through a symlink; remove it yourself"):
        write_ref("package", IDENT, {"triton_repo": res})
    assert (theirs / f"{IDENT}.json").is_dir()


# --- the user stories: one real (CPU) build of tiny-llama fp8 for the reference target ---------------------------


@pytest.fixture
def built(pipeline_env):
    """A finished build whose calibration text is a file of the user's (`--calib-data`)."""
    from pipeline.stages.build import build
    from pipeline.stages.calibrate.data import corpus_split

    calib = pipeline_env / "data" / "calib.txt"
    calib.parent.mkdir()
    calib.write_text("\n\n".join(corpus_split()[0][:40]))  # the user's file: text of the calibration split
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference", calib_data=str(calib), calib_size=4,
                        calib_seq_len=32)
    report = build(spec, progress=None)
    assert not report.noop
    return {"root": pipeline_env, "calib": calib, "spec": spec, "report": report}


def _statuses(report) -> dict[str, str]:
    return {o.stage: o.status for o in report.stages}


@pytest.mark.slow
def test_a_host_library_bump_leaves_serve_and_release_working_and_build_rebuilds_from_calibrate(built, monkeypatch):
    from pipeline.ops.release import release
    from pipeline.stages.build import build, locate_outputs
    from pipeline.stages.calibrate import stage as calibrate

    spec, first = built["spec"], built["report"].outputs
    host = dict(calibrate.toolchain(), transformers="99.0.0")  # this host's transformers is not the recorded one
    monkeypatch.setattr(calibrate, "toolchain", lambda: host)
    found = locate_outputs(spec)  # what serve, bench and release ask: the recorded build, as it was
    assert found.triton_repo.path == first.triton_repo.path and found.build_id == first.build_id
    rel = release(spec, output=str(built["root"] / "rel"))
    assert rel.tarball.is_file()
    again = build(spec, progress=None)  # build's question: is it current here? No: calibrate (and what follows)
    assert _statuses(again) == {"check": "ok", "download": "cached", "calibrate": "built", "compile": "skipped",
                                "package": "built"}
    assert again.outputs.checkpoint.manifest.toolchain["transformers"] == "99.0.0"
    assert locate_outputs(spec).build_id == again.outputs.build_id != first.build_id  # the ref moved
    assert build(spec, progress=None).noop


@pytest.mark.slow
def test_a_moved_calibration_file_or_another_price_or_node_count_changes_nothing(built):
    from pipeline.core.layout import release_file
    from pipeline.ops.release import release
    from pipeline.stages.build import build, locate_outputs

    spec, first = built["spec"], built["report"].outputs
    moved = built["calib"].rename(built["root"] / "calib-moved.txt")
    for other in (dict(calib_data=str(moved)), dict(calib_data=str(moved), gpu_price_per_hour=9.0, nodes=2)):
        spec2 = resolve_spec(model="tiny-llama", precision="fp8", target="reference", calib_size=4, calib_seq_len=32,
                             **other)
        assert locate_outputs(spec2).paths() == first.paths()  # serve/bench/release find the same outputs
        assert release_file(spec2, "1") == release_file(spec, "1")
        again = build(spec2, progress=None)
        assert again.noop and again.outputs.paths() == first.paths(), _statuses(again)
    assert release(spec2, output=str(built["root"] / "rel")).tarball.name == release_file(spec, __version__)
    with pytest.raises(CalibrationError, match="no current target checkpoint for tiny-llama fp8"):
        locate_outputs(resolve_spec(model="tiny-llama", precision="fp8", target="reference", calib_size=5,
                                    calib_seq_len=32))


@pytest.mark.slow
def test_readers_refuse_a_recorded_output_that_changed_with_exit_3(built):
    from pipeline.stages.build import locate_outputs

    ckpt = built["report"].outputs.checkpoint.path
    shard = next(ckpt.glob("rank0.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    with pytest.raises(IntegrityError, match="re-run `invoke build --force calibrate`") as err:
        locate_outputs(built["spec"], verify=True)
    assert err.value.exit_code == 3


@pytest.mark.slow
def test_a_standalone_package_points_the_ref_that_serve_follows(built, capsys):
    from pipeline.cli.commands import package_command
    from pipeline.stages.build import locate_outputs

    spec = built["spec"]
    ref_path("package", spec.identity("package")).unlink()
    with pytest.raises(PackageError, match="no current Triton repository for tiny-llama fp8 .* run `invoke package`"):
        locate_outputs(spec)
    res = package_command(spec)  # `invoke package`: finds the checkpoint through its ref, then records its own
    assert res.status == "cached" and locate_outputs(spec).triton_repo.path == res.path
    assert "current (no-op)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_ref_edited_to_a_bf16_checkpoint_is_refused_by_package_and_release_and_build_repairs_it(built):
    from pipeline.cli.commands import package_command
    from pipeline.core.manifests import CheckpointManifest
    from pipeline.ops.release import release
    from pipeline.stages.build import build, locate_outputs

    spec, root = built["spec"], built["root"] / "out"
    ckpt = built["report"].outputs.checkpoint.path
    other = root / "engines" / "tiny-llama-bf16-0123456789ab" / "checkpoint"  # another build's checkpoint
    shutil.copytree(ckpt, other)
    m = CheckpointManifest.read(other)
    m.key, m.build_id = "k-bf16", "tiny-llama-bf16-0123456789ab"
    m.recipe = m.recipe.model_copy(update={"precision": "bf16", "kv_cache": "bf16"})
    m.write(other)
    ident = spec.identity("calibrate")
    _point("calibrate", ident, "engines/tiny-llama-bf16-0123456789ab/checkpoint", "k-bf16")
    for reader in (lambda: package_command(spec), lambda: release(spec, output=str(root / "rel"))):
        with pytest.raises(IntegrityError, match=r"precision bf16 \(this spec: fp8\); kv_cache bf16 \(this spec: "
                                                 r"fp8\); run `invoke build`") as err:
            reader()
        assert err.value.exit_code == 3 and str(ref_path("calibrate", ident)) in str(err.value)
    assert not (root / "rel").exists() or not any((root / "rel").iterdir())
    said = []
    again = build(spec, progress=said.append)  # build repairs: the stages find their own outputs, the ref moves
    assert again.noop and again.outputs.checkpoint.path == ckpt
    assert locate_outputs(spec).checkpoint.path == ckpt
    shutil.rmtree(other)
    ref_path("calibrate", ident).unlink()
    ref_path("calibrate", ident).mkdir()  # a directory where the ref belongs
    said.clear()
    assert build(spec, progress=said.append).noop
    assert f"warning: replaced the directory at {ref_path('calibrate', ident)} with the build ref" in said
    assert locate_outputs(spec).checkpoint.path == ckpt


@pytest.mark.slow
def test_verify_refuses_a_release_packed_from_another_builds_checkpoint(built, tmp_path):
    """A release whose file table is consistent but whose checkpoint records bf16 under an fp8 spec (what a
    mis-pointed ref packed before refs were checked): verify exits 3 naming the checkpoint and what differs,
    unpacked and as a tarball."""
    import hashlib
    import json
    import tarfile

    from pipeline.core.artifacts import MANIFEST
    from pipeline.core.manifests import CheckpointManifest, ReleaseDocument
    from pipeline.ops.release import release, write_tarball
    from pipeline.ops.release_verify import verify

    rel = release(built["spec"], output=str(tmp_path / "rel"))
    with tarfile.open(rel.tarball) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    top = next((tmp_path / "x").iterdir())
    assert verify(top, check_host=False).files_checked
    doc = json.loads((top / "release.json").read_text())
    arc = next(a for a in doc["components"] if a.endswith("/checkpoint"))
    m = CheckpointManifest.read(top / arc)
    m.recipe = m.recipe.model_copy(update={"precision": "bf16", "kv_cache": "bf16"})
    m.write(top / arc)
    data = (top / arc / MANIFEST).read_bytes()
    doc["files"][f"{arc}/{MANIFEST}"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    document = ReleaseDocument.model_validate(doc).canonical()
    (top / "release.json").write_bytes(document)
    tampered = tmp_path / "t.tar"  # packed as `invoke release` packs: headers and hashes all consistent
    write_tarball(tampered, document=document, files={rel: top / rel for rel in doc["files"]}, table=doc["files"])
    for target in (top, tampered):
        with pytest.raises(IntegrityError, match=rf"{arc}: precision bf16 \(this spec: fp8\); {arc}: kv_cache bf16 "
                                                 r"\(this spec: fp8\): packed from another build's output") as err:
            verify(target, check_host=False)
        assert err.value.exit_code == 3
