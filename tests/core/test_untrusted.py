"""The one reader of untrusted files: regular files only, a cap checked while reading, JSON/YAML limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.untrusted import MAX_INT_DIGITS, load_yaml_mapping, parse_json, read_bytes

DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.fixture(autouse=True)
def _deadline(deadline):
    """Every test here fails instead of hanging (conftest's `deadline`)."""


def read(path, cap=1024):
    return read_bytes(path, cap=cap, what=f"--thing {path}", fix="pass a file", error=SpecError)


def test_a_regular_file_is_read_whole(tmp_path):
    (f := tmp_path / "a.json").write_bytes(b"x" * 1024)
    assert read(f) == b"x" * 1024


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_what_is_not_a_regular_file_is_refused_without_reading(tmp_path, kind):
    path = {"fifo": tmp_path / "f", "device": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(SpecError) as exc:
        read(path)
    word = {"fifo": "a FIFO", "device": "a character device", "directory": "a directory"}[kind]
    assert str(exc.value) == f"--thing {path} is {word}, not a regular file; pass a file"
    assert exc.value.exit_code == 2


def test_a_symlink_to_a_regular_file_is_followed(tmp_path):
    (tmp_path / "a").write_bytes(b"{}")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert read(tmp_path / "b") == b"{}"


def test_an_oversized_file_is_refused_at_the_cap(tmp_path):
    (f := tmp_path / "big").write_bytes(b"x" * 1025)
    with pytest.raises(SpecError, match=r"is over the 1,024-byte limit; pass a file$"):
        read(f)


def test_a_missing_file_is_left_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        read(tmp_path / "absent")


@pytest.mark.parametrize("text, needle", [
    (DEEP_JSON, "nested too deeply"),
    ('{"a": ' + "1" * 5000 + "}", f"more than {MAX_INT_DIGITS} digits"),
    ('[-' + "9" * (MAX_INT_DIGITS + 1) + "]", f"more than {MAX_INT_DIGITS} digits"),
])
def test_json_too_deep_or_with_a_huge_integer_is_one_line(text, needle):
    with pytest.raises(SpecError, match=needle) as exc:
        parse_json(text, what="--thing x", fix="pass a file", error=SpecError)
    assert "\n" not in str(exc.value) and str(exc.value).endswith("; pass a file")


def test_json_within_the_limits_parses_as_json_loads():
    text = '{"n": -' + "9" * MAX_INT_DIGITS + ', "x": [[[1.5]]], "s": "' + "[" * 5000 + '"}'
    assert parse_json(text, what="x", fix="y") == {"n": -int("9" * MAX_INT_DIGITS), "x": [[[1.5]]],
                                                   "s": "[" * 5000}


def yaml_file(tmp_path, text: str) -> Path:
    (f := tmp_path / "spec.yaml").write_text(text)
    return f


@pytest.mark.parametrize("text, needle", [
    ("? [a, b]\n: 1\n", "complex key"),
    ("? {a: 1}\n: 1\n", "complex key"),
    ("a: 1\na: 2\n", "duplicate key 'a'"),
    ("a: " + "1" * 5000 + "\n", f"integer of more than {MAX_INT_DIGITS} digits"),
    ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid YAML"),
])
def test_yaml_refusals_are_one_line(tmp_path, text, needle):
    with pytest.raises(SpecError, match=needle) as exc:
        load_yaml_mapping(yaml_file(tmp_path, text), what="spec file", flag="--spec", cap=1 << 20, error=SpecError)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_yaml_from_a_fifo_or_over_the_cap_is_refused(tmp_path):
    os.mkfifo(fifo := tmp_path / "fifo.yaml")
    with pytest.raises(SpecError, match="is a FIFO, not a regular file; pass a YAML file to --spec"):
        load_yaml_mapping(fifo, what="spec file", flag="--spec", cap=1 << 20, error=SpecError)
    with pytest.raises(SpecError, match="is over the 16-byte limit"):
        load_yaml_mapping(yaml_file(tmp_path, "model: tiny-llama\n"), what="spec file", flag="--spec", cap=16,
                          error=SpecError)


def test_yaml_within_the_limits_loads(tmp_path):
    f = yaml_file(tmp_path, "model: tiny-llama\nlimits: {max_batch: 8}\nn: " + "9" * MAX_INT_DIGITS + "\n")
    assert load_yaml_mapping(f, what="spec file", flag="--spec", cap=1 << 20, error=SpecError) == {
        "model": "tiny-llama", "limits": {"max_batch": 8}, "n": int("9" * MAX_INT_DIGITS)}
