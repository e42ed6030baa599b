#!/usr/bin/env bash
# Test the generation and evaluation paths at both ends of the supported dependency range (docs/inference.md):
#
#   bash scripts/check-deps.sh lowest     # transformers, lm-eval and accelerate at the lowest releases
#                                         # pyproject.toml admits, the rest resolved by pip, in .venv-lowest
#   bash scripts/check-deps.sh newest     # requirements.lock, then the newest transformers, lm-eval and
#                                         # accelerate installed over it, in .venv-newest
#   bash scripts/check-deps.sh newest tests/hf -x      # other pytest arguments
#
# Needs the package index (it installs); the tests themselves run offline. CI tests the locked set
# (scripts/setup.sh); a maintainer runs this before widening a range or refreshing the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
end=${1:-}
shift || true
PY=${PYTHON:-python3}
LOCK=requirements.lock
# the lowest releases pyproject.toml admits (keep in step with its ranges)
LOWEST=("transformers==5.23.0" "lm-eval==0.4.10" "accelerate==1.1.0")
NEWEST=(transformers lm-eval accelerate)
case "$end" in
  lowest | newest) ;;
  *) echo "usage: bash scripts/check-deps.sh lowest|newest [pytest args]" >&2; exit 2 ;;
esac
venv=.venv-$end
rm -rf "$venv"
"$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q -c "$LOCK" pip setuptools
"${pip[@]}" install -q "$(grep '^torch==' "$LOCK")"
if [ "$end" = lowest ]; then
  "${pip[@]}" install -q -e ".[dev]" "${LOWEST[@]}"
else
  "${pip[@]}" install -q -c "$LOCK" -e ".[dev]"
  "${pip[@]}" install -q --upgrade "${NEWEST[@]}"
fi
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|lm[-_]eval|accelerate|tokenizers|huggingface[-_]hub) '
if [ $# -eq 0 ]; then
  set -- tests/hf tests/eval tests/models -q
fi
"$venv/bin/python" -m pytest "$@"
