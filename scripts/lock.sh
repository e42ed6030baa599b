#!/usr/bin/env bash
# Refresh requirements.lock: resolve the package with its dev extras from scratch (the newest releases that
# pyproject.toml's ranges admit) in a throwaway venv, then write every installed distribution with its exact
# version. Run it on purpose (say, monthly), then run the tests on the new lock (`bash scripts/setup.sh &&
# .venv/bin/python -m pytest -q` after removing .venv) and commit requirements.lock with the code it was tested on.
#
#   bash scripts/lock.sh                 # writes requirements.lock
#   PYTHON=python3.11 bash scripts/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
pip=("$tmp/venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip setuptools
"${pip[@]}" install -q "torch==$TORCH_VERSION"
"${pip[@]}" install -q ".[dev]"
{
  echo "# Exact versions that scripts/setup.sh installs and CI tests (Python $("$tmp/venv/bin/python" -c 'import sys; print(*sys.version_info[:2], sep=".")'))."
  echo "# Written by scripts/lock.sh on $(date -u +%Y-%m-%d); pip users of the package get pyproject.toml's ranges instead."
  # local version labels (torch's +cpu) dropped: the same release is then found on any index, and a CUDA build
  # already installed is left alone by setup.sh
  "${pip[@]}" freeze --all --exclude deep-delta-learning | sed -E 's/\+[A-Za-z0-9.]+$//' | LC_ALL=C sort -f
} > requirements.lock.tmp
mv requirements.lock.tmp requirements.lock
echo "wrote requirements.lock ($(grep -vc '^#' requirements.lock) distributions)"
