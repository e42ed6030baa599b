#!/usr/bin/env bash
# Create .venv (if missing) and install the package with its dev extras.
# torch is pinned to the CPU wheel this machine carries; on a GPU machine install the CUDA build of torch
# first and this script keeps it (pip sees the requirement satisfied).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
