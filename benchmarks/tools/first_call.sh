#!/usr/bin/env bash
# One prepared device call: the kernels changed since a603936 on a real GPU, safest checks first (issue 47).
#
# Usage (on the GPU machine, repository root; benchmarks/QUEUE.md has the exact command and what to carry):
#   COMMIT=<sha> bash benchmarks/tools/first_call.sh
# Environment:
#   OUT       where results go (default ./gpu_out): a new or empty directory (one that holds anything, an
#             earlier call's results, is refused); at most 8 files, no folders (the device returns 8 files)
#   DEADLINE  seconds for the whole call (default 540, 9 minutes): every step runs under `timeout -k 5` of
#             min(its cap, the time left - 5 s) and is skipped when less than its minimum is left; a DEADLINE
#             below the first step's minimum (env, 15 s) is refused
#   BEFORE    a directory holding a603936's src/ (the "before" bench; skipped without it)
#   WHEELS    a directory of wheels installed first with pip --target (default .whl; the device image has
#             transformers 5.17, below the floor of 5.23)
#   COMMIT    the commit this tree is (the device copy has no .git), recorded in env.txt; required (a dry run: "dry")
#   WORKERS   pytest processes of the test steps (default 8)
#   DRY=1     stand-in steps (sleep DRY_SLEEP s each, default 1, and add a line to the step's files; the step named
#             DRY_HANG sleeps past its cap, the one named DRY_FAIL exits 3, the one named DRY_LOSE keeps nothing)
#             with every cap and minimum divided by DRY_SCALE (default 60): shows the deadline, the skips, the
#             timeouts and the packing on any machine (tests/benchmarks/test_first_call.py)
# Every value is checked before any step (benchmarks/tools/device_call.sh, the machinery this shares with
# cost_call.sh): a bad one is one line on stderr and exit 2. A failed env step (no GPU: no nvidia-smi, a torch
# without CUDA or that sees no device) ends the call there: one line saying why, exit 4, no other step run. Exit 3
# when a result could not be kept (a file of OUT not written), 5 when a step failed, timed out or was skipped for
# want of time (one line naming them; the timeline says more), 0 only when every step ran and passed.
#
# Steps, in order (cap / minimum seconds): env (60 / 15): wheels, versions, the device; partials (150 / 40):
# tests/ops/test_partials.py, the reduction protocol; probe (180 / 60): reduce_probe.py, every reducing backward at
# 32 x 1024 tokens; newtests (150 / 40): the new kernels' tests (next norm in the update, TC's one pass, the fused
# model); bench_on / bench_off / bench_before (150 / 70 each): `ddl bench --compile` at 32 x 1024, every variant,
# with the switches on, off, and a603936's library; oldtests (150 / 40): the older kernel tests. If `partials` or
# `probe` fails or is skipped, the later steps run with the in-kernel reduction off (DDL_INKERNEL_REDUCE=0); the
# call still exits non-zero.
#
# Files in OUT (7): timeline.tsv (step, start s, seconds, exit code, status), steps.log (every step's output, its
# last 300 lines), env.txt, probe.json, bench.md (the three tables, "## bench_on" ...), samples.jsonl (their samples
# and switches, one line each), tests.txt (each test step's summary lines). Everything is written as the call goes:
# a call cut off keeps what finished.
set -uo pipefail
NAME=first_call.sh
# shellcheck source=benchmarks/tools/device_call.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call.sh"
BENCH=(--preset small --device cuda --dtype bfloat16 --compile --batch-size 32 --repeats 3 --decode-tokens 0)

env_first  # env (60 / 15): a failed one ends the call here
step partials 150 40 env DDL_INKERNEL_REDUCE=1 "${PYTEST[@]}" tests/ops/test_partials.py
protocol=$(said $?)
KEEPS=probe.json step probe 180 60 "${_py[@]}" benchmarks/tools/reduce_probe.py --out "$OUT/probe.json"
probe=$(said $?)
inkernel=1
if [ "$protocol" != "rc 0" ] || [ "$probe" != "rc 0" ]; then
  inkernel=0
  note "=== the reduction protocol failed or was not checked (partials $protocol, probe $probe): later steps with \
DDL_INKERNEL_REDUCE=0"
fi
step newtests 150 40 env DDL_INKERNEL_REDUCE=$inkernel "${PYTEST[@]}" tests/ops/test_update_and_norm.py \
  tests/ops/test_kernels_token_read.py tests/ops/test_kernels_fused_model.py
KEEPS="bench.md samples.jsonl" step bench_on 150 70 env DDL_INKERNEL_REDUCE=$inkernel DDL_FUSE_NEXT_NORM=1 \
  DDL_TC_ONE_PASS=1 bash -c 'bench "$@"' bench bench_on "$PYTHONPATH" "${BENCH[@]}"
KEEPS="bench.md samples.jsonl" step bench_off 150 70 env DDL_INKERNEL_REDUCE=0 DDL_FUSE_NEXT_NORM=0 \
  DDL_TC_ONE_PASS=0 bash -c 'bench "$@"' bench bench_off "$PYTHONPATH" "${BENCH[@]}"
if [ -d "${BEFORE:-}/src" ] || [ "$DRY" = 1 ]; then
  KEEPS="bench.md samples.jsonl" step bench_before 150 70 bash -c 'bench "$@"' bench bench_before \
    "${BEFORE:-}/src:/tmp/site" "${BENCH[@]}"
else
  row bench_before "$(( $(date +%s) - T0 ))" 0 - "skipped (BEFORE not set)"
fi
step oldtests 150 40 env DDL_INKERNEL_REDUCE=$inkernel "${PYTEST[@]}" tests/ops/test_kernels.py \
  tests/ops/test_kernels_recompute.py tests/ops/test_kernel_partials.py tests/models/test_state_dtype.py \
  tests/ops/test_norm_gate_value.py tests/ops/test_custom_ops.py tests/ops/test_hyper_kernels.py \
  tests/ops/test_backend_routing.py tests/hf/test_static_decode.py
call_end
