#!/usr/bin/env bash
# Copy the deep study's records (no checkpoints) from its run directory into this folder, keeping the layout that
# `ddl compare` writes, so that a copy of this folder in a run directory is reused (and only what is missing trains):
#   bash studies/deep12/keep.sh [RUN_DIR]        (default /work/runs/deep12)
set -euo pipefail
src=${1:-/work/runs/deep12}
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$src" ] || { echo "keep.sh: $src is not a directory" >&2; exit 2; }
cd "$src"
for part in p1 p2 all; do
  [ -d "$part" ] || continue
  # every finished or running run's record, and the study's reports and figures; never a checkpoint
  find "$part" \( -name checkpoints -prune \) -o -type f \( -name run.json -o -name metrics.jsonl -o -name test.json \
    -o -name '*.md' -o -name '*.json' -o -name '*.png' \) -print | while read -r f; do
    mkdir -p "$here/$(dirname "$f")"
    cp -p "$f" "$here/$f"
  done
done
echo "kept the records of $src in $here"
