"""Output-tree helpers: atomic directories, path containment, manifests, stage keys."""

from __future__ import annotations

import pytest

from pipeline.artifacts import (
    atomic_dir,
    file_table,
    is_current,
    read_manifest,
    safe_join,
    stage_key,
    write_manifest,
)
from pipeline.errors import PipelineError


def test_atomic_dir_success_replaces(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
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
    assert table["d/f"] == {"sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "size": 3}
