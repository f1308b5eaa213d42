"""Fabricated stage outputs for release and verify tests."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from pipeline.core.artifacts import file_table, write_manifest


def fabricate_build(root: Path, *, engine: bool = True) -> dict[str, Path]:
    """Fabricated stage outputs shaped like the real ones (tiny fake files, real manifests)."""
    build = root / "engines" / "tiny-llama-fp8-0123456789ab"
    comps = {}
    if engine:
        e = build / "engine"
        e.mkdir(parents=True)
        (e / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": {}, "build_config": {}}))
        (e / "rank0.engine").write_bytes(os.urandom(4096))
        write_manifest(e, {"key": "k-engine", "toolchain": {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48",
                                                           "sm": 90}, "files": file_table(e)})
        comps[f"engines/{build.name}/engine"] = e
    ck = build / "checkpoint"
    (ck / "tokenizer").mkdir(parents=True)
    (ck / "config.json").write_text('{"architecture": "LlamaForCausalLM"}')
    (ck / "rank0.safetensors").write_bytes(os.urandom(2048))
    (ck / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')
    write_manifest(ck, {"key": "k-ckpt", "quality_gate": {"ppl_delta_pct": 0.1}, "files": file_table(ck)})
    comps[f"engines/{build.name}/checkpoint"] = ck
    repo = root / "triton_repo" / build.name
    for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing"):
        (repo / model / "1").mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    (repo / "preprocessing" / "1" / "model.py").write_text("# python model\n")
    os.chmod(repo / "preprocessing" / "1" / "model.py", 0o755)
    write_manifest(repo, {"key": "k-repo", "files": file_table(repo)})
    comps[f"triton_repo/{build.name}"] = repo
    return comps


def format1_release(tarball: Path, dest: Path) -> Path:
    """An earlier (format-1) release of the same files as the format-2 `tarball`: no recorded layout, packed by
    tarfile, its `.sha256` sidecar pinning the tarball's own sha256 as releases before format 2 did."""
    with tarfile.open(tarball) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    head, (meta, raw) = members[0], members[1]
    doc = {k: v for k, v in json.loads(raw).items() if k not in ("dirs", "executable")} | {"format": 1}
    document = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    meta.size = len(document)
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(head[0])
        tar.addfile(meta, io.BytesIO(document))
        for m, data in members[2:]:
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    dest.with_name(dest.name + ".sha256").write_text(f"{hashlib.sha256(dest.read_bytes()).hexdigest()}  {dest.name}\n")
    return dest
