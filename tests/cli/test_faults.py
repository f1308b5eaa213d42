"""Fault injection on a real (tiny, CPU) build: corrupted stage outputs, killed stages, tampered repositories and
releases, path-escaping names, write failures. Every case ends in one line and a documented exit code, never a
traceback, and nothing corrupt is reused or released.

One lean build of tiny-llama fp8 (reference target) per module (the `slow` tests); each test works on its own copy
of that output tree (copies keep file mtimes, so the copy is as current as the original). The crafted-tarball tests
need no build.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pipeline.core.errors import IntegrityError, PipelineError
from pipeline.core.spec import resolve_spec
from pipeline.ops.release import release
from pipeline.ops.release_verify import verify
from pipeline.stages.build import build

ROOT = Path(__file__).resolve().parents[2]
LEAN = ["--calib-size", "2", "--calib-seq-len", "32", "--no-quality-gate"]
SPEC = ["--model", "tiny-llama", "--precision", "fp8", "--target", "reference", *LEAN]
SPEC_KW = dict(model="tiny-llama", precision="fp8", target="reference", calib_size=2, calib_seq_len=32,
               quality_gate=False)



def spec(**extra):
    return resolve_spec(**SPEC_KW, **extra)


def temporaries(*roots: Path) -> list[str]:
    """Every temporary (.tmp-*, .old-*, .partial-*) below `roots`: what a killed stage may leave behind."""
    return sorted(str(p) for r in roots if r.exists() for p in r.rglob("*")
                  if p.name.startswith((".tmp-", ".old-", ".partial-")))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_models):
    """One finished build (download, calibrate, package) in its own PIPELINE_ROOT/PIPELINE_CACHE."""
    base = tmp_path_factory.mktemp("faults")
    root, cache = base / "out", base / "cache"
    for path in tiny_models.values():  # copies, not links: some tests corrupt the generated model
        shutil.copytree(path, cache / "generated" / path.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPELINE_ROOT", str(root))
        mp.setenv("PIPELINE_CACHE", str(cache))
        report = build(spec(), progress=None)
    return base, report.outputs


@pytest.fixture
def tree(pristine, tmp_path, monkeypatch):
    """A private copy of the finished build, selected by PIPELINE_ROOT/PIPELINE_CACHE for this test."""
    base, outputs = pristine
    for name in ("out", "cache"):
        shutil.copytree(base / name, tmp_path / name, symlinks=True)
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path / "out"), PIPELINE_CACHE=str(tmp_path / "cache"))

    def moved(path: Path) -> Path:  # the same output inside this copy
        return tmp_path / Path(path).relative_to(base)

    return {"root": tmp_path / "out", "cache": tmp_path / "cache", "env": env, "moved": moved,
            "checkpoint": moved(outputs.checkpoint.path), "repo": moved(outputs.triton_repo.path),
            "model": moved(outputs.download.path)}


def invoke(*args: str, env: dict, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def one_line(r: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The error line of a failed command: exactly one besides `build`'s progress lines, no traceback."""
    lines = [ln for ln in r.stderr.strip().splitlines()
             if not ln.startswith("[") and not re.match(r"\w+: skipped \(", ln)]  # progress lines
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def flip(path: Path, *, keep_mtime: bool = False) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def delete(path: Path) -> None:
    path.unlink()


# --- corruption of each stage's output: build refuses to reuse it, release refuses to pack it --------------------
STAGE_FILES = {  # stage -> (output key in `tree`, a file of that output, the --force hint)
    "download": ("model", "model.safetensors", "--force download"),
    "calibrate": ("checkpoint", "rank0.safetensors", "--force calibrate"),
    "calibrate-tokenizer": ("checkpoint", "tokenizer/tokenizer.json", "--force calibrate"),
    "package": ("repo", "tensorrt_llm/config.pbtxt", "--force package"),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", [flip, truncate, delete], ids=["flip", "truncate", "delete"])
@pytest.mark.parametrize("stage", list(STAGE_FILES))
def test_corrupt_stage_output_is_never_reused_or_released(tree, stage, fault):
    where, rel, hint = STAGE_FILES[stage]
    fault(tree[where] / rel)
    for call in (lambda: build(spec(), progress=None), lambda: release(spec(), version="1.0")):
        with pytest.raises(IntegrityError) as err:
            call()
        msg = str(err.value)
        assert err.value.exit_code == 3 and "\n" not in msg and rel in msg and hint in msg, msg
    assert not (tree["root"] / "releases").exists()


@pytest.mark.slow
def test_corruption_under_a_kept_mtime_is_caught_by_release_and_build_verify(tree):
    """The reuse check trusts sizes and mtimes; `release` re-hashes every file it packs, `build --verify` too."""
    flip(tree["checkpoint"] / "rank0.safetensors", keep_mtime=True)
    assert build(spec(), progress=None).noop  # documented fast path
    line = one_line(invoke("release", *SPEC, env=tree["env"]), 3, "rank0.safetensors: sha256", "--force calibrate")
    assert "nothing was released" in line and not (tree["root"] / "releases").exists()
    one_line(invoke("build", *SPEC, "--verify", env=tree["env"]), 3, "rank0.safetensors", "--force calibrate")


@pytest.mark.slow
def test_force_rebuilds_a_corrupt_checkpoint_and_the_release_then_verifies(tree):
    flip(tree["checkpoint"] / "rank0.safetensors")
    one_line(invoke("build", *SPEC, env=tree["env"]), 3, "--force calibrate")
    report = build(spec(), force="calibrate", progress=None)
    assert {s.stage: s.status for s in report.stages}["calibrate"] == "built"
    assert verify(release(spec(), version="1.0").tarball, check_host=False).ok


@pytest.mark.slow
def test_extra_file_in_a_checkpoint_is_refused(tree):
    (tree["checkpoint"] / "rank1.safetensors").write_bytes(b"planted")
    with pytest.raises(IntegrityError, match=r"rank1\.safetensors: not in the manifest"):
        build(spec(), progress=None)


# --- SIGKILL mid-stage, then re-run: correct result, no leftovers ----------------------------------------------
PAUSE = """
import os, sys, time
import {module} as m
report = os.fdopen(os.dup(1), "w")  # the parent's pipe: stages send fds 1 and 2 to their log while they run
real = m.{function}
def paused(*args, **kwargs):
    out = real(*args, **kwargs)
    print("paused", file=report, flush=True)
    time.sleep(600)
    return out
m.{function} = paused
{call}
"""


def kill_when_paused(code: str, env: dict) -> None:
    """Run `code` in a child; SIGKILL it (whole process group) as soon as it reports being mid-stage."""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "paused", (line, proc.stderr.read()[-3000:] if proc.poll() is not None else "")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_sigkill_mid_calibrate_then_rerun(tree):
    shutil.rmtree(tree["checkpoint"].parent)
    call = ("from pipeline.stages.build import build; from pipeline.core.spec import resolve_spec; "
            f"build(resolve_spec(**{SPEC_KW!r}), progress=None)")
    kill_when_paused(PAUSE.format(module="pipeline.stages.calibrate.stage", function="_build", call=call), tree["env"])
    assert temporaries(tree["root"])  # the killed stage left its temporary checkpoint...
    report = build(spec(), progress=None)
    assert {s.stage: s.status for s in report.stages}["calibrate"] == "built"
    assert temporaries(tree["root"], tree["cache"]) == []  # ...which the re-run removed
    assert verify(report.outputs.checkpoint.path, check_host=False).ok


@pytest.mark.slow
def test_sigkill_mid_package_then_rerun(tree):
    shutil.rmtree(tree["repo"])
    call = ("from pipeline.stages.build import build; from pipeline.core.spec import resolve_spec; "
            f"build(resolve_spec(**{SPEC_KW!r}), progress=None)")
    kill_when_paused(PAUSE.format(module="pipeline.stages.package.package", function="write_repo", call=call), tree["env"])
    assert temporaries(tree["root"]) and not tree["repo"].exists()
    report = build(spec(), progress=None)
    assert {s.stage: s.status for s in report.stages}["package"] == "built"
    assert temporaries(tree["root"], tree["cache"]) == []
    assert verify(report.outputs.triton_repo.path, check_host=False).ok


@pytest.mark.slow
def test_sigkill_mid_generation_then_rerun(tree):
    """The download stage of a generated model: killed while writing the model, then generated again."""
    call = "from pipeline.stages.download.tinymodel import ensure_tiny_model; ensure_tiny_model('tiny-llama-draft', steps=0)"
    kill_when_paused(PAUSE.format(module="pipeline.stages.download.tinymodel", function="generate_tiny_model", call=call),
                     tree["env"])
    assert temporaries(tree["cache"])
    from pipeline.stages.download.tinymodel import ensure_tiny_model

    path = ensure_tiny_model("tiny-llama-draft", steps=0)
    assert temporaries(tree["cache"]) == []
    assert verify(path, check_host=False).ok


# --- tampered repositories and releases: verify fails -----------------------------------------------------------
def _evil_model(repo: Path) -> None:
    (repo / "evil" / "1").mkdir(parents=True)
    (repo / "evil" / "config.pbtxt").write_text('name: "evil"\nbackend: "python"\n')
    (repo / "evil" / "1" / "model.py").write_text("import os\n")


TAMPER = {
    "extra file": (lambda repo: (repo / "preprocessing" / "1" / "extra.py").write_text("x = 1\n"),
                   "preprocessing/1/extra.py: not in the manifest"),
    "extra model dir": (_evil_model, "evil: a model directory the manifest does not list"),
    "symlink": (lambda repo: (repo / "postprocessing" / "1" / "passwd").symlink_to("/etc/passwd"),
                "postprocessing/1/passwd: a symlink"),
    "path outside in manifest": (lambda repo: _list_in_manifest(repo, "../../../../etc/passwd"),
                                 "../../../../etc/passwd: outside the directory"),
}


def _list_in_manifest(repo: Path, rel: str) -> None:
    m = json.loads((repo / "manifest.json").read_text())
    m["files"][rel] = {"sha256": "0" * 64, "size": 1}
    (repo / "manifest.json").write_text(json.dumps(m))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TAMPER))
def test_tampered_repository_fails_verify(tree, case):
    tamper, needle = TAMPER[case]
    assert verify(tree["repo"], check_host=False).ok
    tamper(tree["repo"])
    r = invoke("verify", str(tree["repo"]), "--skip-host", env=tree["env"])
    one_line(r, 3, needle)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["extra file", "extra model dir", "symlink"])
def test_tampered_unpacked_release_fails_verify(tree, tmp_path, case):
    tarball = release(spec(), version="1.0").tarball
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    unpacked = tmp_path / "x" / tarball.name.removesuffix(".tar")
    assert verify(unpacked, check_host=False).ok
    repo = next(p for p in (unpacked / "triton_repo").iterdir())
    TAMPER[case][0](repo)
    with pytest.raises(IntegrityError) as err:
        verify(unpacked, check_host=False)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)


# --- names and release destinations -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("version", ["../../../../victim/x", "/abs/x", "a/b", "..", "1.0 beta"])
def test_path_escaping_versions_are_refused_and_nothing_is_written(tree, version):
    one_line(invoke("release", *SPEC, "--version", version, env=tree["env"]), 2, "--version", "not a safe name")
    assert not (tree["root"] / "releases").exists() and not (tree["root"].parent / "victim").exists()


@pytest.mark.slow
def test_two_specs_released_with_one_version_are_two_files_anywhere_the_user_names(tree, tmp_path):
    build(spec(enable_kv_cache_reuse=False, enable_chunked_context=False), progress=None)  # package only
    repos = sorted(p.name for p in (tree["root"] / "triton_repo").iterdir())
    assert len(repos) == 2  # the two specs share the checkpoint, not the repository
    out = tmp_path / "artifacts" / "ci"  # absolute, outside the output tree: the user's choice
    r1 = invoke("release", *SPEC, "--version", "1.0", "--output", str(out), env=tree["env"])
    r2 = invoke("release", *SPEC, "--no-kv-reuse", "--no-chunked-context", "--version", "1.0", "--output", str(out),
                env=tree["env"])
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr[-2000:], r2.stderr[-2000:])
    tarballs = sorted(out.glob("*.tar"))
    assert len(tarballs) == 2 and all(t.name.endswith("-v1.0.tar") for t in tarballs)
    for t in tarballs:
        assert verify(t, check_host=False).ok


@pytest.mark.slow
def test_release_output_through_a_planted_symlink_is_refused(tree, tmp_path):
    (tree["root"] / "releases").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    one_line(invoke("release", *SPEC, "--output", "releases/x", env=tree["env"]), 2, "a symlink inside the output tree")
    assert not (tmp_path / "elsewhere").exists()


# --- write failures -----------------------------------------------------------------------------------------------
def _small_file_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))


@pytest.mark.slow
def test_write_failures_are_one_line_and_leave_nothing_half_written(tree):
    r = invoke("release", *SPEC, env=tree["env"], preexec_fn=_small_file_limit)
    one_line(r, 5, "File too large")
    assert not list((tree["root"] / "releases").glob("*")) if (tree["root"] / "releases").exists() else True
    r = invoke("build", *SPEC, "--force", "package", env=tree["env"], preexec_fn=_small_file_limit)
    one_line(r, 5, "File too large")
    assert temporaries(tree["root"]) == []
    shutil.rmtree(tree["checkpoint"].parent)  # calibrate: ModelOpt's export fails inside safetensors (native code)
    r = invoke("build", *SPEC, env=tree["env"], preexec_fn=_small_file_limit)
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr[-3000:]  # ModelOpt warns on stderr too
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [r.stderr.strip().splitlines()[-1]] and "File too large" in errors[0]
    assert temporaries(tree["root"]) == [] and not tree["checkpoint"].exists()


def test_write_failure_during_model_generation_is_one_line_exit_5(tmp_path):
    """The generated model's weights are written by safetensors (native): its EFBIG is exit 5 like any OSError."""
    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path / "out"), PIPELINE_CACHE=str(tmp_path / "cache"))
    code = ("from pipeline.cli.flags import exit_on_error; from pipeline.stages.download.tinymodel import ensure_tiny_model; "
            "exit_on_error(ensure_tiny_model)('tiny-llama-draft', steps=0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                       preexec_fn=_small_file_limit)
    one_line(r, 5, "File too large", "raise the file size limit")
    assert temporaries(tmp_path / "cache") == [] and not list((tmp_path / "cache" / "generated").glob("tiny-*"))


# --- crafted tarballs: one line, exit code, bounded memory ------------------------------------------------------
def _tar(path: Path, members: dict[str, bytes | int]) -> Path:
    """A tar.gz with `members` (name -> bytes, or a size for a member of that many zero bytes)."""
    import io

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = data if isinstance(data, int) else len(data)
            tar.addfile(info, io.BufferedReader(Zeros(data)) if isinstance(data, int) else io.BytesIO(data))
    return path


def _doc(**fields) -> bytes:
    doc = {"format": 1, "name": "r", "files": {"a.txt": {"sha256": "0" * 64, "size": 1}}}
    doc.update(fields)
    return json.dumps(doc).encode()


CRAFTED = {
    "files not a mapping": (_doc(files="all"), "field 'files'"),
    "size not an integer": (_doc(files={"a.txt": {"sha256": "0" * 64, "size": "1"}}), "field 'files.a.txt.size'"),
    "sha256 not hex": (_doc(files={"a.txt": {"sha256": 5, "size": 1}}), "field 'files.a.txt.sha256'"),
    "empty file table": (_doc(files={}), "field 'files'"),
    "no files key": (json.dumps({"format": 1, "name": "r"}).encode(), "field 'files'"),
    "format": (_doc(format="1"), "field 'format'"),
    "components": (_doc(components={"x": "y"}), "field 'components.x'"),
    "a JSON list": (b"[1, 2]", "field '(document)'"),
    "not JSON": (b"{nope", "is not valid JSON"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_release_json_is_one_line_exit_3(tmp_path, case):
    raw, needle = CRAFTED[case]
    tarball = _tar(tmp_path / "r.tar.gz", {"r/release.json": raw, "r/a.txt": b"a"})
    r = invoke("verify", str(tarball), env=dict(os.environ))
    one_line(r, 3, needle)
    unpacked = tmp_path / "r"
    unpacked.mkdir()
    (unpacked / "release.json").write_bytes(raw)
    (unpacked / "a.txt").write_bytes(b"a")
    with pytest.raises(PipelineError) as err:
        verify(unpacked, check_host=False)
    assert err.value.exit_code == 3 and needle in str(err.value)


def test_size_bomb_tarball_is_refused_in_bounded_memory(tmp_path):
    """Two 200 MB zero-filled metadata members (a few hundred KB compressed): refused, never read into memory."""
    bomb = _tar(tmp_path / "bomb.tar.gz", {"r/release.json": 200 << 20, "r/x/manifest.json": 200 << 20})
    assert bomb.stat().st_size < 4 << 20
    # VmHWM: this process's peak resident memory since exec (ru_maxrss would include the forking test process)
    code = ("import sys\nfrom pipeline.cli.flags import exit_on_error\nfrom pipeline.ops.release_verify import verify\n"
            "try:\n    exit_on_error(verify)(sys.argv[1], check_host=False)\nfinally:\n"
            "    print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0], flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code, str(bomb)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    one_line(r, 3, "release.json is 209715200 bytes, over the 16 MiB limit")
    max_rss_kib = int(r.stdout.split()[-1])
    assert max_rss_kib < 300 * 1024, max_rss_kib  # interpreter + pydantic; the members are streamed, not kept


@pytest.mark.slow
def test_verify_of_a_real_release_is_complete(tree):
    """The untampered release of the real build verifies as a tarball and lists every file it holds."""
    r = release(spec(), version="1.0")
    report = verify(r.tarball, check_host=False)
    assert report.ok and report.files_checked == len(r.document["files"]) > 10
    with tarfile.open(r.tarball) as tar:
        files = [m.name for m in tar.getmembers() if m.isfile()]
    assert len(files) == report.files_checked + 1  # + release.json


@pytest.mark.slow
def test_sigkill_leftovers_never_count_as_outputs(tree):
    """A temporary beside an output (as a killed run leaves it) is neither reused, released nor verified."""
    from tests.support.dead_pid import dead_pid

    stale = tree["checkpoint"].parent / f".tmp-checkpoint-{dead_pid()}-1"
    stale.mkdir()
    (stale / "rank0.safetensors").write_bytes(b"half")
    assert build(spec(), progress=None).noop
    assert not stale.exists()  # the cached re-run removed the dead run's temporary
    r = release(spec(), version="1.0")
    assert r.document["files"] and not any(".tmp-" in rel for rel in r.document["files"])
