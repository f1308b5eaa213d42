"""Re-run the hostile inputs of the reliability probes through the CLI and print one table row per input.

Each input runs as a fresh `invoke` process (what a user sees) in a scratch output root; a row records the exit code
against the documented one, the wall time (goal < 5 s), the process's peak resident memory (goal < 1 GiB), whether
a traceback was printed, and a post-condition where the input could destroy or half-write something (files that
must survive, a report that must not exist). Inputs that need a finished build use `--root` (built here with
`invoke build` for tiny-llama fp8 and bf16 on the reference target when absent: minutes, not counted in the rows).

    python scripts/hostile_probe.py [--root DIR] [--only SUBSTRING] [--markdown]

Exit 0 when every row holds, 1 otherwise. Requests sent to a running server are probed by
`tests/serving/test_request_limits_server.py`-style tests, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LIMIT_S, LIMIT_RSS_MIB = 5.0, 1024
TINY = ["--model", "tiny-llama", "--target", "reference"]


@dataclass
class Case:
    group: str
    name: str
    argv: list[str]  # `invoke` arguments; {tmp}, {root} and {fifo} are filled in
    expect: tuple[int, ...]
    setup: Callable[[Path], None] = lambda tmp: None
    after: Callable[[Path], str] = lambda tmp: ""  # "" when the post-condition holds, else what is wrong
    needs_build: bool = False
    needle: str = ""  # must be in the last line of stderr


def _write(rel: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    return setup


def _both(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda tmp: [f(tmp) for f in fns] and None


def _survives(*rels: str) -> Callable[[Path], str]:
    return lambda tmp: ", ".join(f"{r} deleted" for r in rels if not (tmp / r).exists())


def _absent(rel: str) -> Callable[[Path], str]:
    return lambda tmp: f"{rel} was written" if (tmp / rel).exists() else ""


DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "1" + "0" * 5000
SPEC = "model: tiny-llama\ntarget: reference\n"
_victims = _both(_write("out/engines/keep.txt", "x"), _write("out/triton_repo/keep.txt", "x"),
                 _write("out/releases/keep.txt", "x"), _write("other/notes.txt", "mine"))
_BENCH_BUILT = ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9", "--dataset"]
_DEPLOY = ["deploy", "--platform", "k8s", "--model", "llama-8b", "--precision", "fp8", "--release-volume", "releases",
           "--pipeline-image", "registry.example.com/trtllm-pipeline:1"]


def _not_run(tmp: Path) -> str:
    script = next(iter((tmp / "ds").glob("*.sbatch")), None) if (tmp / "ds").is_dir() else None
    if script is not None:
        subprocess.run(["bash", "-n", str(script)], check=False)  # parse only; the value must stay one word
        if "'x;touch" not in script.read_text():
            return "the partition is not quoted in the sbatch script"
    return "the injected command ran" if (tmp / "pwned").exists() else ""


def _traversing_release(tmp: Path) -> None:
    from pipeline.core.spec import resolve_spec

    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4).model_dump(mode="json")
    _write("rel/release.json", json.dumps({"format": 1, "name": "../../PWNED", "spec": spec, "files": {}}))(tmp)


def _suid_tar(tmp: Path) -> None:
    import io
    import tarfile

    doc = json.dumps({"format": 1, "name": "r", "files": {"x.sh": {"sha256": "0" * 64, "size": 2}}}).encode()
    with tarfile.open(tmp / "suid.tar", "w") as tar:
        for name, data, mode in (("r/release.json", doc, 0o644), ("r/x.sh", b"id", 0o4755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))


def _edited_ref(tmp: Path) -> None:
    """Point tiny-llama fp8's calibrate ref at the bf16 checkpoint (the integrity probe)."""
    refs = Path(os.environ["PIPELINE_ROOT"]) / "engines" / ".refs" / "calibrate"
    by_prec = {}
    for ref in refs.glob("*.json"):
        doc = json.loads(ref.read_text())
        ckpt = Path(os.environ["PIPELINE_ROOT"]) / doc["outputs"]["checkpoint"]["path"]
        man = json.loads((ckpt / "manifest.json").read_text())
        by_prec[man["recipe"]["precision"]] = (ref, doc)
    fp8, bf16 = by_prec.get("fp8"), by_prec.get("bf16")
    if not (fp8 and bf16):
        raise SystemExit(f"probe setup: need fp8 and bf16 calibrate refs in {refs}, found {sorted(by_prec)}")
    (tmp / "saved_ref").write_text(fp8[0].read_text())
    (tmp / "saved_ref_path").write_text(str(fp8[0]))
    fp8[0].write_text(json.dumps({**fp8[1], "outputs": bf16[1]["outputs"]}))


def _restore_ref(tmp: Path) -> str:
    Path((tmp / "saved_ref_path").read_text()).write_text((tmp / "saved_ref").read_text())
    return ""


CASES: list[Case] = [
    # --- data loss
    Case("data loss", "deploy --output $PIPELINE_ROOT --force", [*_DEPLOY, "--output", "{tmp}/out", "--force"],
         (2,), _victims, _survives("out/engines/keep.txt", "out/triton_repo/keep.txt", "out/releases/keep.txt"),
         needle="nothing was deleted"),
    Case("data loss", "deploy --output <dir of other files> --force", [*_DEPLOY, "--output", "{tmp}/other", "--force"],
         (2,), _victims, _survives("other/notes.txt"), needle="nothing was deleted"),
    Case("data loss", "deploy --output / --force", [*_DEPLOY, "--output", "/", "--force"], (2,),
         needle="nothing was deleted"),
    Case("data loss", "deploy --output $HOME --force", [*_DEPLOY, "--output", os.path.expanduser("~"), "--force"],
         (2,), needle="nothing was deleted"),
    # --- unbounded reads
    Case("bounded reads", "check --spec /dev/zero", ["check", "--spec", "/dev/zero"], (2,), needle='character device'),
    Case("bounded reads", "check --spec FIFO", ["check", "--spec", "{fifo}"], (2,), needle='FIFO'),
    Case("bounded reads", "check --models-file FIFO", ["check", *TINY, "--models-file", "{fifo}"], (2,), needle='FIFO'),
    Case("bounded reads", "check --calib-data /dev/zero", ["check", *TINY, "--precision", "fp8", "--calib-data",
                                                           "/dev/zero"], (2,), needle='character device'),
    Case("bounded reads", "bench --dataset /dev/zero", ["bench", *TINY, "--precision", "fp8", "--url",
                                                        "127.0.0.1:9", "--dataset", "/dev/zero"], (2,), needle='character device'),
    Case("bounded reads", "bench --dataset FIFO", ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9",
                                                   "--dataset", "{fifo}"], (2,), needle='FIFO'),
    Case("bounded reads", "plan --slo --bench-report FIFO", ["plan", "--model", "llama-8b", "--slo", "--ttft-ms",
                                                            "500", "--tpot-ms", "50", "--bench-report", "{fifo}"],
         (2,), needle='FIFO'),
    Case("bounded reads", "plan --slo --precision-search /dev/zero",
         ["plan", "--model", "llama-8b", "--slo", "--ttft-ms", "500", "--tpot-ms", "50", "--precision-search",
          "/dev/zero"], (2, 3), needle='character device'),
    Case("bounded reads", "deploy --release FIFO", ["deploy", "--platform", "k8s", "--release", "{fifo}", "--output",
                                                    "{tmp}/d"], (2,), needle='FIFO'),
    Case("bounded reads", "verify /dev/zero", ["verify", "/dev/zero"], (2,), needle='neither release.json'),
    # --- tracebacks on bad input
    Case("tracebacks", "--bench-report nested 100,000 deep", ["plan", "--model", "llama-8b", "--slo", "--ttft-ms",
                                                               "500", "--tpot-ms", "50", "--bench-report",
                                                               "{tmp}/deep.json"], (2,), _write("deep.json", DEEP), needle='nested too deeply'),
    Case("tracebacks", "dataset line nested 100,000 deep", ["bench", *TINY, "--precision", "fp8", "--url",
                                                             "127.0.0.1:9", "--dataset", "{tmp}/deep.jsonl"], (2,),
         _write("deep.jsonl", DEEP + "\n"), needle='nested over'),
    Case("tracebacks", "--calib-data nested 100,000 deep", ["check", *TINY, "--precision", "fp8", "--calib-data",
                                                             "{tmp}/deep.jsonl"], (2,),
         _write("deep.jsonl", '{"text": ' + DEEP + "}\n"), needle='nested too deeply'),
    Case("tracebacks", "spec with a 5,000-digit integer", ["check", "--spec", "{tmp}/s.yaml"], (2,),
         _write("s.yaml", SPEC + f"max_batch_size: {HUGE_INT}\n"), needle='more than 100 digits'),
    Case("tracebacks", "--bench-report with a 5,000-digit integer",
         ["plan", "--model", "llama-8b", "--slo", "--ttft-ms", "500", "--tpot-ms", "50", "--bench-report",
          "{tmp}/int.json"], (2,), _write("int.json", '{"levels": [' + HUGE_INT + "]}"), needle='more than 100 digits'),
    Case("tracebacks", "bench --request-rate nan", ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9",
                                                    "--request-rate", "nan"], (2,), needle='--request-rate'),
    Case("tracebacks", "bench --request-rate inf", ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9",
                                                    "--request-rate", "inf"], (2,), needle='--request-rate'),
    Case("tracebacks", "ShareGPT reply not a string",
         ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9", "--dataset", "{tmp}/sg.json"], (2, 5),
         _write("sg.json", json.dumps([{"conversations": [{"from": "human", "value": "hi"},
                                                          {"from": "gpt", "value": {"x": 1}}]}])),
         needle="no ready Triton server"),
    Case("tracebacks", "lone surrogate in a prompt",
         ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9", "--dataset", "{tmp}/sur.jsonl"], (2, 5),
         _write("sur.jsonl", '{"prompt": "a \\ud800 b"}\n'), needle='lone surrogate'),
    Case("tracebacks", "YAML complex key", ["check", "--spec", "{tmp}/ck.yaml"], (2,),
         _write("ck.yaml", SPEC + "? [a, b]\n: 1\n"), needle='complex key'),
    Case("tracebacks", "models file: 0 attention heads",
         ["check", "--model", "m0", "--precision", "fp8", "--skip-host-check", "--models-file", "{tmp}/m.yaml"], (2,),
         _write("m.yaml", "models:\n  m0:\n    repo_id: org/m0\n    tokenizer_family: llama3\n"
                          "    architecture: {num_layers: 2, hidden_size: 64, "
                          "num_heads: 0, num_kv_heads: 1, head_dim: 16, intermediate_size: 128, vocab_size: 256, "
                          "max_position_embeddings: 512}\n"), needle='num_heads'),
    # --- validation gaps
    Case("validation", "plan --slo --ttft-ms nan", ["plan", "--model", "llama-8b", "--slo", "--ttft-ms", "nan",
                                                    "--tpot-ms", "50"], (2,), needle='--ttft-ms'),
    Case("validation", "plan --slo --tpot-ms inf", ["plan", "--model", "llama-8b", "--slo", "--ttft-ms", "500",
                                                    "--tpot-ms", "inf"], (2,), needle='--tpot-ms'),
    Case("validation", "plan --gpu-price -1", ["plan", "--model", "llama-8b", "--gpu-price", "-1"], (2,), needle='gpu_price'),
    Case("validation", "spec max_ppl_delta_pct: .nan", ["check", "--spec", "{tmp}/n.yaml", "--skip-host-check"], (2,),
         _write("n.yaml", SPEC + "quantization:\n  precision: fp8\n  max_ppl_delta_pct: .nan\n"),
         needle="max_ppl_delta_pct"),
    Case("validation", "JSONL with U+2028 inside a string (valid)",
         ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9", "--dataset", "{tmp}/ls.jsonl",
          "--requests", "1", "--concurrency", "1"], (2,),
         _write("ls.jsonl", '{"prompt": "a\u2028b\u0085c"}\n'), needle="no ready Triton server"),
    # --- secrets
    Case("secrets", "--release-url with credentials (k8s)",
         [*_DEPLOY, "--output", "{tmp}/dk", "--release-url", "https://user:hunter2@example.com/r.tar"], (2,),
         after=_absent("dk"), needle='credentials'),
    Case("secrets", "--release-url not http(s) (k8s)",
         [*_DEPLOY, "--output", "{tmp}/dk2", "--release-url", "file:///etc/passwd"], (2,), after=_absent("dk2")),
    # --- the second probe's classes (issue 22, needle='http(s)'), re-run
    Case("earlier probe", "slurm --partition 'x;touch pwned' (quoted or refused)",
         ["deploy", "--platform", "slurm", "--model", "tiny-llama", "--precision", "fp8", "--target", "reference",
          "--output", "{tmp}/ds", "--release-volume", "/shared/rel", "--partition", "x;touch {tmp}/pwned"], (0, 2),
         after=_not_run, needle='--partition'),
    Case("earlier probe", "release.json naming the release ../../PWNED",
         ["deploy", "--platform", "k8s", "--release", "{tmp}/rel", "--output", "{tmp}/dr"], (2,),
         _traversing_release, after=_absent("dr"), needle="not a safe file name"),
    Case("earlier probe", "verify a tarball with a setuid member", ["verify", "{tmp}/suid.tar"], (3,),
         _suid_tar, needle="setuid"),
    Case("earlier probe", "bench --concurrency 3000 --requests 2",
         ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9", "--concurrency", "3000", "--requests", "2"],
         (2,), needle="no ready Triton server"),
    Case("earlier probe", "an unknown flag (invoke's parser)", ["check", "--no-such-flag"], (2,), needle='unknown flag'),
    Case("earlier probe", "k8s --namespace Bad_Name", [*_DEPLOY, "--output", "{tmp}/dn", "--namespace", "Bad_Name"],
         (2,), after=_absent("dn"), needle="--namespace"),
    Case("earlier probe", "--model hf:../../etc", ["check", "--model", "hf:../../etc", "--precision", "fp8"], (2,)),
    # --- integrity (need a build, needle='not a Hub repo id')
    Case("integrity", "fp8 calibrate ref edited to the bf16 checkpoint: package",
         ["package", *TINY, "--precision", "fp8", "--force"], (3,), _edited_ref, _restore_ref, needs_build=True,
         needle="this spec: fp8"),
    Case("integrity", "fp8 calibrate ref edited to the bf16 checkpoint: release",
         ["release", *TINY, "--precision", "fp8", "--output", "{tmp}/rel"], (3,), _edited_ref,
         lambda tmp: _restore_ref(tmp) or _absent("rel")(tmp), needs_build=True, needle="this spec: fp8"),
    Case("bounded reads", "bench: one 192 MB prompt", [*_BENCH_BUILT, "{tmp}/big.jsonl"], (2,),
         lambda tmp: (tmp / "big.jsonl").write_bytes(b'{"prompt": "' + b"word " * ((192 << 20) // 5) + b'"}\n'),
         needs_build=True, needle="cap"),
    Case("bounded reads", "bench: one 3.9 M-character prompt (under the cap) vs max_input_len",
         [*_BENCH_BUILT, "{tmp}/long.jsonl"], (2,),
         _write("long.jsonl", '{"prompt": "' + "word " * 780_000 + '"}\n'), needs_build=True,
         needle="max_input_len"),
    Case("validation", "bench: every request the same output_len, over max_seq_len",
         [*_BENCH_BUILT, "{tmp}/same.jsonl"], (2,),
         _write("same.jsonl", '{"prompt": "hi", "output_len": 100000}\n' * 3), needs_build=True,
         needle="max_seq_len"),
    Case("integrity", "bench --json-file /dev/full", ["bench", *TINY, "--precision", "fp8", "--url", "127.0.0.1:9",
                                                      "--json-file", "/dev/full"], (2, 5), needs_build=True,
         needle="not a regular file"),
]


def _run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, float, int, str]:
    """exit code (-9 when killed at `timeout`), seconds, peak RSS (MiB) of the process, stderr."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    reader.join(5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss // 1024, b"".join(err).decode(errors="replace")


def _ensure_builds(root: Path, env: dict[str, str]) -> None:
    for precision in ("fp8", "bf16"):
        r = subprocess.run([sys.executable, "-m", "invoke", "build", *TINY, "--precision", precision], cwd=ROOT,
                           env=env, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"build tiny-llama {precision} in {root} failed: {r.stderr.strip()[-500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", help="output root holding (or to hold) the tiny-llama fp8/bf16 builds")
    ap.add_argument("--only", default="", help="run the inputs whose name contains this")
    ap.add_argument("--skip-build", action="store_true", help="leave out the inputs that need a build")
    ap.add_argument("--verbose", action="store_true", help="print every input's last stderr line (to stderr)")
    ap.add_argument("--timeout", type=float, default=60.0, help="kill an input after this many seconds")
    args = ap.parse_args()
    cases = [c for c in CASES if args.only in c.name and not (args.skip_build and c.needs_build)]
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        build_root = Path(args.root or Path(scratch) / "builds").resolve()
        base = dict(os.environ, PIPELINE_CACHE=str(build_root / "cache"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        if any(c.needs_build for c in cases):
            _ensure_builds(build_root, dict(base, PIPELINE_ROOT=str(build_root)))
        print("| # | class | input | expected | exit | s | peak MiB | traceback | holds |\n|---|---|---|---|---|---|---|---|---|")
        for i, case in enumerate(cases, 1):
            tmp = Path(scratch) / f"case{i}"
            tmp.mkdir()
            fifo = tmp / "fifo"
            os.mkfifo(fifo)
            root = build_root if case.needs_build else tmp / "out"
            env = dict(base, PIPELINE_ROOT=str(root))
            os.environ["PIPELINE_ROOT"] = str(root)
            case.setup(tmp)
            argv = [a.format(tmp=tmp, root=root, fifo=fifo) for a in case.argv]
            code, secs, rss, err = _run(argv, env, args.timeout)
            problem = case.after(tmp)
            tb = "Traceback" in err
            whole = (err.strip().splitlines() or [""])[-1]
            last = whole[:160]
            problem = problem or (f"message lacks {case.needle!r}" if case.needle not in whole else "")
            ok = code in case.expect and secs < LIMIT_S and rss < LIMIT_RSS_MIB and not tb and not problem
            failed += not ok
            print(f"| {i} | {case.group} | {case.name} | {'/'.join(map(str, case.expect))} | {code} | {secs:.1f} | "
                  f"{rss} | {'yes' if tb else 'no'} | {'yes' if ok else 'NO: ' + (problem or last)} |")
            if not ok or args.verbose:
                print(f"    {i}: {whole}", file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(cases) - failed}/{len(cases)} inputs hold (exit as documented, < {LIMIT_S:g} s, "
          f"< {LIMIT_RSS_MIB} MiB, no traceback, nothing deleted or half-written)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
