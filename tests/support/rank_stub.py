"""Run a deployment's rank program with stand-ins for trtllm-serve / trtllm-llmapi-launch that record their argv."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pipeline.stages.package.serve_plan import LLMAPI_LAUNCH


def run_rank(script: str, tmp_path: Path) -> list[str]:
    """Run `script` with /bin/sh (WORK = `tmp_path/node work`); the argv the first stand-in it execs recorded."""
    bin_dir, record = tmp_path / "bin", tmp_path / "argv.txt"
    bin_dir.mkdir(exist_ok=True)
    for exe in (LLMAPI_LAUNCH, "trtllm-serve"):
        (bin_dir / exe).write_text('#!/bin/sh\nprintf "%s\\n" "$(basename "$0")" "$@" > "$ARGV_OUT"\n')
        (bin_dir / exe).chmod(0o755)
    (tmp_path / "rank.sh").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "WORK": str(tmp_path / "node work"), "ARGV_OUT": str(record)}
    subprocess.run(["/bin/sh", str(tmp_path / "rank.sh")], env=env, check=True, timeout=30)
    return record.read_text().splitlines()
