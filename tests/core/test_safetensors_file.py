"""Safetensors headers checked before the library parses them: the exact bad inputs, one line, exit 3."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from pipeline.core.errors import IntegrityError
from pipeline.core.safetensors_file import MAX_HEADER_BYTES, check_safetensors, load_safetensors

FIX = "re-fetch the model"


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(64, dtype=torch.float32), "b": torch.ones(8, 8)}, str(path))
    return path


def _refused(path, needle):
    with pytest.raises(IntegrityError) as err:
        load_safetensors(path, fix=FIX)
    msg = str(err.value)
    assert err.value.exit_code == 3 and needle in msg and msg.endswith(f"; {FIX}") and "\n" not in msg
    return msg


def test_a_valid_file_loads(good):
    check_safetensors(good, fix=FIX)
    assert torch.equal(load_safetensors(good, fix=FIX)["a"], torch.arange(64, dtype=torch.float32))


def test_header_length_2_pow_40_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    _refused(path, f"header length {2**40} bytes in a 10-byte file")


def test_header_length_over_the_cap_is_refused_even_in_a_large_enough_file(tmp_path):
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        f.truncate(MAX_HEADER_BYTES + 64)  # sparse: the size is there, the header length still too large
    _refused(path, f"header length {MAX_HEADER_BYTES + 1} bytes")


def test_a_file_cut_in_half_is_refused(good):
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    _refused(good, "truncated")


@pytest.mark.parametrize("body, needle", [
    (b"", "shorter than the 8-byte header length"),
    (b"\x05\x00", "shorter than the 8-byte header length"),
    (struct.pack("<Q", 4) + b"\xff\xfe{}", "the header is not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 22) + b'{"t": {"dtype": "F32"}}'[:22], "the header is not JSON"),
])
def test_malformed_headers(tmp_path, body, needle):
    path = tmp_path / "x.safetensors"
    path.write_bytes(body)
    _refused(path, needle)


def test_offsets_past_the_data_are_refused(tmp_path):
    header = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 8)
    _refused(path, "ends at byte 16 of 8 data bytes: truncated")
