"""verify: hashes of tarballs, unpacked releases and Triton repos; toolchain/GPU refusal (fabricated inputs)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import tarfile

import pytest

from pipeline.core.artifacts import file_table, write_manifest
from pipeline.core.errors import CorruptArtifactError, PipelineError, VerifyError
from pipeline.ops.release import pack_release
from pipeline.ops.release_verify import HashMismatchError, HostInfo, HostMismatchError, verify
from tests.support.release_fixtures import fabricate_build, format1_release

MATCHING_HOST = HostInfo(tensorrt_llm="1.2.1", tensorrt="10.14.1.48", sm=90)


@pytest.fixture
def fabricated_release(tmp_path):
    comps = fabricate_build(tmp_path / "out")
    return pack_release(name="rel", components=comps, metadata={"version": "1"}, output_dir=tmp_path / "r")


def _flip_byte(path, offset=-100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _unpack(tarball, dest):
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    return dest / "rel"


def test_fabricated_release_tarball_verifies_then_fails_after_one_byte_flip(fabricated_release, tmp_path):
    report = verify(fabricated_release.tarball, host=MATCHING_HOST)
    assert report.ok and report.kind == "tarball" and report.files_checked > 10 and report.host_checked
    _flip_byte(fabricated_release.tarball)
    with pytest.raises(VerifyError) as exc:
        verify(fabricated_release.tarball, host=MATCHING_HOST)
    assert exc.value.exit_code == 3  # integrity: unreadable or files differ


def test_fabricated_unpacked_release_detects_changed_missing_and_extra_files(fabricated_release, tmp_path):
    root = _unpack(fabricated_release.tarball, tmp_path / "x")
    assert verify(root, host=MATCHING_HOST).ok
    engine = next(root.rglob("rank0.engine"))
    _flip_byte(engine, 10)
    repo = next((root / "triton_repo").iterdir())
    (repo / "ensemble" / "config.pbtxt").unlink()
    (repo / "extra.txt").write_text("x")
    with pytest.raises(HashMismatchError) as exc:
        verify(root, host=MATCHING_HOST)
    problems = exc.value.report.mismatches
    assert any("rank0.engine: sha256" in p for p in problems)
    assert any("ensemble/config.pbtxt: missing" in p for p in problems)
    assert any("extra.txt: not in the manifest" in p for p in problems)
    assert exc.value.exit_code == 3


@pytest.mark.parametrize(
    "host, needle",
    [
        (HostInfo(tensorrt_llm="1.3.0", tensorrt="10.14.1.48", sm=90),
         "TensorRT-LLM: engine built with 1.2.1, host has 1.3.0"),
        (HostInfo(tensorrt_llm="1.2.1", tensorrt="10.13.3.9", sm=90), "TensorRT: engine built with 10.14.1.48"),
        (HostInfo(tensorrt_llm="1.2.1", tensorrt="10.14.1.48", sm=80), "SM 9.0, host GPU is SM 8.0"),
    ],
)
def test_fabricated_engine_toolchain_or_arch_mismatch_refused(fabricated_release, tmp_path, host, needle):
    for target in (fabricated_release.tarball, _unpack(fabricated_release.tarball, tmp_path / "x")):
        with pytest.raises(HostMismatchError) as exc:
            verify(target, host=host)
        assert needle in str(exc.value)
        assert exc.value.exit_code == 4


def test_unknown_host_skips_host_check_with_a_note(fabricated_release):
    report = verify(fabricated_release.tarball, host=HostInfo())
    assert report.ok and not report.host_checked
    assert any("skipped" in n for n in report.notes)


def test_partly_known_host_checks_what_it_has_and_notes_the_rest(fabricated_release):
    report = verify(fabricated_release.tarball, host=HostInfo(sm=90))  # GPU visible, no TensorRT-LLM here
    assert report.ok and report.host_checked
    assert any("no TensorRT-LLM, TensorRT on this host: not compared" in n for n in report.notes)
    with pytest.raises(HostMismatchError, match="host GPU is SM 8.0"):
        verify(fabricated_release.tarball, host=HostInfo(sm=80))


def test_sha256_sidecar_mismatch_is_reported(fabricated_release):
    fabricated_release.sha256_file.write_text("0" * 64 + "  rel/release.json\n")
    with pytest.raises(HashMismatchError, match="rel.tar: release.json sha256 .* != rel.tar.sha256 000000000000"):
        verify(fabricated_release.tarball, host=MATCHING_HOST)


def test_pinned_sha256_is_checked_in_the_same_pass(fabricated_release):
    assert verify(fabricated_release.tarball, host=MATCHING_HOST, sha256=fabricated_release.sha256).ok
    with pytest.raises(HashMismatchError, match="rel.tar: release.json sha256 .* != --sha256 ababababab"):
        verify(fabricated_release.tarball, host=MATCHING_HOST, sha256="ab" * 32)
    with pytest.raises(VerifyError, match="--sha256 'ABC': give the 64 lowercase hex digits") as err:
        verify(fabricated_release.tarball, host=MATCHING_HOST, sha256="ABC")
    assert err.value.exit_code == 2


def _offset(tarball, suffix: str, data: bool = True) -> int:
    with tarfile.open(tarball) as tar:
        m = next(m for m in tar.getmembers() if m.name.endswith(suffix))
    return m.offset_data if data else m.offset


def test_a_changed_member_fails_its_own_hash_and_release_json_still_pins_the_rest(fabricated_release):
    _flip_byte(fabricated_release.tarball, _offset(fabricated_release.tarball, "rank0.engine") + 10)
    with pytest.raises(HashMismatchError) as err:
        verify(fabricated_release.tarball, host=MATCHING_HOST, sha256=fabricated_release.sha256)
    problems = err.value.report.mismatches
    assert len(problems) == 1 and "rank0.engine: sha256" in problems[0] and err.value.exit_code == 3


def test_a_changed_release_json_fails_the_pin(fabricated_release):
    """release.json edited to match tampered files (same size): its sha256 is the identity the sidecar pins."""
    at = _offset(fabricated_release.tarball, "rel/release.json")
    raw = fabricated_release.tarball.read_bytes()
    i = raw.index(b'"version": "1"', at)
    _flip_byte(fabricated_release.tarball, i + len('"version": "'))  # "1" -> "0"
    with pytest.raises(HashMismatchError, match="release.json sha256 .* != rel.tar.sha256"):
        verify(fabricated_release.tarball, host=MATCHING_HOST)


@pytest.mark.parametrize("where, needle", [
    ("mode", "model.py: header differs from the one `invoke release` writes"),
    ("mtime", "config.pbtxt: header differs"),
    ("padding", "header differs"),
    ("trailing", "the end of the archive differs"),
    ("cut", "the end of the archive differs"),
])
def test_every_byte_outside_the_members_is_the_canonical_one(fabricated_release, where, needle):
    """The tarball is a function of release.json: a header, padding or end that differs is exit 3, so the pin on
    release.json pins the whole tarball (what tar unpacks is exactly what was verified)."""
    tarball = fabricated_release.tarball
    raw = bytearray(tarball.read_bytes())
    if where in ("mode", "mtime"):  # a valid header (its checksum redone) that tarfile reads as a plain member
        at = _offset(tarball, "preprocessing/1/model.py" if where == "mode" else "ensemble/config.pbtxt", data=False)
        raw[at + (100 + 6 if where == "mode" else 136)] = ord("4" if where == "mode" else "2")  # 0755->0754; mtime
        raw[at + 148:at + 156] = b" " * 8
        raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + 512])
    elif where == "padding":  # the zero bytes after a member's contents
        with tarfile.open(tarball) as tar:
            m = next(m for m in tar.getmembers() if m.isfile() and m.size % 512)
        raw[m.offset_data + m.size] = ord("x")
    elif where == "trailing":
        raw += b"\0" * 512 + b"x"
    else:
        del raw[-512:]
    tarball.write_bytes(bytes(raw))
    with pytest.raises(HashMismatchError) as err:
        verify(tarball, host=MATCHING_HOST)
    assert err.value.exit_code == 3 and needle in str(err.value)


def test_a_compressed_format_2_release_is_refused(fabricated_release, tmp_path):
    gz = tmp_path / "rel.tar.gz"
    gz.write_bytes(gzip.compress(fabricated_release.tarball.read_bytes(), mtime=0))
    with pytest.raises(CorruptArtifactError, match="a compressed format-2 release; `invoke release` writes an "
                                                   "uncompressed .tar") as err:
        verify(gz, host=MATCHING_HOST)
    assert err.value.exit_code == 3


def test_an_earlier_tarball_pinned_release_still_verifies(fabricated_release, tmp_path):
    (tmp_path / "old").mkdir()
    old = format1_release(fabricated_release.tarball, tmp_path / "old" / "rel.tar")
    pinned = hashlib.sha256(old.read_bytes()).hexdigest()
    assert old.with_name("rel.tar.sha256").read_text().split()[0] == pinned
    assert verify(old, host=MATCHING_HOST, sha256=pinned).ok
    with pytest.raises(HashMismatchError, match=r"rel.tar: sha256 .* != --sha256 000000000000"):
        verify(old, host=MATCHING_HOST, sha256="0" * 64)
    _flip_byte(old, _offset(old, "rank0.engine") + 10)  # inside a member: that member's hash, and the tarball's
    with pytest.raises(HashMismatchError) as err:
        verify(old, host=MATCHING_HOST)
    problems = err.value.report.mismatches
    assert len(problems) == 2 and problems[0].startswith("rel.tar: sha256 ") and "!= rel.tar.sha256" in problems[0]
    assert problems[1].startswith("engines/") and "rank0.engine: sha256" in problems[1]


def test_gzip_release_of_an_earlier_version_still_verifies(fabricated_release, tmp_path):
    old = format1_release(fabricated_release.tarball, tmp_path / "rel.tar")
    gz = tmp_path / "rel.tar.gz"
    gz.write_bytes(gzip.compress(old.read_bytes(), mtime=0))
    pinned = hashlib.sha256(gz.read_bytes()).hexdigest()
    (tmp_path / "rel.tar.gz.sha256").write_text(f"{pinned}  rel.tar.gz\n")
    assert verify(gz, host=MATCHING_HOST, sha256=pinned).ok
    with pytest.raises(HashMismatchError, match=r"rel.tar.gz: sha256 .* != --sha256 ababababab"):
        verify(gz, host=MATCHING_HOST, sha256="ab" * 32)


@pytest.mark.parametrize("relative", [True, False])
def test_fabricated_triton_repo_with_manifests_and_engine_path(tmp_path, relative):
    comps = fabricate_build(tmp_path / "out")
    repo = next(v for k, v in comps.items() if k.startswith("triton_repo/"))
    engine = next(v for k, v in comps.items() if k.endswith("/engine"))
    path = f"../../../engines/{engine.parent.name}/engine" if relative else str(engine)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(
        'name: "tensorrt_llm"\nparameters: {\n  key: "gpt_model_path"\n  value: { string_value: "%s" }\n}\n' % path
    )
    write_manifest(repo, {"key": "k", "files": file_table(repo)})
    report = verify(repo, host=MATCHING_HOST)
    assert report.kind == "triton_repo" and report.host_checked and report.engines[0]["tensorrt_llm"] == "1.2.1"
    with pytest.raises(HostMismatchError):
        verify(repo, host=HostInfo(sm=89))
    _flip_byte(engine / "rank0.engine", 5)
    with pytest.raises(HashMismatchError, match="rank0.engine"):
        verify(repo, host=MATCHING_HOST)


def test_not_a_release_is_refused(tmp_path):
    with pytest.raises(VerifyError, match="does not exist"):
        verify(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VerifyError, match="neither release.json"):
        verify(tmp_path / "empty")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(VerifyError, match="not a readable release tarball"):
        verify(bad)
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        f = tmp_path / "f.txt"
        f.write_text(json.dumps({}))
        tar.add(f, "x/f.txt")
    with pytest.raises(VerifyError, match="has no release.json"):
        verify(plain)


# --- runtime pytorch: TensorRT-LLM version checked, no engine or SM pinning ----------------------------------------


@pytest.fixture
def pytorch_release(tmp_path):
    ck = tmp_path / "out" / "engines" / "b1" / "hf_checkpoint"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    (ck / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "FP8"}}')
    write_manifest(ck, {"key": "k-hf", "files": file_table(ck)})
    meta = {"version": "1", "build_id": "b1", "runtime": "pytorch",
            "serving": {"runtime": "pytorch", "tensorrt_llm": "1.2.1", "sm_pinned": False}}
    return pack_release(name="rel", components={"engines/b1/hf_checkpoint": ck}, metadata=meta,
                        output_dir=tmp_path / "r")


def test_pytorch_release_checks_the_trtllm_version_but_not_the_sm(pytorch_release):
    report = verify(pytorch_release.tarball, host=HostInfo(tensorrt_llm="1.2.1", tensorrt=None, sm=80))
    assert report.ok and report.host_checked
    assert report.engines == [{"path": "engines/b1/hf_checkpoint", "tensorrt_llm": "1.2.1", "tensorrt": None,
                               "sm": None, "built": "HF checkpoint and LLM-API options written for"}]
    with pytest.raises(HostMismatchError, match="TensorRT-LLM: HF checkpoint and LLM-API options written for 1.2.1, "
                                                 "host has 1.3.0") as exc:
        verify(pytorch_release.tarball, host=HostInfo(tensorrt_llm="1.3.0", tensorrt=None, sm=90))
    assert exc.value.exit_code == 4


# --- crafted members: refused before their bytes are read (issue 22) ----------------------------------------------
def _member(name: str, data: bytes = b"", **fields) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    return info.tobuf(tarfile.PAX_FORMAT) + data + bytes(-len(data) % 512)


def _crafted(path, member: bytes, files: dict[str, int]) -> str:
    """An uncompressed tarball: release.json (recording `files`: name -> size) first, then `member`."""
    doc = json.dumps({"format": 1, "name": "r", "files": {n: {"sha256": "0" * 64, "size": size}
                                                         for n, size in files.items()}}).encode()
    path.write_bytes(_member("r/release.json", doc, mode=0o644) + member + bytes(1024))
    return str(path)


BAD_MEMBERS = {
    "setuid": (_member("r/bin/tool", b"#!/bin/sh\n", mode=0o4755), "setuid/setgid mode 4755"),
    "setgid": (_member("r/bin/tool", b"#!/bin/sh\n", mode=0o2755), "setuid/setgid mode 2755"),
    "world-writable": (_member("r/bin/tool", b"#!/bin/sh\n", mode=0o666), "world-writable mode 666"),
    "world-writable dir": (_member("r/bin", type=tarfile.DIRTYPE, mode=0o777), "bin: world-writable mode 777"),
    "symlink": (_member("r/bin/tool", type=tarfile.SYMTYPE, linkname="/etc/passwd", mode=0o644), "bin/tool: a link"),
    "hard link": (_member("r/bin/tool", type=tarfile.LNKTYPE, linkname="r/release.json", mode=0o644), "a link"),
    "char device": (_member("r/bin/tool", type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o644),
                    "bin/tool: a device or special file"),
    "fifo": (_member("r/bin/tool", type=tarfile.FIFOTYPE, mode=0o644), "a device or special file"),
}


@pytest.mark.parametrize("case", list(BAD_MEMBERS))
def test_special_or_privileged_members_are_refused(tmp_path, case):
    member, needle = BAD_MEMBERS[case]
    tarball = _crafted(tmp_path / "r.tar", member, {"bin/tool": 10})
    with pytest.raises(HashMismatchError) as err:
        verify(tarball, check_host=False)
    assert err.value.exit_code == 3 and needle in str(err.value) and "\n" not in str(err.value)


def test_a_10_gib_member_in_a_4_kb_tarball_is_refused_before_it_is_read(tmp_path):
    tarball = _crafted(tmp_path / "r.tar", _declared("r/big.bin", 10 << 30), {"big.bin": 4})
    assert (tmp_path / "r.tar").stat().st_size < 4096
    with pytest.raises(CorruptArtifactError, match=r"members declare more bytes than release.json records "
                                                   r"\(big.bin declares 10737418240\)") as err:
        verify(tarball, check_host=False)
    assert err.value.exit_code == 3


def _declared(name: str, size: int) -> bytes:
    """A member header declaring `size` bytes, none of which follow."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.PAX_FORMAT)


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar writes the sparse member")
def test_a_gnu_sparse_10_gib_member_is_refused_at_once(tmp_path):
    src = tmp_path / "r"
    src.mkdir()
    doc = {"format": 1, "name": "r", "files": {"big.bin": {"sha256": "0" * 64, "size": 4}}}
    (src / "release.json").write_text(json.dumps(doc))
    with open(src / "big.bin", "wb") as f:
        f.truncate(10 << 30)  # a hole: no disk space
    tarball = tmp_path / "r.tar"
    subprocess.run(["tar", "-c", "-S", "-b", "1", "-f", str(tarball), "-C", str(tmp_path), "r/release.json",
                    "r/big.bin"], check=True)
    assert tarball.stat().st_size < 4096
    with pytest.raises(PipelineError) as err:
        verify(tarball, check_host=False)
    assert err.value.exit_code == 3 and "big.bin" in str(err.value)
