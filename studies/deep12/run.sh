#!/usr/bin/env bash
# The deep study (issue 57; docs/evidence.md, "The deep study"): 12 layers, width 64, the prose-v1 corpus, each
# variant's lr chosen on val at seeds 0-1, then 4 fresh seeds (100-103) reported on test. Two halves in two processes
# of one thread each (the faster way on the 2-core machine, docs/evidence.md says what was measured), then one
# `ddl compare` over all six variants in OUT/all (the halves copied in: every run reused, the report and the step
# times of all six measured in one process). Resumable: run it again and only what is missing trains.
#   bash studies/deep12/run.sh [OUT]              (default runs/deep12)
set -uo pipefail
out=${1:-runs/deep12}
ddl=${DDL:-ddl}
data=$($ddl data prepare --source prose-v1 --val-fraction 0.02 --test-fraction 0.02 --num-proc 1 \
  --out "$HOME/.cache/deep_delta/data/prose-v1-byte" >/dev/null && echo "$HOME/.cache/deep_delta/data/prose-v1-byte")
common=(--data "$data" --preset tiny --set model.hidden_size=64 --set model.num_hidden_layers=12
  --set model.num_attention_heads=2 --set model.max_position_embeddings=256 --set model.vocab_size=257
  --steps 300 --batch-size 16 --seq-len 256 --warmup-steps 30 --eval-every 50 --eval-batches 16
  --save-every 50 --keep 1 --lrs 1e-3 2e-3 4e-3 8e-3 1.6e-2 3.2e-2 --seeds 2 --eval-seeds 4 --eval-seed-start 100
  --test-tokens 250K --compile --threads 1 --no-progress)
mkdir -p "$out"
$ddl compare "${common[@]}" --time-repeats 5 --variants baseline ddl-cc ddl-cc-write --out "$out/p1" > "$out/p1.log" 2>&1 &
$ddl compare "${common[@]}" --time-repeats 5 --variants peri-ln attnres-block ddl-cc-untied --out "$out/p2" > "$out/p2.log" 2>&1 &
wait
mkdir -p "$out/all"
cp -rn "$out/p1/." "$out/all/" && cp -rn "$out/p2/." "$out/all/"
$ddl compare "${common[@]}" --time-repeats 5 --variants baseline ddl-cc ddl-cc-write peri-ln attnres-block \
  ddl-cc-untied --out "$out/all" 2>&1 | tee "$out/all.log"
