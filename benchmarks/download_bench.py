"""Download throughput: `invoke download` vs huggingface-hub's own `hf download` CLI (the named peer), same run.

A synthetic multi-file repo (~1 GiB: 8 safetensors shards + config/tokenizer files + files the pipeline skips) is
served by the local Hub server (tests/support/hubserver.py) on 127.0.0.1 behind an emulated network link (default
2.5 Gbit/s shared by all connections; `--link-gbps 0` = raw loopback, which only measures CPU on a small machine).
Each trial downloads into fresh, empty cache dirs as a separate process (interpreter start included on both
sides, each with a bytecode cache that an untimed warm-up run fills, as installed packages have), alternating sides: ours resolves + locks the revision, downloads with the same parallelism, verifies every
file's sha256/oid (hashed while streaming, on a hashing thread per file) and writes the manifest; the peer only
downloads. Prints both medians, their CPU seconds (user+sys: on a CPU-bound host the hash is the difference) and
ratio = peer_seconds / our_seconds (goal >= 1.0: the verified download at least as fast as the unverified one).

    python benchmarks/download_bench.py [--size-mib 1024] [--shards 8] [--link-gbps 2.5] [-n 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.core.registry import get_model
from tests.support.hubserver import LocalHub

REPO_ID = "bench/synthetic-1g"
PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json"]


def _tokenizer_json() -> str:
    """A small real tokenizer.json (the download reads its size against the model's vocabulary)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(61)}}
    return Tokenizer(WordLevel(vocab, unk_token="<unk>")).to_str()


def make_repo(directory: Path, size_mib: int, shards: int) -> dict[str, Path]:
    """Write the synthetic repo's files (pseudo-random shards, a config matching the registry entry)."""
    cfg = get_model("tiny-llama").architecture.hf_config()
    small = {
        "config.json": json.dumps(cfg),
        "generation_config.json": '{"bos_token_id": 0, "eos_token_id": 1}',
        "tokenizer.json": _tokenizer_json(),
        "tokenizer_config.json": "{}",
        "README.md": "synthetic benchmark repo",
    }
    files = {}
    for name, text in small.items():
        (directory / name).write_text(text)
        files[name] = directory / name
    block = os.urandom(1 << 20)
    per_shard = size_mib // shards
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        with open(directory / name, "wb") as f:
            f.writelines((i * per_shard + j).to_bytes(8, "little") + block[8:] for j in range(per_shard))  # every MiB distinct
        files[name] = directory / name
        weight_map[f"layer{i}.weight"] = name
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    files["model.safetensors.index.json"] = directory / "model.safetensors.index.json"
    (directory / "original").mkdir()
    (directory / "original" / "consolidated.00.pth").write_bytes(block)  # skipped by both
    files["original/consolidated.00.pth"] = directory / "original" / "consolidated.00.pth"
    return files


def models_file(path: Path) -> Path:
    a = get_model("tiny-llama")
    body = {"models": {"bench-1g": {
        "repo_id": REPO_ID, "revision": "main", "tokenizer_family": a.tokenizer_family,
        "architecture": a.architecture.model_dump(), "limits": a.limits.model_dump(),
    }}}
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


CPU_S: dict[str, list[float]] = {"ours": [], "peer": []}
PHASES: dict[str, list[tuple[float, float, float]]] = {"ours": [], "peer": []}  # (start-up, transfer, finish)


def timed(argv: list[str], env: dict[str, str], side: str, hub: LocalHub) -> float:
    """Wall seconds of one run; its CPU seconds (user + sys of the child) go to CPU_S[side], its phases as the
    server saw them to PHASES[side]: start-up (spawn to first request), transfer (to the last byte sent), finish
    (last byte to exit)."""
    hub.first_request_at = hub.last_sent_at = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, m0 = time.perf_counter(), time.monotonic()
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t0
    m1 = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_S[side].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if hub.first_request_at is not None and hub.last_sent_at is not None:
        PHASES[side].append((hub.first_request_at - m0, hub.last_sent_at - hub.first_request_at,
                             m1 - hub.last_sent_at))
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--link-gbps", type=float, default=2.5, help="emulated link rate, Gbit/s (0: unlimited)")
    ap.add_argument("-n", type=int, default=5, help="trials per side (alternating)")
    args = ap.parse_args()

    load0 = f"{os.getloadavg()[0]:.1f}"
    work = Path(tempfile.mkdtemp(prefix="download-bench-"))
    try:
        repo = work / "repo"
        repo.mkdir()
        files = make_repo(repo, args.size_mib, args.shards)
        mfile = models_file(work / "models.yaml")
        hf_cli = shutil.which("hf", path=str(Path(sys.executable).parent)) or shutil.which("hf")
        if hf_cli is None:
            raise SystemExit("the `hf` CLI (huggingface-hub) is not installed next to this python")
        with LocalHub(link_bytes_per_s=args.link_gbps * 1e9 / 8 or None) as hub:
            sha = hub.add_commit(REPO_ID, files)
            # Both sides run as installed packages do: with a bytecode cache (filled by an untimed warm-up run of
            # each side), not compiling their sources at every start (PYTHONDONTWRITEBYTECODE=1 hosts would).
            base = {k: v for k, v in os.environ.items()
                    if not k.startswith(("HF_", "PIPELINE_")) and k != "PYTHONDONTWRITEBYTECODE"}
            base.update(HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1", HF_ENDPOINT=hub.endpoint,
                        PYTHONPYCACHEPREFIX=str(work / "pycache"))
            ours, peer = [], []
            for t in range(-1, args.n):
                for side in (("ours", "peer") if t % 2 == 0 else ("peer", "ours")):
                    trial = work / f"{side}-{t}"
                    env = {**base, "HF_HOME": str(trial / "hf-home"), "PIPELINE_ROOT": str(trial / "out"),
                           "PIPELINE_CACHE": str(trial / "cache")}
                    if side == "ours":
                        ours.append(timed([sys.executable, "-m", "invoke", "download", "--model", "bench-1g",
                                           "--models-file", str(mfile), "--endpoint", hub.endpoint], env, side, hub))
                        got = trial / "cache" / "downloads" / REPO_ID.replace("/", "--") / sha
                    else:
                        peer.append(timed([hf_cli, "download", REPO_ID, "--revision", "main", "--include", *PATTERNS,
                                           "--local-dir", str(trial / "local"), "--max-workers", str(args.workers),
                                           "--quiet"], env, side, hub))
                        got = trial / "local"
                    n_bytes = sum(p.stat().st_size for p in got.glob("*.safetensors"))
                    assert n_bytes == args.size_mib // args.shards * args.shards << 20, (side, n_bytes)
                    shutil.rmtree(trial)
                    if t < 0:  # the warm-up
                        (ours if side == "ours" else peer).pop()
                        CPU_S[side].pop()
                        PHASES[side].pop()
                        continue
                    print(f"trial {t} {side}: {(ours if side == 'ours' else peer)[-1]:.2f} s", flush=True)
        size_gb = args.size_mib * (1 << 20) / 1e9
        o, p = statistics.median(ours), statistics.median(peer)
        link = f"{args.link_gbps:g} Gbit/s link" if args.link_gbps else "unthrottled loopback"
        print(f"repo: {len(files)} files, {size_gb:.2f} GB of weights, {link}, {args.workers} workers, "
              f"{args.n} trials/side")
        print(f"ours (invoke download: resolve+lock, download, verify sha256, manifest): {o:.2f} s "
              f"({size_gb / o:.2f} GB/s)")
        print(f"peer (hf download, huggingface-hub {_hub_version()}): {p:.2f} s ({size_gb / p:.2f} GB/s)")
        print(f"CPU s (user+sys, medians): ours {statistics.median(CPU_S['ours']):.2f}, "
              f"peer {statistics.median(CPU_S['peer']):.2f}; load average before/after: {load0} / {os.getloadavg()[0]:.1f}")
        print("phases (medians, s, as the server saw them): " + "; ".join(
            f"{what} ours {statistics.median(o[i] for o in PHASES['ours']):.2f} / "
            f"peer {statistics.median(p[i] for p in PHASES['peer']):.2f}"
            for i, what in enumerate(("start-up (spawn to first request)", "transfer (to last byte)",
                                      "finish (to exit)"))))
        print(f"best of {args.n}: ours {min(ours):.2f} s, peer {min(peer):.2f} s, ratio {min(peer) / min(ours):.2f}")
        print(f"ratio peer/ours = {p / o:.2f} (medians; goal >= 1.0)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _hub_version() -> str:
    from importlib.metadata import version

    return version("huggingface-hub")


if __name__ == "__main__":
    main()
