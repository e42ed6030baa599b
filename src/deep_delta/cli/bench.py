"""``ddl bench``: the cost table (parameters, train/prefill/decode tokens/s, peak memory) of the variants."""

from __future__ import annotations

import argparse
import sys

from deep_delta.cli import options


def add_parser(sub) -> None:
    from deep_delta.eval.settings import BenchSettings

    p = sub.add_parser(
        "bench",
        help="cost table: parameters, throughput and peak memory per variant",
        description="Build every variant in one process and measure them interleaved (round-robin over "
        "repeats, median): parameters, train tokens/s (the trainer's own step: forward + backward, gradient "
        "clipping at 1.0, AdamW), inference tokens/s "
        "(prefill; decode with the cache) and peak training memory, each with its factor over the baseline. "
        "Prints a markdown table and writes it to --out (samples beside it as JSON).",
    )
    options.add_settings(p, BenchSettings)
    # 1 thread: steady on a shared machine, where several OpenMP threads spin against other jobs
    options.add_threads(p, default="1")
    options.add_set(p, help=options.SET_HELP + "; model.FIELD applies to every variant, other keys are bench "
                    "settings (e.g. seed=1)")
    p.add_argument("--out", default="bench.md", metavar="FILE", help="markdown file to write (default bench.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from deep_delta.eval.bench import bench_table, run_bench, write_bench
    from deep_delta.eval.settings import BenchSettings, with_assignments
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results

    settings = BenchSettings(**options.given_settings(args, options.setting_names(BenchSettings)))
    settings = with_assignments(settings, args.assignments).resolved()
    refuse_replaced_dir(args.out)
    refuse_unwritable_results([Path(args.out), Path(args.out).with_suffix(".json")])
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
