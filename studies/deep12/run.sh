#!/usr/bin/env bash
# The deep study (issue 57; docs/evidence.md, "The deep study"): 12 layers, width 64, the prose-v1 corpus, each
# variant's lr chosen on val at seeds 0-1, then 4 fresh seeds (100-103) reported on test. Two halves in two processes
# of one thread each (the faster way on the 2-core machine, docs/evidence.md says what was measured), then one
# `ddl compare` over all six variants in OUT/all (the halves copied in: every run reused, the report and the step
# times of all six measured in one process). Resumable: run it again and only what is missing trains.
#   bash studies/deep12/run.sh [OUT]              (default runs/deep12)
#   CHECK="VARIANT=R ..." bash studies/deep12/run.sh OUT   (the merged call also trains the break-even checks)
set -uo pipefail
out=${1:-runs/deep12}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../commands.sh"   # $ddl: $DDL, else .venv/bin/ddl, else ddl on PATH (one line and exit 2 if none)
source "$here/settings.sh"   # data (prepared on first use) and the common settings of every call
mkdir -p "$out"
"$ddl" compare "${common[@]}" --time-repeats 5 --variants baseline ddl-cc ddl-cc-write --out "$out/p1" > "$out/p1.log" 2>&1 &
"$ddl" compare "${common[@]}" --time-repeats 5 --variants peri-ln attnres-block ddl-cc-untied --out "$out/p2" > "$out/p2.log" 2>&1 &
wait
mkdir -p "$out/all"
cp -rn "$out/p1/." "$out/all/" && cp -rn "$out/p2/." "$out/all/"
"$ddl" compare "${common[@]}" --time-repeats 5 --variants "${variants[@]}" ${CHECK:+--break-even-check $CHECK} \
  --out "$out/all" 2>&1 | tee "$out/all.log"
