"""Output-tree helpers: atomic directories, path containment, manifests, stage keys."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.core.artifacts import (
    atomic_dir,
    check_files,
    check_name,
    file_table,
    is_current,
    read_manifest,
    remove_stale_temps,
    safe_join,
    stage_key,
    write_manifest,
)
from pipeline.core.errors import PipelineError
from pipeline.core.manifests import FileRecord


def test_atomic_dir_success_replaces(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    (final / "manifest.json").write_text("{}")
    with atomic_dir(final) as tmp:
        (tmp / "new.txt").write_text("new")
        assert not (final / "new.txt").exists()
    assert (final / "new.txt").read_text() == "new" and not (final / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_failure_leaves_nothing(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("parts", [("..", "etc"), ("/etc/passwd",), ("a", "..", "..", "b")])
def test_safe_join_refuses_escape(tmp_path, parts):
    with pytest.raises(PipelineError, match="escapes the output tree"):
        safe_join(tmp_path, *parts)


def test_safe_join_refuses_symlink_escape(tmp_path):
    (tmp_path / "link").symlink_to("/")
    with pytest.raises(PipelineError):
        safe_join(tmp_path, "link", "etc")
    assert safe_join(tmp_path, "a", "b") == tmp_path.resolve() / "a" / "b"


def test_manifest_roundtrip_and_currency(tmp_path):
    key = stage_key({"b": 1, "a": [1, 2]})
    assert key == stage_key({"a": [1, 2], "b": 1})
    assert key != stage_key({"a": [1, 2], "b": 2})
    assert not is_current(tmp_path, key)
    write_manifest(tmp_path, {"key": key, "x": 1})
    assert read_manifest(tmp_path)["x"] == 1 and is_current(tmp_path, key)
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(PipelineError, match="corrupt"):
        read_manifest(tmp_path)


def test_file_table(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"abc")
    write_manifest(tmp_path, {})
    table = file_table(tmp_path)
    assert list(table) == ["d/f"]
    assert table["d/f"] == {"sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "size": 3,
                            "mtime_ns": (tmp_path / "d" / "f").stat().st_mtime_ns}
    (tmp_path / "link").symlink_to(tmp_path / "d" / "f")
    with pytest.raises(PipelineError, match="is a symlink"):
        file_table(tmp_path)


def _table(root):
    return {rel: FileRecord(**rec) for rel, rec in file_table(root).items()}


@pytest.fixture
def output(tmp_path):
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 100)
    (root / "sub" / "b.txt").write_text("bee")
    return root


def test_check_files_matches_then_sees_each_kind_of_change(output, tmp_path):
    table = _table(output)
    assert check_files(output, table) == [] and check_files(output, table, full=True) == []
    a = output / "a.bin"
    st = a.stat()
    a.write_bytes(b"b" * 100)  # same size, new mtime: hashed
    assert check_files(output, table) == [f"a.bin: sha256 {_sha(a)[:12]}… != recorded {table['a.bin'].sha256[:12]}…"]
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: only a full check sees it
    assert check_files(output, table) == [] and len(check_files(output, table, full=True)) == 1
    a.write_bytes(b"a" * 10)
    assert check_files(output, table) == ["a.bin: 10 bytes, recorded 100"]
    a.unlink()
    (output / "extra").write_text("x")
    (output / "sub" / "link").symlink_to(tmp_path)
    assert check_files(output, table) == ["extra: not in the manifest", "sub/link: a symlink (outputs hold regular "
                                          "files only)", "a.bin: missing"]


def _sha(p):
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("rel", ["../secret", "/etc/passwd", "sub/../../x", "a//b"])
def test_check_files_never_reads_a_listed_path_outside(output, rel):
    table = {**_table(output), rel: FileRecord(sha256="0" * 64, size=1)}
    assert check_files(output, table) == [f"{rel}: outside the directory"]


@pytest.mark.parametrize("name", ["../../escape", "/abs", "a/b", "..", "", ".hidden", "x" * 129, "a b", 3])
def test_check_name_refuses_path_like_names(name):
    with pytest.raises(PipelineError, match="is not a safe name"):
        check_name(name, what="model name", fix="rename it")
    assert check_name("llama-3.1_8b+fp8", what="x", fix="y") == "llama-3.1_8b+fp8"


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    final = tmp_path / "checkpoint"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = tmp_path / f".tmp-checkpoint-{pid}-123"
    (stale / "deep").mkdir(parents=True)
    old = tmp_path / f".old-checkpoint-{pid}-9"
    old.mkdir()
    live = tmp_path / f".tmp-checkpoint-{os.getpid()}-5"  # this process is alive: kept
    live.mkdir()
    other = tmp_path / f".tmp-checkpoint2-{pid}-1"  # another output's temporary: not ours
    other.mkdir()
    with atomic_dir(final) as tmp:
        (tmp / "f").write_text("ok")
    assert not stale.exists() and not old.exists() and live.exists() and other.exists()
    assert remove_stale_temps(final) == []


def test_a_cached_rerun_removes_a_killed_run_s_temporaries(tmp_path):
    """The shared cache check (`Manifest.current`) cleans what a dead run left beside the output, even when the
    output is current and nothing is rebuilt; a live process's temporary is kept (issue 22)."""
    from pipeline.core.artifacts import file_table, write_manifest
    from pipeline.core.manifests import Manifest
    from tests.support.dead_pid import dead_pid

    final = tmp_path / "checkpoint"
    final.mkdir()
    (final / "rank0.safetensors").write_bytes(b"weights")
    write_manifest(final, {"stage": "calibrate", "key": "k", "files": file_table(final)})
    dead_tmp, dead_old = tmp_path / f".tmp-checkpoint-{dead_pid()}-1", tmp_path / f".old-checkpoint-{dead_pid()}-2"
    live_tmp = tmp_path / f".tmp-checkpoint-{os.getpid()}-3"
    for d in (dead_tmp, dead_old, live_tmp):
        d.mkdir()
        (d / "rank0.safetensors").write_bytes(b"half")
    assert Manifest.current(final, "k") is not None  # cached
    assert not dead_tmp.exists() and not dead_old.exists() and live_tmp.exists()


def test_atomic_dir_never_replaces_a_directory_without_its_marker(tmp_path):
    """A stage output path that holds someone else's directory (e.g. `package --output` onto it) is refused, exit 2,
    before anything is written beside it (issue 33)."""
    final = tmp_path / "repo"
    final.mkdir()
    (final / "mine.txt").write_text("keep")
    with pytest.raises(PipelineError, match=r"repo was not written by this pipeline \(no manifest.json\)") as e:
        with atomic_dir(final):
            pytest.fail("nothing may be written")
    assert e.value.exit_code == 2 and (final / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_atomic_dir_never_replaces_home_even_with_a_manifest(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "manifest.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    for final in (home, tmp_path):
        with pytest.raises(PipelineError, match="\\$HOME"), atomic_dir(final):
            pytest.fail("nothing may be written")
    assert (home / "manifest.json").is_file()
