# The machinery of a prepared device call, sourced by benchmarks/tools/first_call.sh and cost_call.sh: the checks
# of the call's environment before any step, a hard deadline, each step under its own timeout (or skipped when too
# little time is left), a dry run of stand-in steps, and results kept in a few files of OUT (a new one per call),
# with a non-zero exit when any of them could not be kept or any step did not pass.
#
# A call script sets NAME (its own name, for messages), may define call_checks (its own values' checks, each bad one
# reported with `_refuse MESSAGE`), and sources this file, which then:
#   - checks (each bad value one line on stderr, then exit 2, before any step): DEADLINE a whole number of seconds
#     (default 540) that fits the first step's minimum (env: 15 s; a dry run: 15 / DRY_SCALE, rounded up), DRY 0 or
#     1, DRY_SCALE a whole number >= 1 (default 60), DRY_SLEEP a number of seconds >= 0 (default 1), WORKERS a whole
#     number >= 1 (default 8), COMMIT set for a real run (a dry run records "dry"), OUT (default gpu_out) a new or
#     empty directory (a used one is refused: a call never writes into another call's results), created and
#     writable: its files are created here, before any step;
#   - defines `step`, `env_first`, `bench`, `env_step` and `call_end` (below).
#
# Exit status: 2 a bad value (nothing ran); 3 a result not kept (a file of OUT not written); 4 the environment step
# failed (no GPU, torch without CUDA, ...): the call stopped there, no other step ran; 5 a step failed, timed out or
# was skipped for want of time; 0 only when every step ran and passed and every result was kept. Each non-zero end
# says why in one line on stderr.
#
# Values are never pasted into a `bash -c` string: a step's command and its arguments are passed as arguments
# (`step NAME CAP MIN bash -c 'bench "$@"' bench ARG...` runs the exported function `bench` with ARG... as they are).

_refuse() { printf '%s: %s\n' "$NAME" "$1" >&2; _bad=1; }

_whole() { [[ $1 =~ ^[0-9]+$ ]]; }

# _seconds VALUE: a whole number as bash reads it in base 10 (no octal for a leading 0), at most 999999999
_seconds() {
  local digits=${1#"${1%%[!0]*}"}
  [ -z "$digits" ] && digits=0
  if [ "${#digits}" -gt 9 ]; then echo 999999999; else echo $(( 10#$digits )); fi
}

_bad=0
OUT=${OUT:-gpu_out}
DEADLINE=${DEADLINE:-540}
DRY=${DRY:-0}
DRY_SCALE=${DRY_SCALE:-60}
DRY_SLEEP=${DRY_SLEEP:-1}
WORKERS=${WORKERS:-8}
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
ENV_CAP=60 ENV_MIN=15  # the first step of every call (env_first): its cap and minimum, in seconds
_whole "$DEADLINE" || _refuse "DEADLINE must be a whole number of seconds >= 0, got '$DEADLINE'"
[ "$DRY" = 0 ] || [ "$DRY" = 1 ] || _refuse "DRY must be 0 or 1, got '$DRY'"
{ _whole "$DRY_SCALE" && [ "$(_seconds "$DRY_SCALE")" -ge 1 ]; } \
  || _refuse "DRY_SCALE must be a whole number >= 1 (caps and minimums are divided by it), got '$DRY_SCALE'"
# a DEADLINE below the first step's minimum skips every step: refused, since nothing would run
if [ "$_bad" = 0 ]; then
  _first_min=$ENV_MIN _scaled=""
  if [ "$DRY" = 1 ]; then
    _first_min=$(( (ENV_MIN + $(_seconds "$DRY_SCALE") - 1) / $(_seconds "$DRY_SCALE") ))
    _scaled=" in a dry run at DRY_SCALE $DRY_SCALE"
  fi
  if [ "$(_seconds "$DEADLINE")" -lt "$_first_min" ]; then
    _refuse "DEADLINE $DEADLINE s cannot fit the first step (env needs at least $_first_min s$_scaled), so nothing \
would run; allowed: DEADLINE >= $_first_min"
  fi
fi
[[ $DRY_SLEEP =~ ^[0-9]+(\.[0-9]+)?$ ]] || _refuse "DRY_SLEEP must be a number of seconds >= 0, got '$DRY_SLEEP'"
{ _whole "$WORKERS" && [ "$(_seconds "$WORKERS")" -ge 1 ]; } \
  || _refuse "WORKERS must be a whole number >= 1 (pytest processes), got '$WORKERS'"
if [ "$DRY" = 1 ]; then
  COMMIT=${COMMIT:-dry}
elif [ -z "${COMMIT:-}" ]; then
  _refuse "COMMIT must name the commit this tree is (the device copy has no .git): COMMIT=\$(git rev-parse HEAD)"
fi
# a call script's own values: it may define call_checks, which calls _refuse for each bad one
if declare -F call_checks >/dev/null; then call_checks; fi
read -r -a _py <<< "$PY"
if [ "$DRY" != 1 ] && ! command -v "${_py[0]:-}" >/dev/null 2>&1; then
  _refuse "PY must name a Python interpreter, got '$PY'"
fi
# a used OUT is refused: this call's timeline, log and tests would overwrite the earlier call's, its bench.md and
# samples.jsonl would hold both calls' tables under one timeline
if [ -d "$OUT" ] && [ -n "$(ls -A -- "$OUT" 2>/dev/null)" ]; then
  _refuse "OUT '$OUT' is not empty (another call's results, which this call would overwrite or mix with its own); \
allowed: a new or empty directory, one per call"
fi
[ "$_bad" = 0 ] || exit 2
DEADLINE=$(_seconds "$DEADLINE"); DRY_SCALE=$(_seconds "$DRY_SCALE"); WORKERS=$(_seconds "$WORKERS")
if ! mkdir -p -- "$OUT" 2>/dev/null || [ ! -d "$OUT" ]; then
  _refuse "OUT: cannot create the directory '$OUT'"; exit 2
fi
for _f in timeline.tsv steps.log tests.txt; do
  if ! : 2>/dev/null > "$OUT/$_f"; then _refuse "OUT: cannot write '$OUT/$_f'"; exit 2; fi
done
printf 'step\tstart_s\tseconds\trc\tstatus\n' > "$OUT/timeline.tsv" || { _refuse "OUT: cannot write '$OUT/timeline.tsv'"; exit 2; }

MARGIN=5  # seconds kept back from a step's budget for its kill and the writing after it (1 in a dry run)
[ "$DRY" = 1 ] && MARGIN=1
LOST=""  # the results that could not be kept, for call_end
FAILED=""  # the steps that failed or timed out, for call_end
SKIPPED=""  # the steps skipped for want of time, for call_end
STEP_OUTCOME=""  # the last step's: ok, failed, timed out or skipped
STEP_LAST=""  # the last line the last step printed
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)

_lost() { case ",$LOST," in *",$1,"*) ;; *) LOST=${LOST:+$LOST,}$1 ;; esac; }

# note TEXT: print it and add it to steps.log
note() {
  printf '%s\n' "$*"
  printf '%s\n' "$*" >> "$OUT/steps.log" || _lost steps.log
}

# row FIELDS...: one line of timeline.tsv
row() {
  local IFS=$'\t'
  printf '%s\n' "$*" >> "$OUT/timeline.tsv" || _lost timeline.tsv
}

left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }

_size() { if [ -f "$1" ]; then wc -c < "$1"; else echo -1; fi; }

# [KEEPS="FILE ..."] step NAME CAP MIN COMMAND...: run COMMAND under the step's timeout, or skip it; record it in
# the timeline; return COMMAND's exit code (0 when skipped: STEP_OUTCOME says which). KEEPS: the files of OUT the
# step writes or adds to; a step that exits 0 without adding to each of them has lost its results (call_end then
# exits non-zero). A step that fails, times out or is skipped makes call_end exit non-zero. In a dry run the
# command is a stand-in: it sleeps DRY_SLEEP s and adds a line to each kept file (the step named DRY_HANG sleeps
# past its cap, the one named DRY_FAIL exits 3, the one named DRY_LOSE keeps nothing).
step() {
  local name=$1 cap=$2 min=$3; shift 3
  if [ "$DRY" = 1 ]; then cap=$(( (cap + DRY_SCALE - 1) / DRY_SCALE )); min=$(( (min + DRY_SCALE - 1) / DRY_SCALE )); fi
  local start=$(( $(date +%s) - T0 )) remaining; remaining=$(left)
  STEP_LAST=""
  if [ "$remaining" -lt "$min" ]; then
    row "$name" "$start" 0 - "skipped (${remaining}s left, needs $min)"
    note "=== $name: skipped ($remaining s left, needs $min)"
    STEP_OUTCOME=skipped; SKIPPED=${SKIPPED:+$SKIPPED, }$name
    return 0
  fi
  local budget=$(( remaining - MARGIN < cap ? remaining - MARGIN : cap )); [ "$budget" -lt 1 ] && budget=1
  note "=== $name (at ${start}s, up to ${budget}s)"
  local keeps=() f sizes=()
  read -r -a keeps <<< "${KEEPS:-}"
  for f in "${keeps[@]}"; do sizes+=("$(_size "$OUT/$f")"); done
  if [ "$DRY" = 1 ]; then
    if [ "$name" = "${DRY_HANG:-}" ]; then set -- sleep $(( budget + 30 ))
    elif [ "$name" = "${DRY_FAIL:-}" ]; then set -- bash -c 'echo stand-in failure; exit 3'
    elif [ "$name" = "${DRY_LOSE:-}" ]; then set -- sleep "$DRY_SLEEP"
    else
      local paths=()
      for f in "${keeps[@]}"; do paths+=("$OUT/$f"); done
      set -- bash -c 'sleep "$1"; shift; for f in "$@"; do echo "dry stand-in" >> "$f" || exit 1; done' \
        stand-in "$DRY_SLEEP" "${paths[@]}"
    fi
  fi
  local log; log=$(mktemp) || { log=/dev/null; _lost "the log of $name"; }
  timeout -k 5 "$budget" "$@" > "$log" 2>&1
  local rc=$? took=$(( $(date +%s) - T0 - start )) status=ok i
  [ "$rc" -ne 0 ] && status=failed
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="timed out"
  if [ "$rc" -eq 0 ]; then
    for i in "${!keeps[@]}"; do
      if [ "$(_size "$OUT/${keeps[$i]}")" -le "${sizes[$i]}" ]; then
        _lost "${keeps[$i]}"; status="ok, but ${keeps[$i]} not written"
      fi
    done
  fi
  tail -n 300 "$log" >> "$OUT/steps.log" || _lost steps.log
  tail -n 3 "$log" | sed "s/^/[$name] /"
  STEP_LAST=$(tail -n 1 "$log")
  { grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$log" || true; } | sed "s/^/[$name] /" >> "$OUT/tests.txt" \
    || _lost tests.txt
  [ "$log" != /dev/null ] && rm -f "$log"
  row "$name" "$start" "$took" "$rc" "$status"
  note "=== $name: $status (rc $rc, ${took}s)"
  STEP_OUTCOME=$status
  if [ "$rc" -ne 0 ]; then FAILED=${FAILED:+$FAILED, }"$name $status (rc $rc)"; fi
  return "$rc"
}

# said RC: a step's result as the call's notes say it: "skipped" (the last step was), or "rc RC"
said() { if [ "$STEP_OUTCOME" = skipped ]; then echo skipped; else echo "rc $1"; fi; }

# env_first: the first step of every call, env (env_step: the wheels, the device, the versions); when it fails,
# times out or is skipped the call ends here: the reason in one line on stderr, exit 4, no other step run (a dry
# run's stand-in passes, as on a GPU, unless DRY_FAIL or DRY_HANG names env)
env_first() {
  KEEPS=env.txt step env "$ENV_CAP" "$ENV_MIN" bash -c env_step
  local rc=$? why
  case $STEP_OUTCOME in ok*) return 0 ;; esac
  case $STEP_OUTCOME in
    skipped) why="skipped for want of time" ;;
    "timed out") why="timed out at its cap (the wheels' install, nvidia-smi or torch hung)" ;;
    *) why=${STEP_LAST#env failed: }; [ -n "$why" ] || why="rc $rc, no output" ;;
  esac
  note "=== stopped: the environment step failed ($why); no other step runs"
  cat "$OUT/timeline.tsv" 2>/dev/null
  printf '%s: the environment step failed, so no other step ran: %s (env.txt and steps.log in %s)\n' \
    "$NAME" "$why" "$OUT" >&2
  exit 4
}

# env_step: the commit and date, the GPU (nvidia-smi), the wheels (WHEELS, installed into /tmp/site), then the
# versions, the device and the switches, into env.txt. It fails at the first thing missing, its last line
# "env failed: WHY": no nvidia-smi or a failing one, wheels that do not install, a torch that does not import, is
# built without CUDA or sees no GPU, a Triton / transformers / library that does not import.
env_step() {
  {
    echo "commit: $COMMIT"
    echo "date: $(date -u +%FT%TZ)"
  } > "$OUT/env.txt" 2>&1 || { echo "env failed: cannot write $OUT/env.txt"; return 1; }
  _env() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then echo "env failed: no GPU: nvidia-smi is not on PATH"; return 1; fi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ]; then echo "env failed: no GPU: nvidia-smi failed (rc $rc)"; return 1; fi
    if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl 2>&1
      rc=$?
      if [ "$rc" -ne 0 ]; then echo "env failed: the wheels in $WHEELS did not install (pip rc $rc)"; return 1; fi
    fi
    $PY - 2>&1 <<'PY'
import sys


def fail(why):
    print("env failed:", why)
    sys.exit(1)


def first_line(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


try:
    import torch
except Exception as e:
    fail(f"torch does not import ({first_line(e)})")
if torch.version.cuda is None:
    fail(f"no GPU: torch {torch.__version__} is built without CUDA")
if not torch.cuda.is_available():
    fail(f"no GPU: torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda})")
try:
    import transformers
    import triton

    from deep_delta.ops import switches
except Exception as e:
    fail(f"an import failed ({first_line(e)})")
p = torch.cuda.get_device_properties(0)
print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)
print("device", p.name, "SMs", p.multi_processor_count, "memory GiB", round(p.total_memory / 2**30, 1))
print("switches at start", switches.current())
PY
  }
  _env >> "$OUT/env.txt" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ] && ! tail -n 1 "$OUT/env.txt" | grep -q '^env failed: '; then
    echo "env failed: the environment check exited $rc (env.txt)" >> "$OUT/env.txt"
  fi
  cat "$OUT/env.txt"
  return $rc
}

# bench TITLE PYTHONPATH ARGS...: `ddl bench ARGS...` of the library on PYTHONPATH; its table added to OUT/bench.md
# under "## TITLE", and its samples to OUT/samples.jsonl as one line {"title", "switches" (the DDL_* environment),
# "bench"} (one file each however many benches: the device returns few files)
bench() {
  local title=$1 path=$2; shift 2
  local work; work=$(mktemp -d) || return 1
  if ! PYTHONPATH=$path $PY -m deep_delta.cli.main bench "$@" --out "$work/bench.md"; then rm -rf "$work"; return 1; fi
  { printf '\n## %s\n\n' "$title" && cat "$work/bench.md"; } >> "$OUT/bench.md" || { rm -rf "$work"; return 1; }
  $PY - "$title" "$work/bench.json" >> "$OUT/samples.jsonl" <<'PY' || { rm -rf "$work"; return 1; }
import json, os, sys
switches = {k: v for k, v in sorted(os.environ.items()) if k.startswith("DDL_")}
print(json.dumps({"title": sys.argv[1], "switches": switches, "bench": json.load(open(sys.argv[2]))}))
PY
  rm -rf "$work"
}

note "=== $NAME at commit $COMMIT, deadline $DEADLINE s$([ "$DRY" = 1 ] && echo ", a dry run")"
if [ "$DRY" != 1 ] && [ -d "$WHEELS" ]; then export PYTHONPATH=/tmp/site:$PYTHONPATH; fi
export -f env_step bench  # `timeout` runs commands, not functions: the steps call them through `bash -c`
export OUT PY WHEELS COMMIT
PYTEST=("${_py[@]}" -m pytest -q -p no:cacheprovider -x -n "$WORKERS")  # Triton compiles on several processes

# call_end: the timeline; exit 0 when every step ran and passed and every result was kept; else one line on stderr
# for each of: the results not kept (exit 3), the steps that failed, timed out or were skipped (exit 5)
call_end() {
  note "=== done at $(( $(date +%s) - T0 ))s of $DEADLINE"
  cat "$OUT/timeline.tsv" 2>/dev/null || _lost timeline.tsv
  local rc=0
  if [ -n "$LOST" ]; then
    printf '%s: results not kept in %s: %s\n' "$NAME" "$OUT" "$LOST" >&2
    rc=3
  fi
  if [ -n "$FAILED$SKIPPED" ]; then
    local what=${FAILED:+failed: $FAILED}
    [ -n "$SKIPPED" ] && what=${what:+$what; }"skipped for want of time: $SKIPPED"
    printf '%s: not every step passed (%s); timeline.tsv in %s says what ran\n' "$NAME" "$what" "$OUT" >&2
    [ "$rc" = 0 ] && rc=5
  fi
  exit "$rc"
}
