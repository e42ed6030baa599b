#!/usr/bin/env bash
# Copy the study's records (no checkpoints) from its run directory into this folder, in the layout `ddl compare`
# writes, so that a copy of this folder in a run directory is reused (only what is missing trains), then pack each
# run's metrics (benchmarks/tools/pack_records.py; studies/README.md says why). A run of a stage's all/ that is a copy
# of its p1/'s or p2/'s (run.sh copies the halves in) is kept once, in its half.
#   bash studies/deep12e/keep.sh [RUN_DIR]        (default /work/runs/deep12e)
set -euo pipefail
src=${1:-/work/runs/deep12e}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../commands.sh"   # $py: $PYTHON, else .venv/bin/python, else python3
[ -d "$src" ] || { echo "keep.sh: $src is not a directory" >&2; exit 2; }
cd "$src"
copy_of_half() {  # STAGE/all/REL holds the records STAGE/p1/REL or STAGE/p2/REL holds, file for file
  local stage=${1%%/*} rel=${1#*/all/} half f
  for half in p1 p2; do
    [ -f "$stage/$half/$rel/run.json" ] || continue
    for f in "$1"/run.json "$1"/metrics.jsonl "$1"/metrics.jsonl.gz "$1"/test.json; do
      [ -e "$f" ] || continue
      cmp -s "$f" "$stage/$half/$rel/${f##*/}" || continue 2
    done
    return 0
  done
  return 1
}
for part in adamw/p1 adamw/p2 adamw/all old_baseline muon/p1 muon/p2 muon/all length/p1 length/p2 length/all paired; do
  [ -d "$part" ] || continue
  # every finished or running run's record, and the study's reports and figures; never a checkpoint
  find "$part" \( -name checkpoints -prune \) -o -type f \( -name run.json -o -name metrics.jsonl \
    -o -name metrics.jsonl.gz -o -name test.json -o -name '*.md' -o -name '*.json' -o -name '*.png' \) -print |
  while read -r f; do
    dir=$(dirname "$f")
    case "$part" in
      */all) if [ -f "$dir/run.json" ] && copy_of_half "$dir"; then continue; fi ;;
    esac
    case "$f" in  # the figures of the stages' own reports only (each lr's and each half's are redrawn from the runs)
      */p1/*.png | */p2/*.png | */lr_*/*.png) continue ;;
    esac
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
