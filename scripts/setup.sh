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
# NVIDIA Dynamo 1.6.1 in its own venv, for the fleet test (tests/serving/test_dynamo_fleet.py): its Rust core ships
# for x86-64 Linux only; `pip install ai-dynamo` fails (see scripts/dynamo-requirements.txt), so it goes in 3 steps
DYNAMO=1.6.1
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "setup: skipping Dynamo $DYNAMO (its runtime wheel is for Linux x86-64 only; the fleet test skips)"
elif [ ! -f .venv-dynamo/installed-$DYNAMO ]; then
  rm -rf .venv-dynamo
  .venv/bin/python -m venv .venv-dynamo
  .venv-dynamo/bin/python -m pip install -q -c scripts/dynamo-constraints.txt "ai-dynamo-runtime==$DYNAMO"
  .venv-dynamo/bin/python -m pip install -q --no-deps "ai-dynamo==$DYNAMO"
  .venv-dynamo/bin/python -m pip install -q -c scripts/dynamo-constraints.txt -r scripts/dynamo-requirements.txt
  touch .venv-dynamo/installed-$DYNAMO
  echo "setup: .venv-dynamo ready (NVIDIA Dynamo $DYNAMO)"
fi
