#!/usr/bin/env bash
# One device-machine call: environment, the kernel tests on the real GPU, then the cost tables.
# Usage (on the GPU machine, repository root): bash benchmarks/tools/session.sh [steps...]
# Steps: env tune kernels bench compiled decode tests (default: all, in that order; about 7 minutes on an H200).
# tune: tune_kernels.py, the delta kernels over their launch parameters (the library's choice first; 45 s).
# compiled: `ddl bench --compile` at 32 x 1024 (each block compiled, as `ddl train --set compile=true`), every
# variant interleaved, no decode column (60 s on an H200). decode: decode_probe.py, eager decode with the dynamic
# cache against the StaticDecoder's compiled step replayed as a CUDA graph, 8 sequences after a 992-token prefill,
# with the two paths' logits compared (100 s). recompute (not in the default): the eager bench with
# recompute_states=true (the state rebuild; a no-op for the baseline). before (not in the default; needs
# BEFORE=DIR, a directory holding an older checkout's src/, e.g. `git archive <commit> src | tar -x -C DIR`):
# that library's own launch choices timed by this checkout's tune_kernels.py (--no-sweep) and its compiled bench,
# in this call, so that a before/after is measured on one machine. eager / before_eager (not in the default): the
# eager bench at 8 x 1024 without decode, this checkout's / BEFORE's (run them back to back: the eager step is
# host-bound and its baseline moves between processes). authors (not in the default; needs third_party/ carried,
# see authors_bench.py): the authors' published model code beside ours, eager and compiled, one table. profile
# (not in the default): profile_step.py, the trainer's step per variant with torch.profiler (kernel time, launches,
# syncs), to set beside `ddl bench-kernels --launches`' CPU count. graphs (not in the default): the bench at 8 x 1024
# with --compile --cuda-graphs blocks (the step replayed as CUDA graphs; docs/training.md). memory (not in the
# default): memory_snapshot.py, the compiled step's memory history of baseline / ddl-dv1 / ddl-cc at 32 x 1024 and
# what is live at its peak, by source line. compiled_recompute (not in the default): the compiled bench at 32 x 1024
# with recompute_states=true (the state rebuild under compiled blocks). Logs and tables go to $OUT (or ./gpu_out).
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
steps=${*:-env tune kernels bench compiled decode tests}
for s in $steps; do
  echo "=== $s ($(date +%T))"
  case $s in
    env) nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
         $PY -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" ;;
    tests) timeout 220 $PY -m pytest -q -p no:cacheprovider tests/ops/test_kernels.py tests/ops/test_kernels_fused_model.py \
             tests/ops/test_kernels_recompute.py tests/ops/test_kernels_token_read.py tests/ops/test_kernel_partials.py \
             tests/models/test_state_dtype.py tests/ops/test_norm_gate_value.py tests/ops/test_update_and_norm.py tests/ops/test_custom_ops.py \
             tests/ops/test_hyper_kernels.py tests/ops/test_backend_routing.py tests/hf/test_static_decode.py 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    tune) mkdir -p "$OUT/tune"; timeout 150 $PY benchmarks/tools/tune_kernels.py --out "$OUT/tune" 2>&1 \
             | tee "$OUT/tune.log" | grep '^###' ;;
    kernels) timeout 200 $PY -m deep_delta.cli.main bench-kernels --device cuda --dtype bfloat16 --preset small --seq 1024 \
             --out "$OUT/bench_kernels_small_bf16.md" 2>&1 | tee "$OUT/bench_kernels.log" | tail -40 ;;
    bench) timeout 180 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 \
             --out "$OUT/bench_small_bf16.md" 2>&1 | tee "$OUT/bench.log" | tail -30 ;;
    recompute) timeout 150 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 \
             --set model.recompute_states=true --repeats 3 --out "$OUT/bench_small_bf16_recompute.md" 2>&1 \
             | tee "$OUT/bench_recompute.log" | tail -12 ;;
    compiled) timeout 330 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 --compile \
             --batch-size 32 --repeats 3 --decode-tokens 0 --out "$OUT/bench_small_bf16_compiled_32x1024.md" 2>&1 \
             | tee "$OUT/bench_compiled.log" | tail -30 ;;
    before) [ -d "${BEFORE:-}/src" ] || { echo "before: set BEFORE to a directory with an older src/"; continue; }
            mkdir -p "$OUT/before/tune"
            PYTHONPATH=$BEFORE/src timeout 120 $PY benchmarks/tools/tune_kernels.py --no-sweep --out "$OUT/before/tune" \
              2>&1 | tee "$OUT/before/tune.log" | grep '^###'
            PYTHONPATH=$BEFORE/src timeout 330 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 \
              --compile --batch-size 32 --repeats 3 --decode-tokens 0 \
              --out "$OUT/before/bench_small_bf16_compiled_32x1024.md" 2>&1 | tee "$OUT/before/bench_compiled.log" | tail -12 ;;
    eager) timeout 150 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 --repeats 3 \
             --decode-tokens 0 --out "$OUT/bench_small_bf16_eager.md" 2>&1 | tee "$OUT/bench_eager.log" | tail -12 ;;
    before_eager) [ -d "${BEFORE:-}/src" ] || { echo "before_eager: set BEFORE to a directory with an older src/"; continue; }
            mkdir -p "$OUT/before"
            PYTHONPATH=$BEFORE/src timeout 150 $PY -m deep_delta.cli.main bench --preset small --device cuda \
              --dtype bfloat16 --repeats 3 --decode-tokens 0 --out "$OUT/before/bench_small_bf16_eager.md" 2>&1 \
              | tee "$OUT/before/bench_eager.log" | tail -12 ;;
    decode) timeout 200 $PY benchmarks/tools/decode_probe.py --out "$OUT" 2>&1 | tee "$OUT/decode.log" | tail -12 ;;
    authors) $PY -m pip install -q --no-index --find-links third_party/wheels pydantic transformers==5.24.0 2>&1 | tail -2
             timeout 330 $PY benchmarks/tools/authors_bench.py --authors third_party/ddl-authors/model \
               --commit "$(git rev-parse HEAD 2>/dev/null || echo "${COMMIT:-unknown}")" \
               --out "$OUT/authors_small_bf16.md" 2>&1 | tee "$OUT/authors.log" | tail -20 ;;
    graphs) timeout 200 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 --compile \
             --cuda-graphs blocks --repeats 3 --decode-tokens 0 --out "$OUT/bench_small_bf16_graphs_8x1024.md" 2>&1 \
             | tee "$OUT/bench_graphs.log" | tail -12 ;;
    memory) timeout 300 $PY benchmarks/tools/memory_snapshot.py --out "$OUT/memory" 2>&1 | tee "$OUT/memory.log" \
             | tail -30 ;;
    compiled_recompute) timeout 300 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 \
             --compile --batch-size 32 --repeats 3 --decode-tokens 0 --set model.recompute_states=true \
             --out "$OUT/bench_small_bf16_compiled_recompute_32x1024.md" 2>&1 | tee "$OUT/bench_compiled_recompute.log" \
             | tail -12 ;;
    profile) timeout 200 $PY benchmarks/tools/profile_step.py --out "$OUT/profile" --batch 8 --seq 1024 2>&1 \
               | tee "$OUT/profile.log" | tail -12 ;;
  esac
done
