"""Host RAM of a CPU calibration: the calibrate stage's measured peak RSS against the host check's estimate
(`pipeline.stages.resources.calibration_memory(...).cpu_ram_bytes`), on a randomly initialised Llama with llama-1b's layer
shape and vocabulary (fewer layers), so the float32 model, the export's copy and the round trip's re-load dominate.

    python benchmarks/calibrate_memory.py [--layers 4] [--precision fp8] [--calib-seq-len 32]

Runs the real stage (`run_calibrate`, ModelOpt on CPU) in a child process and takes the child's peak RSS
(`RUSAGE_CHILDREN`). The weights are drawn wider than a fresh model's (std 0.1) so the logits have clear top-1 tokens
for the stage's round-trip check. The quality gate is off (random weights).
Heavy: run it under `flock /tmp/heavy.lock` on shared machines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = """
import sys
from pipeline.stages.calibrate.stage import run_calibrate
from pipeline.core.spec import resolve_spec
spec = resolve_spec(model="mid-llama", models_file=sys.argv[1], precision=sys.argv[2], calib_size=2,
                    calib_seq_len=int(sys.argv[3]), kv_cache="bf16", enable_kv_cache_reuse=False,
                    enable_chunked_context=False, quality_gate=False)
print(run_calibrate(spec, source=sys.argv[4], force=True).path)
"""


def make_model(dest: Path, layers: int, models_file: Path) -> None:
    """A random-init llama-1b-shaped model (bf16 safetensors) with the tiny tokenizer, and its registry entry."""
    import torch
    import yaml
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.core.registry import get_model
    from pipeline.stages.download.tinymodel import ensure_tiny_model

    arch = get_model("llama-1b").architecture.model_copy(update={"num_layers": layers})
    torch.manual_seed(0)
    config = LlamaConfig(**arch.hf_config(), torch_dtype="bfloat16", initializer_range=0.1)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(dest)
    del model
    tiny = ensure_tiny_model("tiny-llama")
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(f, dest / f.name)
    entry = {"repo_id": "local/mid-llama", "tokenizer_family": "tiny-bpe-v1",
             "architecture": arch.model_dump(), "limits": {"max_input_len": 256, "max_seq_len": 512}}
    models_file.write_text(yaml.safe_dump({"models": {"mid-llama": entry}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--calib-seq-len", type=int, default=32)
    args = ap.parse_args()

    from pipeline.core.spec import resolve_spec
    from pipeline.stages.resources import calibration_memory, plan_resources

    with tempfile.TemporaryDirectory(prefix="calibrate-memory-") as tmp:
        tmp = Path(tmp)
        src, models_file = tmp / "mid-llama", tmp / "models.yaml"
        make_model(src, args.layers, models_file)
        env = dict(os.environ, PIPELINE_ROOT=str(tmp / "out"), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
        r = subprocess.run([sys.executable, "-c", CHILD, str(models_file), args.precision, str(args.calib_seq_len),
                            str(src)], env=env, capture_output=True, text=True, check=False)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if r.returncode:
            print(f"calibrate failed (its peak RSS is still measured): {r.stderr.strip().splitlines()[-1]}")
        spec = resolve_spec(model="mid-llama", models_file=str(models_file), precision=args.precision, calib_size=2,
                            calib_seq_len=args.calib_seq_len, kv_cache="bf16", enable_kv_cache_reuse=False,
                            enable_chunked_context=False)
        est = calibration_memory(spec, "target")
        print(f"model: llama-1b shape, {args.layers} layers, {est.params / 1e6:.0f} M parameters, {args.precision}")
        print(f"measured peak RSS of the calibrate stage: {peak / 2**30:6.2f} GiB")
        print(f"host check's CPU RAM estimate:            {est.cpu_ram_bytes / 2**30:6.2f} GiB "
              f"(estimate / measured = {est.cpu_ram_bytes / peak:.2f})")
        if not r.returncode:
            ckpt = Path(r.stdout.strip().splitlines()[-1])
            manifest = json.loads((ckpt / "manifest.json").read_text())
            written = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
            planned = plan_resources(spec).stage_bytes("calibrate")
            print(f"checkpoint written {written / 2**20:,.1f} MiB, planned {planned / 2**20:,.1f} MiB "
                  f"(planned / written = {planned / written:.2f})")
            print(f"stage timings: {json.dumps({k: round(v, 1) for k, v in manifest['timings'].items()})}")


if __name__ == "__main__":
    main()
