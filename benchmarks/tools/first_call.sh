#!/usr/bin/env bash
# One prepared device call: the kernels changed since a603936 on a real GPU, safest checks first (issue 47).
#
# Usage (on the GPU machine, repository root; benchmarks/QUEUE.md has the exact command and what to carry):
#   COMMIT=<sha> bash benchmarks/tools/first_call.sh
# Environment:
#   OUT       where results go (default ./gpu_out); at most 8 files, no folders (the device returns 8 files)
#   DEADLINE  seconds for the whole call (default 540, 9 minutes): every step runs under `timeout -k 5` of
#             min(its cap, the time left - 5 s) and is skipped when less than its minimum is left
#   BEFORE    a directory holding a603936's src/ (the "before" bench; skipped without it)
#   WHEELS    a directory of wheels installed first with pip --target (default .whl; the device image has
#             transformers 5.17, below the floor of 5.23)
#   COMMIT    the commit this tree is (the device copy has no .git), recorded in env.txt
#   DRY=1     stand-in steps (sleep DRY_SLEEP s each, default 1; the step named DRY_HANG sleeps past its cap, the one
#             named DRY_FAIL exits 3) with every cap and minimum divided by DRY_SCALE (default 60): shows the
#             deadline, the skips, the timeouts and the packing on any machine (tests/benchmarks/test_first_call.py)
#
# Steps, in order (cap / minimum seconds): env (60 / 15): wheels, versions, the device; partials (150 / 40):
# tests/ops/test_partials.py, the reduction protocol; probe (180 / 60): reduce_probe.py, every reducing backward at
# 32 x 1024 tokens; newtests (150 / 40): the new kernels' tests (next norm in the update, TC's one pass, the fused
# model); bench_on / bench_off / bench_before (150 / 70 each): `ddl bench --compile` at 32 x 1024, every variant,
# with the switches on, off, and a603936's library; oldtests (150 / 40): the older kernel tests. If `partials` or
# `probe` fails, the later steps run with the in-kernel reduction off (DDL_INKERNEL_REDUCE=0).
#
# Files in OUT: timeline.tsv (step, start s, seconds, exit code, status), steps.log (every step's output, its
# last 300 lines), env.txt, probe.json, bench_on.md, bench_off.md, bench_before.md, tests.txt (each test step's
# summary lines). Everything is written as the call goes: a call cut off keeps what finished.
set -uo pipefail
OUT=${OUT:-gpu_out}
DEADLINE=${DEADLINE:-540}
DRY=${DRY:-0}
DRY_SCALE=${DRY_SCALE:-60}
DRY_SLEEP=${DRY_SLEEP:-1}
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
MARGIN=5  # seconds kept back from a step's budget for its kill and the writing after it (1 in a dry run)
[ "$DRY" = 1 ] && MARGIN=1
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
printf 'step\tstart_s\tseconds\trc\tstatus\n' > "$OUT/timeline.tsv"
: > "$OUT/steps.log"
: > "$OUT/tests.txt"

left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }

# step NAME CAP MIN COMMAND...: run COMMAND under the step's timeout, or skip it; record it in the timeline
step() {
  local name=$1 cap=$2 min=$3; shift 3
  if [ "$DRY" = 1 ]; then cap=$(( (cap + DRY_SCALE - 1) / DRY_SCALE )); min=$(( (min + DRY_SCALE - 1) / DRY_SCALE )); fi
  local start=$(( $(date +%s) - T0 )) remaining; remaining=$(left)
  if [ "$remaining" -lt "$min" ]; then
    printf '%s\t%s\t0\t-\tskipped (%ss left, needs %s)\n' "$name" "$start" "$remaining" "$min" >> "$OUT/timeline.tsv"
    echo "=== $name: skipped ($remaining s left, needs $min)" | tee -a "$OUT/steps.log"
    return 0
  fi
  local budget=$(( remaining - MARGIN < cap ? remaining - MARGIN : cap )); [ "$budget" -lt 1 ] && budget=1
  echo "=== $name (at ${start}s, up to ${budget}s)" | tee -a "$OUT/steps.log"
  local log; log=$(mktemp)
  if [ "$DRY" = 1 ]; then
    if [ "$name" = "${DRY_HANG:-}" ]; then set -- sleep $(( budget + 30 ))
    elif [ "$name" = "${DRY_FAIL:-}" ]; then set -- bash -c "echo stand-in failure; exit 3"
    else set -- sleep "$DRY_SLEEP"; fi
  fi
  timeout -k 5 "$budget" "$@" > "$log" 2>&1
  local rc=$? took=$(( $(date +%s) - T0 - start )) status=ok
  [ "$rc" -ne 0 ] && status=failed
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="timed out"
  tail -n 300 "$log" >> "$OUT/steps.log"
  tail -n 3 "$log" | sed "s/^/[$name] /"
  grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$log" | sed "s/^/[$name] /" >> "$OUT/tests.txt" || true
  rm -f "$log"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$start" "$took" "$rc" "$status" >> "$OUT/timeline.tsv"
  echo "=== $name: $status (rc $rc, ${took}s)" | tee -a "$OUT/steps.log"
  return "$rc"
}

env_step() {
  if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
      || return 1
  fi
  {
    echo "commit: ${COMMIT:-unknown}"
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    $PY - <<'PY'
import torch, triton, transformers
from deep_delta.ops import switches
p = torch.cuda.get_device_properties(0)
print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)
print("device", p.name, "SMs", p.multi_processor_count, "memory GiB", round(p.total_memory / 2**30, 1))
print("switches at start", switches.current())
PY
  } > "$OUT/env.txt" 2>&1
  local rc=$?
  cat "$OUT/env.txt"
  return $rc
}

bench() {  # bench OUTFILE [PYTHONPATH]: the compiled step at 32 x 1024, every variant of the issue, interleaved
  local out=$1 path=${2:-$PYTHONPATH}
  PYTHONPATH=$path $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 --compile \
    --batch-size 32 --repeats 3 --decode-tokens 0 --out "$out"
}

if [ "$DRY" != 1 ] && [ -d "$WHEELS" ]; then export PYTHONPATH=/tmp/site:$PYTHONPATH; fi
export -f env_step bench  # `timeout` runs commands, not functions: the steps call them through bash -c
export OUT PY WHEELS COMMIT=${COMMIT:-unknown}
PYTEST="$PY -m pytest -q -p no:cacheprovider -x -n ${WORKERS:-8}"  # Triton compiles on 8 processes

step env 60 15 bash -c env_step
step partials 150 40 env DDL_INKERNEL_REDUCE=1 $PYTEST tests/ops/test_partials.py
protocol=$?
step probe 180 60 $PY benchmarks/tools/reduce_probe.py --out "$OUT/probe.json"
probe=$?
inkernel=1
if [ "$protocol" -ne 0 ] || [ "$probe" -ne 0 ]; then
  inkernel=0
  echo "=== the reduction protocol failed (partials rc $protocol, probe rc $probe): later steps with DDL_INKERNEL_REDUCE=0" \
    | tee -a "$OUT/steps.log"
fi
step newtests 150 40 env DDL_INKERNEL_REDUCE=$inkernel $PYTEST tests/ops/test_update_and_norm.py \
  tests/ops/test_kernels_token_read.py tests/ops/test_kernels_fused_model.py
step bench_on 150 70 env DDL_INKERNEL_REDUCE=$inkernel DDL_FUSE_NEXT_NORM=1 DDL_TC_ONE_PASS=1 bash -c \
  "bench '$OUT/bench_on.md'"
step bench_off 150 70 env DDL_INKERNEL_REDUCE=0 DDL_FUSE_NEXT_NORM=0 DDL_TC_ONE_PASS=0 bash -c \
  "bench '$OUT/bench_off.md'"
if [ -d "${BEFORE:-}/src" ] || [ "$DRY" = 1 ]; then
  step bench_before 150 70 bash -c "bench '$OUT/bench_before.md' '${BEFORE:-}/src:/tmp/site'"
else
  printf 'bench_before\t%s\t0\t-\tskipped (BEFORE not set)\n' "$(( $(date +%s) - T0 ))" >> "$OUT/timeline.tsv"
fi
step oldtests 150 40 env DDL_INKERNEL_REDUCE=$inkernel $PYTEST tests/ops/test_kernels.py \
  tests/ops/test_kernels_recompute.py tests/ops/test_kernel_partials.py tests/models/test_state_dtype.py \
  tests/ops/test_norm_gate_value.py tests/ops/test_custom_ops.py tests/ops/test_hyper_kernels.py \
  tests/ops/test_backend_routing.py tests/hf/test_static_decode.py
echo "=== done at $(( $(date +%s) - T0 ))s of $DEADLINE"
cat "$OUT/timeline.tsv"
exit 0
