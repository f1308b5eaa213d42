"""User story: build tiny-llama fp8 for the reference target, release it twice (identical sha256), verify it (and
see verify fail after one byte changes), re-run the build as a no-op, and benchmark the repo on a real tritonserver.

One build per session (module fixture); everything goes through `invoke` in subprocesses, as a user would run it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ["--model", "tiny-llama", "--precision", "fp8", "--target", "reference"]

pytestmark = pytest.mark.slow


def invoke(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def manifest_mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("manifest.json"))}


@pytest.fixture(scope="module")
def reference_build(tmp_path_factory, tiny_models):
    """One `invoke build` of tiny-llama fp8 --target reference in private PIPELINE_ROOT/PIPELINE_CACHE dirs."""
    tmp = tmp_path_factory.mktemp("e2e")
    root, cache = tmp / "out", tmp / "cache"
    (cache / "generated").mkdir(parents=True)
    for path in tiny_models.values():  # the session's generated models (trained once per test session)
        (cache / "generated" / path.name).symlink_to(path, target_is_directory=True)
    env = dict(os.environ, PIPELINE_ROOT=str(root), PIPELINE_CACHE=str(cache))
    # Two concurrent builds of the same spec: they serialize on the build lock, so exactly one calibrates and the
    # other finds everything current (costs no extra calibration).
    procs = [subprocess.Popen([sys.executable, "-m", "invoke", "build", *SPEC, "--json"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(out) for out, _ in results]
    calibrated = sorted(next(s["status"] for s in r["stages"] if s["stage"] == "calibrate") for r in reports)
    assert calibrated == ["built", "cached"], calibrated
    first = 0 if not reports[0]["noop"] else 1
    assert reports[1 - first]["noop"]
    return {"root": root, "env": env, "report": reports[first], "stderr": results[first][1]}


def test_build_release_twice_verify_and_noop_rebuild(reference_build, tmp_path):
    root, env, report = reference_build["root"], reference_build["env"], reference_build["report"]
    # One progress line per stage with elapsed time, and the report names every stage.
    assert [s["stage"] for s in report["stages"]] == ["check", "download", "calibrate", "compile", "package"]
    progress = [ln for ln in reference_build["stderr"].splitlines() if ln.startswith("[")]
    assert any(ln.startswith("[4/4] package: built") and ln.endswith("s") for ln in progress), progress
    build_id = report["build_id"]
    assert build_id.startswith("tiny-llama-fp8-")
    before = manifest_mtimes(root)
    assert f"engines/{build_id}/checkpoint/manifest.json" in before

    # Two releases from the same build: byte-identical tarballs.
    shas = []
    for out in ("releases/a", "releases/b"):
        r = invoke("release", *SPEC, "--output", out, "--json", env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        shas.append(json.loads(r.stdout))
    a, b = Path(shas[0]["tarball"]), Path(shas[1]["tarball"])
    assert a.parent == root / "releases" / "a" and a.name == b.name
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tar:  # the identity: release.json's sha256 (it lists every member's)
        identity = hashlib.sha256(tar.extractfile(f"{a.name[:-len('.tar')]}/release.json").read()).hexdigest()
    assert shas[0]["sha256"] == shas[1]["sha256"] == identity
    doc = shas[0]["release"]
    assert doc["spec"]["model"]["name"] == "tiny-llama" and doc["target"] == "reference"
    assert doc["revisions"]["model"]["resolved"] and doc["plan"]["model"] == "tiny-llama"
    assert doc["quality_gate"] is not None

    # The release holds the checkpoint, the Triton repo and the tokenizer in the output-tree layout.
    with tarfile.open(a) as tar:
        names = tar.getnames()
    prefix = a.name[: -len(".tar")]
    assert f"{prefix}/release.json" == names[1]
    assert any(n.startswith(f"{prefix}/engines/{build_id}/checkpoint/rank0.safetensors") for n in names)
    assert any(n.startswith(f"{prefix}/triton_repo/") and n.endswith("/ensemble/config.pbtxt") for n in names)
    assert any(n.startswith(f"{prefix}/tokenizer/") for n in names)

    # verify: tarball, unpacked release, and the live Triton repo pass...
    r = invoke("verify", str(a), env=env)
    assert r.returncode == 0 and r.stdout.startswith("ok: tarball"), r.stderr
    unpacked = tmp_path / "unpacked"
    with tarfile.open(a) as tar:
        tar.extractall(unpacked, filter="data")
    rel = unpacked / prefix
    assert invoke("verify", str(rel), env=env).returncode == 0
    from pipeline.stages.package.repo_check import validate_repo

    validate_repo(next((rel / "triton_repo").iterdir()))  # servable as unpacked: empty version dirs travel too
    repo = next((root / "triton_repo").iterdir())
    assert invoke("verify", str(repo), env=env).returncode == 0

    # ...and fail with exit 3 (integrity) after one byte of an artifact changes.
    weights = rel / "engines" / build_id / "checkpoint" / "rank0.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    r = invoke("verify", str(rel), env=env)
    assert r.returncode == 3 and "rank0.safetensors: sha256" in r.stderr and "Traceback" not in r.stderr
    blob = bytearray(a.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    a.write_bytes(bytes(blob))
    r = invoke("verify", str(a), env=env)
    assert r.returncode == 3 and r.stderr.startswith("error:")

    # Re-running the completed build is a no-op: every stage cached, no manifest rewritten.
    r = invoke("build", *SPEC, "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads(r.stdout)
    assert again["noop"] and again["build_id"] == build_id
    assert {s["stage"]: s["status"] for s in again["stages"]} == {
        "check": "ok", "download": "cached", "calibrate": "cached", "package": "cached", "compile": "skipped"}
    assert manifest_mtimes(root) == before

    # --force package redoes that stage only; a serving-only input (KV memory fraction) rebuilds only package.
    ckpt = f"engines/{build_id}/checkpoint/manifest.json"
    for extra in (["--force", "package"], ["--mem-fraction", "0.5"]):
        r = invoke("build", *SPEC, *extra, "--json", env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        rebuilt = json.loads(r.stdout)
        assert not rebuilt["noop"] and rebuilt["build_id"] == build_id, extra
        assert {s["stage"]: s["status"] for s in rebuilt["stages"]} == {
            "check": "ok", "download": "cached", "calibrate": "cached", "package": "built", "compile": "skipped"}, extra
        assert manifest_mtimes(root)[ckpt] == before[ckpt]


def test_bench_against_reference_repo_on_real_tritonserver(reference_build, tmp_path):
    """The harness end to end on CPU: server started on the build's repo, a short sweep, table + JSON."""
    out = tmp_path / "bench.json"
    r = invoke("bench", *SPEC, "--concurrency", "1,2", "--requests", "2", "--max-tokens", "8", "--budget", "60",
               "--json-file", str(out), env=reference_build["env"], timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "TTFT p50/p99 ms" in r.stdout and "$/1M tok" in r.stdout
    data = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    for lv in data["levels"]:
        assert lv["errors"] == 0 and lv["requests"] == 2
        assert lv["output_tokens"] > 0 and lv["output_tokens_per_s"] > 0
        assert 0 < lv["ttft_ms_p50"] <= lv["latency_ms_p50"]
        assert lv["cost_per_1m_output_tokens_usd"] > 0
    assert data["streaming"] is True and data["triton_model"] == "ensemble"


def test_from_package_refuses_a_stale_checkpoint_without_recalibrating(reference_build):
    root, env = reference_build["root"], reference_build["env"]
    def outputs():  # build dirs, not lock files
        return sorted(p.name for p in (root / "engines").iterdir() if not p.name.startswith("."))

    before = outputs()
    # Another calibration sample count is another checkpoint key: --from package must not calibrate it.
    r = invoke("build", *SPEC, "--calib-size", "17", "--from", "package", env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "no current target checkpoint for tiny-llama fp8" in r.stderr
    assert outputs() == before
