"""``ddl bench``: the cost table (parameters, train/prefill/decode tokens/s, peak memory) of the variants."""

from __future__ import annotations

import argparse
import sys

from deep_delta.cli import options


def add_parser(sub) -> None:
    from deep_delta.eval.settings import BENCH_DTYPE_NAMES, DEFAULT_SHAPES
    from deep_delta.variants import DEFAULT_VARIANTS, PRESETS

    shapes = ", ".join(f"{p} {b}x{t}" for p, (b, t) in DEFAULT_SHAPES.items())
    p = sub.add_parser(
        "bench",
        help="cost table: parameters, throughput and peak memory per variant",
        description="Build every variant in one process and measure them interleaved (round-robin over "
        "repeats, median): parameters, train tokens/s (the trainer's own step: forward + backward, gradient "
        "clipping at 1.0, AdamW), inference tokens/s "
        "(prefill; decode with the cache) and peak training memory, each with its factor over the baseline. "
        "Prints a markdown table and writes it to --out (samples beside it as JSON).",
    )
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model size (default tiny)")
    options.add_variants(p, DEFAULT_VARIANTS)
    options.add_device(p)
    options.add_dtype(p, weights=False, default="float32", choices=BENCH_DTYPE_NAMES)
    options.add_batch(p, f"sequences per batch (default: {shapes})", "tokens per sequence (default: see "
                      "--batch-size, at most the model's context)")
    p.add_argument("--steps", type=options.integer, default=2, metavar="N", help="timed train steps per repeat (default 2)")
    p.add_argument("--repeats", type=options.integer, default=5, metavar="R",
                   help="interleaved repeats; the median is reported (default 5)")
    p.add_argument("--warmup", type=options.integer, default=1, metavar="W", help="untimed warm-up rounds per variant (default 1)")
    p.add_argument("--decode-tokens", type=options.integer, default=32, metavar="N",
                   help="decode steps timed per repeat; 0: no decode column (default 32)")
    p.add_argument("--compile", action="store_true",
                   help="compile each block for the training step, as `ddl train --set compile=true`, and "
                   "decode with the fixed-shape cache and one compiled step (CUDA graphs on CUDA; "
                   "deep_delta.hf.StaticDecoder); prefill stays eager")
    # 1 thread: steady on a shared machine, where several OpenMP threads spin against other jobs
    options.add_threads(p, default="1")
    options.add_set(p, help=options.SET_HELP + "; model.FIELD applies to every variant, other keys are bench "
                    "settings (e.g. seed=1)")
    p.add_argument("--out", default="bench.md", metavar="FILE", help="markdown file to write (default bench.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from deep_delta.eval.bench import bench_table, run_bench, write_bench
    from deep_delta.eval.settings import BenchSettings, with_assignments

    settings = BenchSettings(
        preset=args.preset,
        variants=options.variant_list(args.variants),
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        steps=args.steps,
        repeats=args.repeats,
        warmup=args.warmup,
        decode_tokens=args.decode_tokens,
        compile=args.compile,
    )
    settings = with_assignments(settings, args.assignments).resolved()
    import torch

    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        options.apply_threads(args.threads)
        rows = run_bench(settings, progress=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
        print(bench_table(rows, settings))  # the header names the thread count used
        out = write_bench(args.out, rows, settings)
    finally:
        torch.set_num_threads(threads)  # in-process callers keep their setting
    print(f"\nwrote {out} and {out.with_suffix('.json')} ({time.perf_counter() - t0:.0f} s)")
    return 0
