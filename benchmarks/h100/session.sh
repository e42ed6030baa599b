#!/usr/bin/env bash
# One device-machine call: environment, the kernel tests on the real GPU, then the cost tables.
# Usage (on the GPU machine, repository root): bash benchmarks/h100/session.sh [steps...]
# Steps: env kernels bench compiled decode tests (default: all, in that order). compiled: `ddl bench --compile`
# at 32 x 1024 (each block compiled, as `ddl train --set compile=true`), every variant interleaved. decode: `ddl
# bench --compile` at the default 8 x 1024, for its decode column: the StaticDecoder's compiled step replayed as a
# CUDA graph, against `bench`'s eager decode with the dynamic cache at the same shape. recompute (not
# in the default): the eager bench with recompute_states=true (the state rebuild; a no-op for the baseline). Logs and tables go to $OUT (or ./gpu_out).
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
steps=${*:-env kernels bench compiled decode tests}
for s in $steps; do
  echo "=== $s ($(date +%T))"
  case $s in
    env) nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
         $PY -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" ;;
    tests) timeout 220 $PY -m pytest -q -p no:cacheprovider tests/ops/test_kernels.py tests/ops/test_kernels_fused_model.py \
             tests/ops/test_kernels_recompute.py tests/ops/test_kernels_token_read.py tests/ops/test_kernel_partials.py \
             tests/models/test_state_dtype.py tests/ops/test_norm_gate_value.py tests/ops/test_custom_ops.py \
             tests/ops/test_hyper_kernels.py tests/hf/test_static_decode.py 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    kernels) timeout 200 $PY -m deep_delta.cli.main bench-kernels --device cuda --dtype bfloat16 --preset small --seq 1024 \
             --out "$OUT/bench_kernels_small_bf16.md" 2>&1 | tee "$OUT/bench_kernels.log" | tail -40 ;;
    bench) timeout 180 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 \
             --out "$OUT/bench_small_bf16.md" 2>&1 | tee "$OUT/bench.log" | tail -30 ;;
    recompute) timeout 150 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 \
             --set model.recompute_states=true --repeats 3 --out "$OUT/bench_small_bf16_recompute.md" 2>&1 \
             | tee "$OUT/bench_recompute.log" | tail -12 ;;
    compiled) timeout 330 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 --compile \
             --batch-size 32 --repeats 3 --out "$OUT/bench_small_bf16_compiled_32x1024.md" 2>&1 \
             | tee "$OUT/bench_compiled.log" | tail -30 ;;
    decode) timeout 300 $PY -m deep_delta.cli.main bench --preset small --device cuda --dtype bfloat16 --compile \
             --steps 1 --repeats 3 --out "$OUT/bench_small_bf16_compiled_8x1024.md" 2>&1 \
             | tee "$OUT/bench_decode.log" | tail -30 ;;
  esac
done
