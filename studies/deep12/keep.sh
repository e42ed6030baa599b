#!/usr/bin/env bash
# Copy the deep study's records (no checkpoints) from its run directory into this folder, keeping the layout that
# `ddl compare` writes, so that a copy of this folder in a run directory is reused (and only what is missing trains),
# then pack each run's metrics into metrics.jsonl.gz (benchmarks/tools/pack_records.py; studies/README.md says why).
# A run of all/ that is a copy of p1/'s or p2/'s (run.sh copies the halves into all/) is not kept twice: all/ keeps
# the merged call's reports and the runs only it trained (the break-even checks); run.sh copies the halves in again.
#   bash studies/deep12/keep.sh [RUN_DIR]        (default /work/runs/deep12)
set -euo pipefail
src=${1:-/work/runs/deep12}
source "$(cd "$(dirname "$0")" && pwd)/../commands.sh"   # $py: $PYTHON, else .venv/bin/python, else python3
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$src" ] || { echo "keep.sh: $src is not a directory" >&2; exit 2; }
cd "$src"
copy_of_half() {  # the run directory all/REL holds the records p1/REL or p2/REL holds, file for file
  local rel=${1#all/} half f
  for half in p1 p2; do
    [ -f "$half/$rel/run.json" ] || continue
    for f in "$1"/run.json "$1"/metrics.jsonl "$1"/metrics.jsonl.gz "$1"/test.json; do
      [ -e "$f" ] || continue
      cmp -s "$f" "$half/$rel/${f##*/}" || continue 2
    done
    return 0
  done
  return 1
}
for part in p1 p2 all; do
  [ -d "$part" ] || continue
  # every finished or running run's record, and the study's reports and figures; never a checkpoint
  find "$part" \( -name checkpoints -prune \) -o -type f \( -name run.json -o -name metrics.jsonl \
    -o -name metrics.jsonl.gz -o -name test.json -o -name '*.md' -o -name '*.json' -o -name '*.png' \) -print |
  while read -r f; do
    dir=$(dirname "$f")
    if [ "$part" = all ] && [ -f "$dir/run.json" ] && copy_of_half "$dir"; then continue; fi
    mkdir -p "$here/$dir"
    case "$f" in  # the record copied now replaces the one kept, in either form
      */metrics.jsonl) rm -f "$here/$f.gz" ;;
      */metrics.jsonl.gz) rm -f "$here/${f%.gz}" ;;
    esac
    cp -p "$f" "$here/$f"
  done
done
$py "$here/../../benchmarks/tools/pack_records.py" "$here"
echo "kept the records of $src in $here"
