#!/usr/bin/env bash
# Create .venv and install the pipeline with its dev extras on a CPU host (CPU torch, pinned stack).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
# the interpreter against pyproject.toml's requires-python (">=3.X,<3.Y"), before anything is installed
"$PY" - <<'CHECK'
import re, sys
low, high = (tuple(map(int, v.split("."))) for v in
             re.search(r'requires-python = ">=([\d.]+),<([\d.]+)"', open("pyproject.toml").read()).groups())
if not low <= sys.version_info[:2] < high:
    sys.exit(f"setup: {sys.executable} is Python {sys.version.split()[0]}; the pipeline needs"
             f" >={'.'.join(map(str, low))},<{'.'.join(map(str, high))}: PYTHON=python3.12 bash scripts/setup.sh"
             " (remove a .venv made with another Python first)")
CHECK
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints-cpu.txt torch==2.13.0
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e '.[dev]'
echo "setup: .venv ready ($(.venv/bin/python --version))"
