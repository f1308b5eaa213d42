"""Release packing: deterministic uncompressed tarballs from fabricated stage outputs (no real engines here)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import time

import pytest

from pipeline.core.artifacts import read_manifest
from pipeline.core.errors import IntegrityError
from pipeline.core.manifests import FileRecord
from pipeline.ops.release import FIXED_MTIME, RELEASE_JSON, ReleaseError, pack_release, release_output_dir
from tests.support.release_fixtures import fabricate_build


def test_two_releases_from_same_fabricated_inputs_have_identical_sha256(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    meta = {"version": "0.1.0", "spec": {"model": "tiny-llama"}}
    a = pack_release(name="rel", components=comps, metadata=meta, output_dir=tmp_path / "a")
    # Touch every source file (new mtimes, other modes) between the two releases: the tarball must not change.
    time.sleep(0.01)
    for p in (tmp_path / "out").rglob("*"):
        if p.is_file():
            os.utime(p, (time.time() + 100, time.time() + 100))
    b = pack_release(name="rel", components=comps, metadata=meta, output_dir=tmp_path / "b")
    assert a.sha256 == b.sha256
    assert a.tarball.read_bytes() == b.tarball.read_bytes()
    with tarfile.open(a.tarball) as tar:  # the identity: release.json's sha256, which lists every member's
        assert hashlib.sha256(tar.extractfile(f"rel/{RELEASE_JSON}").read()).hexdigest() == a.sha256
    assert a.sha256_file.read_text() == f"{a.sha256}  rel/{RELEASE_JSON}\n"
    (tmp_path / "x").mkdir()  # the sidecar checks an unpacked release with `sha256sum -c`
    subprocess.run(["tar", "-xf", str(a.tarball), "-C", str(tmp_path / "x")], check=True)
    subprocess.run(["sha256sum", "--check", "--quiet", str(a.sha256_file)], cwd=tmp_path / "x", check=True)


def test_tarball_entries_are_normalised_and_sorted(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    r = pack_release(name="rel", components=comps, metadata={}, output_dir=tmp_path / "r")
    raw = r.tarball.read_bytes()
    assert r.tarball.name == "rel.tar" and raw[:5] == b"rel/\0"  # uncompressed: the first header is the directory
    assert len(raw) % 10240 == 0 and raw[-1024:] == bytes(1024)  # end-of-archive blocks, whole tar records
    with tarfile.open(r.tarball, "r:") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[:2] == ["rel", f"rel/{RELEASE_JSON}"]
    assert names[2:] == sorted(names[2:])
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (FIXED_MTIME, 0, 0, "", "")
        assert m.mode in (0o644, 0o755)
    modes = {m.name: m.mode for m in members}
    assert modes["rel/triton_repo/tiny-llama-fp8-0123456789ab/preprocessing/1/model.py"] == 0o755
    assert modes["rel/triton_repo/tiny-llama-fp8-0123456789ab/ensemble/config.pbtxt"] == 0o644
    # Empty model version directories travel too: Triton refuses a model without one.
    for model in ("ensemble", "tensorrt_llm"):
        assert modes[f"rel/triton_repo/tiny-llama-fp8-0123456789ab/{model}/1"] == 0o755


def test_release_json_lists_sha256_of_every_file_including_manifests(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    r = pack_release(name="rel", components=comps, metadata={"version": "9"}, output_dir=tmp_path / "r")
    with tarfile.open(r.tarball) as tar:
        doc = json.loads(tar.extractfile(f"rel/{RELEASE_JSON}").read())
        files = {m.name[len("rel/"):]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    files.pop(RELEASE_JSON)
    assert set(doc["files"]) == set(files)
    assert "triton_repo/tiny-llama-fp8-0123456789ab/manifest.json" in doc["files"]
    for rel, content in files.items():
        assert doc["files"][rel] == {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}
    assert doc["format"] == 2 and doc["version"] == "9" and doc["name"] == "rel"
    with tarfile.open(r.tarball) as tar:  # the layout is recorded too: the tarball is a function of release.json
        members = tar.getmembers()
    assert doc["dirs"] == sorted(m.name[len("rel/"):] for m in members[1:] if m.isdir())
    assert doc["executable"] == sorted(m.name[len("rel/"):] for m in members if m.isfile() and m.mode == 0o755)
    assert "triton_repo/tiny-llama-fp8-0123456789ab/preprocessing/1/model.py" in doc["executable"]


def test_missing_component_is_refused_without_partial_tarball(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    comps["engines/x/draft_engine"] = tmp_path / "nope"
    with pytest.raises(ReleaseError, match="missing"):
        pack_release(name="rel", components=comps, metadata={}, output_dir=tmp_path / "r")
    assert not any((tmp_path / "r").glob("*")) if (tmp_path / "r").exists() else True


def test_symlink_in_component_is_refused(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    (comps["triton_repo/tiny-llama-fp8-0123456789ab"] / "link").symlink_to("/etc/passwd")
    with pytest.raises(ReleaseError, match="symlink"):
        pack_release(name="rel", components=comps, metadata={}, output_dir=tmp_path / "r")


def test_gnu_tar_lists_and_unpacks_the_release_byte_for_byte(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    r = pack_release(name="rel", components=comps, metadata={}, output_dir=tmp_path / "r")
    (tmp_path / "x").mkdir()
    subprocess.run(["tar", "-xf", str(r.tarball), "-C", str(tmp_path / "x")], check=True)
    for arc, src in comps.items():
        for f in src.rglob("*"):
            if f.is_file():
                assert (tmp_path / "x" / "rel" / arc / f.relative_to(src)).read_bytes() == f.read_bytes()
    assert json.loads((tmp_path / "x" / "rel" / RELEASE_JSON).read_text())["name"] == "rel"


def test_large_files_cross_copy_chunks_and_hash_as_packed(tmp_path, monkeypatch):
    """Files of several copy chunks (and not a multiple of one) keep their bytes and are hashed as packed."""
    monkeypatch.setattr("pipeline.ops.release.COPY_CHUNK", 4096)
    comps = fabricate_build(tmp_path / "out")
    ckpt = next(src for arc, src in comps.items() if arc.endswith("/checkpoint"))
    (ckpt / "rank1.safetensors").write_bytes(os.urandom(3 * 4096 + 100))
    r = pack_release(name="rel", components=comps, metadata={}, output_dir=tmp_path / "r")
    rel = next(rel for rel in r.document["files"] if rel.endswith("rank1.safetensors"))
    assert r.document["files"][rel]["sha256"] == hashlib.sha256((ckpt / "rank1.safetensors").read_bytes()).hexdigest()
    with tarfile.open(r.tarball) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("rank1.safetensors"))
        assert tar.extractfile(member).read() == (ckpt / "rank1.safetensors").read_bytes()


def test_a_file_that_changes_after_it_was_recorded_is_refused_while_packed(tmp_path):
    """Same size, other bytes: the recorded sha256 is used for release.json and checked as the file is copied."""
    comps = fabricate_build(tmp_path / "out")
    recorded = {arc: ("calibrate", {rel: FileRecord(**rec) for rel, rec in read_manifest(src)["files"].items()})
                for arc, src in comps.items()}
    ckpt = next(src for arc, src in comps.items() if arc.endswith("/checkpoint"))
    (ckpt / "rank0.safetensors").write_bytes(os.urandom(2048))  # the size the manifest records
    with pytest.raises(IntegrityError) as err:
        pack_release(name="bad", components=comps, metadata={}, output_dir=tmp_path / "r", recorded=recorded)
    msg = str(err.value)
    assert err.value.exit_code == 3 and "rank0.safetensors: sha256" in msg and "changed while it was packed" in msg
    assert "re-run `invoke build --force calibrate`" in msg and not (tmp_path / "r").exists()  # nothing, no dir


def test_release_output_is_any_directory_the_user_names(tmp_path, monkeypatch):
    root = tmp_path / "out"
    monkeypatch.setenv("PIPELINE_ROOT", str(root))
    assert release_output_dir(None) == root.resolve() / "releases"
    assert release_output_dir("rel/a") == root.resolve() / "rel" / "a"
    assert release_output_dir(str(tmp_path / "ci" / "artifacts")) == tmp_path / "ci" / "artifacts"  # outside: fine
    assert release_output_dir("../next-to-root") == tmp_path.resolve() / "next-to-root"  # the user typed it


def test_release_output_refuses_symlink_tricks_and_non_directories(tmp_path, monkeypatch):
    root = tmp_path / "out"
    root.mkdir()
    monkeypatch.setenv("PIPELINE_ROOT", str(root))
    (root / "releases").symlink_to(tmp_path / "victim", target_is_directory=True)  # planted in the output tree
    with pytest.raises(ReleaseError, match="a symlink inside the output tree"):
        release_output_dir("releases/x")
    (root / "file").write_text("x")
    with pytest.raises(ReleaseError, match="is not a directory"):
        release_output_dir("file")
    comps = fabricate_build(tmp_path / "b")
    out = tmp_path / "dest"
    out.mkdir()
    (out / "rel.tar").symlink_to(tmp_path / "victim.tar")  # the tarball name itself redirected
    with pytest.raises(ReleaseError, match="is not a regular file"):
        pack_release(name="rel", components=comps, metadata={}, output_dir=out)
    assert not (tmp_path / "victim.tar").exists()


def test_packed_files_must_match_their_stage_manifests(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    recorded = {arc: ("calibrate", {rel: FileRecord(**rec) for rel, rec in read_manifest(src)["files"].items()})
                for arc, src in comps.items()}
    assert pack_release(name="ok", components=comps, metadata={}, output_dir=tmp_path / "r", recorded=recorded)
    ckpt = next(src for arc, src in comps.items() if arc.endswith("/checkpoint"))
    (ckpt / "extra.bin").write_bytes(b"x")
    (ckpt / "rank0.safetensors").write_bytes(b"changed")
    with pytest.raises(IntegrityError) as err:
        pack_release(name="bad", components=comps, metadata={}, output_dir=tmp_path / "r", recorded=recorded)
    msg = str(err.value)
    assert err.value.exit_code == 3 and "rank0.safetensors: sha256" in msg and "extra.bin: not in the manifest" in msg
    assert "re-run `invoke build --force calibrate`" in msg and not (tmp_path / "r" / "bad.tar").exists()


def test_empty_release_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReleaseError, match="would hold no files"):
        pack_release(name="rel", components={"x": empty}, metadata={}, output_dir=tmp_path / "r")


def test_next_release_removes_a_killed_release_s_partial_tarball(tmp_path):
    """SIGKILL mid-release leaves `.tmp-<tarball>-<pid>`: the next release into that directory removes it (issue 22);
    a temporary of a live writer is kept."""
    from tests.support.dead_pid import dead_pid

    comps = fabricate_build(tmp_path / "out")
    out = tmp_path / "r"
    out.mkdir()
    dead, dead_sidecar = out / f".tmp-rel.tar-{dead_pid()}", out / f".tmp-rel.tar.sha256-{dead_pid()}"
    live = out / f".tmp-rel.tar-{os.getpid()}-other"
    for p in (dead, dead_sidecar, live):
        p.write_bytes(b"partial")
    r = pack_release(name="rel", components=comps, metadata={}, output_dir=out)
    assert not dead.exists() and not dead_sidecar.exists() and live.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(["rel.tar", "rel.tar.sha256", live.name])
    assert r.sha256_file.read_text() == f"{r.sha256}  rel/{RELEASE_JSON}\n"
