#!/usr/bin/env bash
# Create .venv and install the pipeline with its dev extras on a CPU host (CPU torch, pinned stack).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints-cpu.txt torch==2.13.0
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e '.[dev]'
echo "setup: .venv ready ($(.venv/bin/python --version))"
