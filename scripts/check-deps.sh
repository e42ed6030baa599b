#!/usr/bin/env bash
# Test the package at both ends of the supported dependency range (docs/inference.md, "Supported versions"):
#
#   bash scripts/check-deps.sh lowest     # torch, transformers, lm-eval and accelerate at the lowest releases
#                                         # pyproject.toml admits, the rest resolved by pip, in .venv-lowest
#   bash scripts/check-deps.sh newest     # the newest torch release, requirements.lock for the rest, then the
#                                         # newest transformers, lm-eval and accelerate over it, in .venv-newest
#   bash scripts/check-deps.sh newest tests/hf -x      # other pytest arguments
#
# torch comes from the package index as any `pip install` user gets it: on Linux x86_64 PyPI's wheel is the CUDA
# build with its triton and nvidia-* libraries (several GB); without a GPU it runs on the CPU, and the Triton
# kernels are tested in the Triton interpreter (tests/conftest.py). The default tests are those that change with
# torch and the Hugging Face stack: custom ops, Triton kernels and fullgraph compile (tests/ops, tests/models),
# the layers, generation and evaluation; two workers (pytest-xdist).
#
# Needs the package index (it installs); the tests themselves run offline. CI tests the locked set
# (scripts/setup.sh); a maintainer runs this before widening a range or refreshing the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
end=${1:-}
shift || true
PY=${PYTHON:-python3}
LOCK=requirements.lock
# the lowest releases pyproject.toml admits (keep in step with its ranges, torch's included)
LOWEST=("torch==2.12.0" "transformers==5.23.0" "lm-eval==0.4.12" "accelerate==1.1.0")
NEWEST=(transformers lm-eval accelerate)
case "$end" in
  lowest | newest) ;;
  *) echo "usage: bash scripts/check-deps.sh lowest|newest [pytest args]" >&2; exit 2 ;;
esac
venv=.venv-$end
rm -rf "$venv"
"$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# The lock without the torch stack: torch pins its own triton and nvidia-* releases (as in scripts/setup.sh).
grep -viE '^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==' "$LOCK" > "$constraints"
"${pip[@]}" install -q -c "$constraints" pip setuptools
if [ "$end" = lowest ]; then
  "${pip[@]}" install -q -e ".[dev]" "${LOWEST[@]}"
else
  # The newest torch whatever a pip configuration caps it at: a constraint file set in pip.conf (or
  # PIP_CONSTRAINT) would hold torch back, and every later install in this venv would downgrade it again.
  # PIP_CONSTRAINT replaces the configured list (an empty value would be ignored, hence /dev/null).
  export PIP_CONSTRAINT=/dev/null
  "${pip[@]}" install -q --upgrade torch
  "${pip[@]}" install -q -c "$constraints" -e ".[dev]"
  "${pip[@]}" install -q --upgrade "${NEWEST[@]}"
fi
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|lm[-_]eval|accelerate|tokenizers|huggingface[-_]hub) '
if [ $# -eq 0 ]; then
  set -- tests/ops tests/layers tests/models tests/hf tests/eval -q -n 2
fi
"$venv/bin/python" -m pytest "$@"
