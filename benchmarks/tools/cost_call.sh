#!/usr/bin/env bash
# The queue's second device call (issue 59, item 2): the cost of every design beside its break-even ratio.
#
# Usage (on the GPU machine, repository root; benchmarks/QUEUE.md has the exact command and what to carry):
#   COMMIT=<sha> OUT=<dir> bash benchmarks/tools/cost_call.sh
# Environment (checked before any step, as first_call.sh's: benchmarks/tools/device_call.sh, the machinery both share):
#   OUT, DEADLINE (default 540 s), WHEELS, COMMIT, WORKERS, DRY, DRY_SCALE, DRY_SLEEP, DRY_HANG, DRY_FAIL, DRY_LOSE:
#             as first_call.sh's header says (OUT a new or empty directory; DEADLINE at least env's minimum, 15 s)
#   INKERNEL  1 (default) or 0: DDL_INKERNEL_REDUCE in the switched-on bench; 0 when call 1 found the in-kernel
#             reduction failing on the GPU
#
# Steps, in order (cap / minimum seconds): env (60 / 15): wheels, versions, the device; rules (90 / 40): the fused
# rules' kernel tests on the GPU (tests/ops/test_fused_rules.py, 8 pytest processes; if they fail, the switched-on
# bench runs with DDL_FUSED_RULES=0 and the timeline says so); bench_on (200 / 120) and bench_off (200 / 120): one
# `ddl bench --compile` process each, the trainer's step at 32 x 1024 tokens, --preset small (124M), bf16 autocast,
# of baseline, peri-ln, ddl-cc, ddl-cc-write, ddl-cc-untied, mhc and attnres-block, interleaved, each process with its
# own baseline, with peak memory; bench_on with every switch on (DDL_FUSED_RULES, DDL_FUSE_NEXT_NORM, DDL_TC_ONE_PASS,
# DDL_INKERNEL_REDUCE=$INKERNEL), bench_off with every switch off (the defaults). Estimate: the compiled bench took
# 60-90 s per process of 4 variants on an H200 (benchmarks/records/2026-11-26-prefetch-norm-launch-h200/), so about
# 105-160 s for 7; with the wheels (about 20 s) and the tests (about 60 s), 5-7 minutes; the caps add up to 550 s and
# the deadline (540 s) cuts what does not fit.
#
# Files in OUT (6): timeline.tsv, steps.log, env.txt, tests.txt, bench.md (the two tables, "## bench_on ..."),
# samples.jsonl (their samples and switches, one line each).
#
# Exit status (first_call.sh's): 2 a bad value, nothing run; 4 the env step failed (no GPU, ...), no other step run;
# 3 a result not kept; 5 a step failed, timed out or was skipped (failed rule tests included, though the benches
# still run); 0 only when every step ran and passed. Each non-zero end says why in one line on stderr.
set -uo pipefail
NAME=cost_call.sh
INKERNEL=${INKERNEL:-1}
call_checks() { [ "$INKERNEL" = 0 ] || [ "$INKERNEL" = 1 ] || _refuse "INKERNEL must be 0 or 1, got '$INKERNEL'"; }
# shellcheck source=benchmarks/tools/device_call.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call.sh"
VARIANTS=(baseline peri-ln ddl-cc ddl-cc-write ddl-cc-untied mhc attnres-block)
BENCH=(--preset small --device cuda --dtype bfloat16 --compile --batch-size 32 --seq-len 1024 --repeats 3
       --decode-tokens 0 --variants "${VARIANTS[@]}")

env_first  # env (60 / 15): a failed one ends the call here
step rules 90 40 env DDL_INKERNEL_REDUCE="$INKERNEL" "${PYTEST[@]}" tests/ops/test_fused_rules.py
rules=$(said $?)
fused=1
if [ "$rules" != "rc 0" ]; then
  fused=0
  note "=== the fused rules' tests failed or did not run ($rules): bench_on with DDL_FUSED_RULES=0"
fi
KEEPS="bench.md samples.jsonl" step bench_on 200 120 env DDL_FUSED_RULES="$fused" DDL_FUSE_NEXT_NORM=1 \
  DDL_TC_ONE_PASS=1 DDL_INKERNEL_REDUCE="$INKERNEL" bash -c 'bench "$@"' bench \
  "bench_on: every switch on (DDL_FUSED_RULES=$fused, DDL_INKERNEL_REDUCE=$INKERNEL)" "$PYTHONPATH" "${BENCH[@]}"
KEEPS="bench.md samples.jsonl" step bench_off 200 120 env DDL_FUSED_RULES=0 DDL_FUSE_NEXT_NORM=0 DDL_TC_ONE_PASS=0 \
  DDL_INKERNEL_REDUCE=0 bash -c 'bench "$@"' bench "bench_off: every switch off (the defaults)" "$PYTHONPATH" \
  "${BENCH[@]}"
call_end
