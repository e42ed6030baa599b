#!/usr/bin/env bash
# The deep study's checks and figures, once run.sh has finished (docs/evidence.md, "The deep study"):
#   1. with VARIANT=R, the break-even check: one exact run of VARIANT at R times fewer steps (`--step-costs`), at the
#      first evaluation seed, beside the report's r* read off the truncated curve (choose R near the merged
#      report's r*); every other run of the comparison is reused;
#   2. test loss against lr: every grid run measured on the evaluation runs' test windows
#      (benchmarks/tools/grid_test_loss.py; OUT/all/test_vs_lr.png and .json);
#   3. "why" at depth: `ddl analyze` of each variant's first evaluation model (seed 100; one seed, said to be one)
#      on the val split, and the figure of them all through the depth (benchmarks/tools/why_figure.py).
#   bash studies/deep12/finish.sh [OUT] [VARIANT=R]        (default runs/deep12; run from the repository root)
set -euo pipefail
out=${1:-runs/deep12}
check=${2:-}
ddl=${DDL:-ddl}
py=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/settings.sh"
[ -f "$out/all/compare.json" ] || { echo "finish.sh: $out/all/compare.json is missing; run run.sh first" >&2; exit 2; }
if [ -n "$check" ]; then
  $ddl compare "${common[@]}" --time-repeats 5 --variants "${variants[@]}" --break-even-check "$check" \
    --out "$out/all" 2>&1 | tee "$out/break_even.log"
fi
$py "$here/../../benchmarks/tools/grid_test_loss.py" "$out/all" --data "$data" | tee "$out/test_vs_lr.md"
reports=()
for v in "${variants[@]}"; do
  [ -f "$out/all/why/$v/analysis.json" ] || $ddl analyze --model "$out/all/evaluation/seed_100/$v" --data "$data" \
    --threads 1 --no-progress --out "$out/all/why/$v" > /dev/null   # an analysis already made is kept
  reports+=("$v=$out/all/why/$v/analysis.json")
done
$py "$here/../../benchmarks/tools/why_figure.py" --out "$out/all/why/why.png" "${reports[@]}"
