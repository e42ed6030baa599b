#!/usr/bin/env bash
# The first 124M evidence (issue 26, item 5) in one command, on a GPU machine with no internet:
#   1. a corpus from the machine's own files: every UTF-8 .py / .md / .rst / .txt file under the Python
#      installation's site-packages and standard library, one document per file, as corpus.jsonl (capped at
#      CORPUS_MB), then `ddl data prepare` with the byte tokenizer (the GPT-2 BPE needs a download) or, when
#      DDL_GPT2_BPE names a local vocab.bpe / .tiktoken file, with GPT-2 BPE;
#   2. `ddl compare` at the small preset (123.6M parameters: the preset's 50,304-token vocabulary is kept for
#      the byte tokenizer too, which uses 257 of its rows),
#      compiled blocks, bf16 autocast, the same tokens in the same order for every variant, one seed:
#      validation curves, final losses, tokens/s and the equal-time columns in $OUT/compare/compare.md.
# Usage (repository root, on the GPU machine; one device call must fit in 10 minutes, so the defaults are
# sized for about 8: STEPS x BATCH x SEQ tokens per variant, four variants):
#   OUT=$OUT bash benchmarks/tools/evidence_124m.sh
#   VARIANTS="baseline ddl-cc" STEPS=400 bash benchmarks/tools/evidence_124m.sh     # fewer, longer
#   SEEDS="1 2" bash benchmarks/tools/evidence_124m.sh                                # more paired seeds
#   LRS="5e-4 1e-3 2e-3 4e-3" VARIANTS="baseline ddl-cc" bash benchmarks/tools/evidence_124m.sh
#       # each variant at its own best lr of a grid (chosen on validation loss; `ddl compare --lrs`), with the
#       # loss-against-lr plot; replaces LR, and multiplies the runs by the grid's size
# A dry run of the whole pipeline on CPU (minutes): DEVICE=cpu PRESET=tiny STEPS=4 BATCH=2 SEQ=64 CORPUS_MB=2 \
#   COMPILE=false bash benchmarks/tools/evidence_124m.sh
# A study in parts (one run per device call, issue 43): each call's $OUT/runs holds its runs without checkpoints;
# copy every call's runs into one folder with the comparison's layout (VARIANT/ or seed_S/VARIANT/, inside
# lr_<lr>/ for a grid) and run `ddl compare --out THAT_FOLDER --report-only`.
set -euo pipefail
OUT=${OUT:-gpu_out}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
PRESET=${PRESET:-small}
VARIANTS=${VARIANTS:-baseline ddl-cc ddl-tc ddl-dv1}
STEPS=${STEPS:-250}
BATCH=${BATCH:-32}
SEQ=${SEQ:-1024}
LR=${LR:-1e-3}
LRS=${LRS:-}
SEEDS=${SEEDS:-1}  # `ddl compare --seeds`: one value is a count (1: seed 0), two or more a list
SEED=${SEED:-}     # one seed alone (e.g. 1, for a study of one run per call): `--seed SEED` instead of --seeds
DEVICE=${DEVICE:-cuda}
COMPILE=${COMPILE:-true}
CORPUS_MB=${CORPUS_MB:-600}
EXTRA=${EXTRA:-}  # more `ddl compare` options, e.g. EXTRA="--step-costs ddl-cc=1.22 ddl-tc=1.45" (equal cost)
WORK=${WORK:-/tmp/ddl_evidence}
# Every number is checked before any work: bash's arithmetic below would read a word as a variable (STEPS=abc is 0)
# and `ddl compare` would get what it did not ask for.
bad() { echo "evidence_124m.sh: $1 got '$2'; allowed: $3" >&2; exit 2; }
INT='^[1-9][0-9]*$'; NUM='^([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'
for name in STEPS BATCH SEQ; do [[ ${!name} =~ $INT ]] || bad "$name" "${!name}" "an integer >= 1"; done
for name in LR CORPUS_MB; do
  [[ ${!name} =~ $NUM && ! ${!name} =~ ^[0.]*([eE].*)?$ ]] || bad "$name" "${!name}" "a number > 0, e.g. 1e-3"
done
for x in $LRS; do [[ $x =~ $NUM && ! $x =~ ^[0.]*([eE].*)?$ ]] || bad LRS "$LRS" "numbers > 0, e.g. 5e-4 1e-3"; done
for x in $SEEDS; do [[ $x =~ ^[0-9]+$ ]] || bad SEEDS "$SEEDS" "integers >= 0 (one: a count; several: a list)"; done
[[ -z $SEEDS ]] && bad SEEDS "" "integers >= 0"
[[ -z $SEED || $SEED =~ ^[0-9]+$ ]] || bad SEED "$SEED" "an integer >= 0, or empty"
mkdir -p "$OUT" "$WORK"

echo "=== corpus ($(date +%T))"
$PY - "$WORK/corpus.jsonl" "$CORPUS_MB" <<'EOF'
import json, os, sys, sysconfig
out, cap = sys.argv[1], int(float(sys.argv[2]) * 2**20)
roots = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")})
n_files = n_bytes = 0
with open(out, "w", encoding="utf-8") as f:
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith((".py", ".md", ".rst", ".txt")):
                    continue
                try:
                    with open(os.path.join(dirpath, name), "rb") as g:
                        text = g.read().decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip():
                    continue
                f.write(json.dumps({"text": text}) + "\n")
                n_files, n_bytes = n_files + 1, n_bytes + len(text.encode("utf-8"))
                if n_bytes >= cap:
                    break
            if n_bytes >= cap:
                break
        if n_bytes >= cap:
            break
print(f"{n_files} files, {n_bytes / 2**20:.1f} MiB of UTF-8 text from {', '.join(roots)}")
EOF
TOK=byte; BPE=()
if [ -n "${DDL_GPT2_BPE:-}" ]; then TOK=gpt2; BPE=(--bpe-file "$DDL_GPT2_BPE"); fi
$PY -m deep_delta.cli.main data prepare --source "$WORK/corpus.jsonl" --tokenizer $TOK "${BPE[@]}" \
  --out "$WORK/data" --overwrite --no-progress 2>&1 | tail -5
cp "$WORK/data/meta.json" "$OUT/data_meta.json"

if [ -n "$LRS" ]; then LR_ARGS=(--lrs $LRS); LR_SAID="each variant at its best of lrs $LRS"
else LR_ARGS=(--lr "$LR"); LR_SAID="lr $LR"; fi
echo "=== compare ($(date +%T)): $VARIANTS, seeds ${SEED:-$SEEDS}, $STEPS steps of $BATCH x $SEQ tokens, $LR_SAID, compile $COMPILE"
# shellcheck disable=SC2086
$PY -m deep_delta.cli.main compare --preset "$PRESET" --variants $VARIANTS --data "$WORK/data" \
  --steps "$STEPS" $([ -n "$SEED" ] && echo "--seed $SEED" || echo "--seeds $SEEDS") --batch-size "$BATCH" --seq-len "$SEQ" "${LR_ARGS[@]}" --warmup-steps $((STEPS / 10 + 1)) \
  --eval-every $((STEPS / 5 > 0 ? STEPS / 5 : 1)) --eval-batches 20 --device "$DEVICE" --set compile=$COMPILE \
  --time-repeats 3 --out "$WORK/compare" --no-progress $EXTRA 2>&1 | tee "$OUT/compare.log" | tail -40
for f in compare.md compare.json curves.png lr_sensitivity.png; do cp "$WORK/compare/$f" "$OUT/" 2>/dev/null || true; done
# The runs themselves, small (run.json with the device and the run's end, metrics.jsonl; no checkpoint): runs made
# in several device calls are brought together on any machine with `ddl compare --out DIR --report-only`
# (the settings and the data must agree; each run's device is recorded).
(cd "$WORK/compare" && find . -name run.json -o -name metrics.jsonl | tar -cf - -T -) | (mkdir -p "$OUT/runs" && tar -xf - -C "$OUT/runs")
$PY "$(dirname "$0")/pack_records.py" "$OUT/runs" || true   # metrics.jsonl.gz, as studies/ keeps them (studies/README.md)
echo "=== done ($(date +%T)); tables in $OUT, the runs (without checkpoints) in $OUT/runs"
