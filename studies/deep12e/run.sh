#!/usr/bin/env bash
# The deep study again, against the strong baseline (issue 64; docs/evidence.md, first section): 12 layers, width 64,
# prose-v1, the embedding normed in every design (the deep12 recipe), spread validation and test windows, each design
# at its own lr from its own grid (chosen on val at seeds 0-1), 4 fresh seeds (100-103) reported on 250K test tokens,
# with the loss per package. Stages (STAGE=adamw | old | muon | all, default all), each resumable (run it again and
# only what is missing trains):
#   adamw  baseline, DDL-CC, its write-only twin, Peri-LN (the paper's form), Block AttnRes: two halves in two
#          processes of one thread each, then one `ddl compare` over all five in OUT/adamw/all (every run reused; the
#          report and the step times of all five measured in one process)
#   old    the old baseline (no embedding norm) at the deep study's chosen lr 2e-3, the same 4 fresh seeds and windows
#   muon   baseline, DDL-CC and the twin under --optimizer muon, each with its own grid over Muon's lr
#   length baseline, DDL-CC and the twin at 4x the tokens (1200 steps, their own schedule), each with a grid of three
#          around its 300-step optimum (half, the same, twice: read from adamw/all/selection.json, so after adamw);
#          not part of `all` (it costs about four times the AdamW stage): run it with STAGE=length
#   bash studies/deep12e/run.sh [OUT]              (default runs/deep12e)
set -uo pipefail
out=${1:-runs/deep12e}
stage=${STAGE:-all}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../commands.sh"   # $ddl: $DDL, else .venv/bin/ddl, else ddl on PATH (one line and exit 2 if none)
source "$here/settings.sh"      # $data (prepared on first use), the common settings and each design's grid
mkdir -p "$out"
merge() {  # the halves' runs and reports copied into DEST (never over what is there), then one call over all
  local dest=$1; shift
  mkdir -p "$dest"
  for half in "$@"; do cp -rn "$half/." "$dest/"; done
}
if [ "$stage" = adamw ] || [ "$stage" = all ]; then
  a=$out/adamw
  mkdir -p "$a"
  "$ddl" compare "${common[@]}" --time-repeats 0 --variants baseline ddl-cc --lrs "$grid_baseline" "$grid_cc" \
    --out "$a/p1" > "$a/p1.log" 2>&1 &
  "$ddl" compare "${common[@]}" --time-repeats 0 --variants ddl-cc-write peri-ln attnres-block \
    --lrs "$grid_twin" "$grid_peri" "$grid_attnres" --out "$a/p2" > "$a/p2.log" 2>&1 &
  wait
  merge "$a/all" "$a/p1" "$a/p2"
  "$ddl" compare "${common[@]}" --time-repeats 5 --variants baseline ddl-cc ddl-cc-write peri-ln attnres-block \
    --lrs "$grid_baseline" "$grid_cc" "$grid_twin" "$grid_peri" "$grid_attnres" --out "$a/all" 2>&1 | tee "$a/all.log"
fi
if [ "$stage" = old ] || [ "$stage" = all ]; then
  "$ddl" compare "${common[@]}" --time-repeats 0 --set model.embed_norm=false --variants baseline --lrs 2e-3 \
    --out "$out/old_baseline" 2>&1 | tee "$out/old_baseline.log"
fi
if [ "$stage" = muon ] || [ "$stage" = all ]; then
  m=$out/muon
  mkdir -p "$m"
  "$ddl" compare "${common[@]}" --optimizer muon --time-repeats 0 --variants baseline ddl-cc-write \
    --lrs "$mgrid_baseline" "$mgrid_twin" --out "$m/p1" > "$m/p1.log" 2>&1 &
  "$ddl" compare "${common[@]}" --optimizer muon --time-repeats 0 --variants ddl-cc --lrs "$mgrid_cc" \
    --out "$m/p2" > "$m/p2.log" 2>&1 &
  wait
  merge "$m/all" "$m/p1" "$m/p2"
  "$ddl" compare "${common[@]}" --optimizer muon --time-repeats 5 --variants baseline ddl-cc ddl-cc-write \
    --lrs "$mgrid_baseline" "$mgrid_cc" "$mgrid_twin" --out "$m/all" 2>&1 | tee "$m/all.log"
fi
if [ "$stage" = length ]; then
  selection=$out/adamw/all/selection.json
  [ -f "$selection" ] || { echo "deep12e: the length stage reads each design's 300-step lr from $selection; run STAGE=adamw first" >&2; exit 2; }
  # each design's grid: half, the same and twice its chosen 300-step lr (a best at an edge extends it, as above)
  read -r lgrid_baseline lgrid_cc lgrid_twin < <("$py" - "$selection" <<'PY'
import json, sys
chosen = json.load(open(sys.argv[1]))["lr_selection"]["chosen"]
print(" ".join(f"{v}={chosen[v]['lr'] / 2:g},{chosen[v]['lr']:g},{chosen[v]['lr'] * 2:g}"
               for v in ("baseline", "ddl-cc", "ddl-cc-write")))
PY
)
  [ -n "$lgrid_twin" ] || { echo "deep12e: no chosen lr for every design in $selection" >&2; exit 2; }
  l=$out/length
  mkdir -p "$l"
  "$ddl" compare "${common[@]}" --steps 1200 --time-repeats 0 --variants baseline ddl-cc-write \
    --lrs "$lgrid_baseline" "$lgrid_twin" --out "$l/p1" > "$l/p1.log" 2>&1 &
  "$ddl" compare "${common[@]}" --steps 1200 --time-repeats 0 --variants ddl-cc --lrs "$lgrid_cc" \
    --out "$l/p2" > "$l/p2.log" 2>&1 &
  wait
  merge "$l/all" "$l/p1" "$l/p2"
  "$ddl" compare "${common[@]}" --steps 1200 --time-repeats 0 --variants baseline ddl-cc ddl-cc-write \
    --lrs "$lgrid_baseline" "$lgrid_cc" "$lgrid_twin" --out "$l/all" 2>&1 | tee "$l/all.log"
fi
