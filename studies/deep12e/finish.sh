#!/usr/bin/env bash
# The strong-baseline study's comparisons across its stages (docs/evidence.md, first section), once run.sh has
# finished what they read; each from the evaluation runs' test.json, paired by evaluation seed on the same windows
# (benchmarks/tools/paired_test.py), written to OUT/paired/NAME.md and .json:
#   baseline_vs_old   the strong baseline (embedding normed) against the old one (no embedding norm, lr 2e-3):
#                     how much the recipe moved the baseline
#   VARIANT_vs_old    each other AdamW design against the old baseline: the old headline's question on the new
#                     windows (how much of the deep study's 0.42 survives the strong baseline is VARIANT_vs_old
#                     minus baseline_vs_old; the AdamW report, adamw/all/compare.md, has VARIANT against the strong
#                     baseline itself)
#   muon_VARIANT      each design under Muon against itself under AdamW (muon/all against adamw/all)
# A comparison whose records are not there yet is skipped and said.
#   bash studies/deep12e/finish.sh [OUT]        (default runs/deep12e; run from the repository root)
set -uo pipefail
out=${1:-runs/deep12e}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../commands.sh"   # $py: $PYTHON, else .venv/bin/python, else python3
tool=$here/../../benchmarks/tools/paired_test.py
mkdir -p "$out/paired"
pair() {  # NAME A_OUT:VARIANT B_OUT:VARIANT
  local name=$1 a=$2 b=$3
  if [ -d "${a%:*}/evaluation" ] && [ -d "${b%:*}/evaluation" ]; then
    "$py" "$tool" "$a" "$b" --json "$out/paired/$name.json" > "$out/paired/$name.md" && cat "$out/paired/$name.md" \
      || echo "finish.sh: $name: not compared (the line above says why)" >&2
  else
    echo "finish.sh: $name: skipped, ${a%:*}/evaluation or ${b%:*}/evaluation is not there yet" >&2
  fi
  echo
}
pair baseline_vs_old "$out/adamw/all:baseline" "$out/old_baseline:baseline"
for v in ddl-cc ddl-cc-write peri-ln attnres-block; do
  pair "${v}_vs_old" "$out/adamw/all:$v" "$out/old_baseline:baseline"
done
for v in baseline ddl-cc ddl-cc-write; do
  pair "muon_$v" "$out/muon/all:$v" "$out/adamw/all:$v"
done
