#!/usr/bin/env bash
# The deep study's checks and figures, once run.sh has finished (docs/evidence.md, "The deep study"):
#   1. test loss against lr: every grid run measured on the evaluation runs' test windows
#      (benchmarks/tools/grid_test_loss.py; OUT/all/test_vs_lr.png and .json);
#   2. "why" at depth: `ddl analyze` of each variant's first evaluation model (seed 100; one seed, said to be one)
#      on the val split, and the figure of them all through the depth (benchmarks/tools/why_figure.py).
#   bash studies/deep12/finish.sh [OUT]        (default runs/deep12; run from the repository root)
# The break-even checks are trained by run.sh's merged call (CHECK=...).
set -euo pipefail
out=${1:-runs/deep12}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../commands.sh"   # $ddl and $py: from $DDL / $PYTHON, else .venv/bin/, else PATH
source "$here/settings.sh"
[ -f "$out/all/compare.json" ] || { echo "finish.sh: $out/all/compare.json is missing; run run.sh first" >&2; exit 2; }
"$py" "$here/../../benchmarks/tools/grid_test_loss.py" "$out/all" --data "$data" | tee "$out/all/test_vs_lr.md"
reports=()
for v in "${variants[@]}"; do
  [ -f "$out/all/why/$v/analysis.json" ] || "$ddl" analyze --model "$out/all/evaluation/seed_100/$v" --data "$data" \
    --threads 1 --no-progress --out "$out/all/why/$v" > /dev/null   # an analysis already made is kept
  reports+=("$v=$out/all/why/$v/analysis.json")
done
"$py" "$here/../../benchmarks/tools/why_figure.py" --out "$out/all/why/why.png" "${reports[@]}"
