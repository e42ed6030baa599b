#!/usr/bin/env bash
# Make .venv (if missing) and install exactly what CI tests: the versions in requirements.lock (PyTorch, then
# the package in editable mode with its dev extras), then check that the venv holds those versions.
#
# PyTorch: the locked release is installed where the venv has none (here, the CPU wheel this machine carries).
# A CUDA build already in the venv is left alone, and so are the packages it pins (triton, nvidia-*): install
# the CUDA build of torch into .venv first, then run this script. A CPU build of another release is replaced.
# Refresh the lock with scripts/lock.sh (docs/inference.md, "Supported versions").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOCK=requirements.lock
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip=(.venv/bin/python -m pip)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
if .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  echo "setup: keeping the CUDA build of torch in .venv ($(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
  grep -viE '^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==' "$LOCK" > "$constraints"
else
  cp "$LOCK" "$constraints"
fi
"${pip[@]}" install -q -c "$constraints" pip setuptools
locked_torch=$(sed -n 's/^torch==//p' "$constraints")
if [ -n "$locked_torch" ]; then
  have=$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
  [ "$have" = "$locked_torch" ] || "${pip[@]}" install -q -c "$constraints" "torch==$locked_torch"
fi
"${pip[@]}" install -q -c "$constraints" -e ".[dev]"
.venv/bin/python scripts/check_lock.py "$constraints"
echo "setup: done; the commands are in .venv/bin (.venv/bin/ddl); \`source .venv/bin/activate\` puts ddl on PATH"
