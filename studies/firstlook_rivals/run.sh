#!/usr/bin/env bash
# Issue 56's first look (docs/rivals.md, "A first look"): the embedded text, the tiny preset (width 256, 4 layers),
# 600 steps (ddl compare's defaults), every new design beside the baseline, DDL-CC and its write-only twin, at the
# lrs 1e-3 and 2e-3, 2 seeds. Resumable: run it again and only what is missing trains. --eval-windows first: the
# records were made before the setting existed, validating on the split's first windows (docs/training.md).
#   bash studies/firstlook_rivals/run.sh [OUT]        (default runs/firstlook_rivals)
set -euo pipefail
source "$(dirname "$0")/../commands.sh"   # $ddl: $DDL, else .venv/bin/ddl, else ddl on PATH (one line if none)
exec "$ddl" compare --variants baseline ddl-cc ddl-cc-write peri-ln attnres ddl-dv1-untied ddl-tc-untied \
  ddl-cc-untied --lrs 1e-3 2e-3 --seeds 2 --eval-windows first --threads 1 --time-repeats 3 --no-progress \
  --out "${1:-runs/firstlook_rivals}"
