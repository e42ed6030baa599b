"""``ddl bench``: the cost table (parameters, train/prefill/decode tokens/s, peak memory) of the variants."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    from deep_delta.eval.bench import DEFAULT_SHAPES, DEFAULT_VARIANTS
    from deep_delta.eval.timing import BENCH_DTYPES, DTYPE_HELP

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
    p.add_argument("--preset", default="tiny", help="model size: tiny | small | medium (default tiny)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated variants (default {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--dtype", default="float32", choices=list(BENCH_DTYPES),
                   help=f"{DTYPE_HELP} (default float32)")
    p.add_argument("--batch-size", type=int, default=None, metavar="B", help=f"sequences per batch (default: {shapes})")
    p.add_argument("--seq-len", type=int, default=None, metavar="T", help="tokens per sequence (default: see --batch-size)")
    p.add_argument("--steps", type=int, default=2, metavar="N", help="timed train steps per repeat (default 2)")
    p.add_argument("--repeats", type=int, default=5, metavar="R", help="interleaved repeats; the median is reported (default 5)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch CPU threads for a CPU run (default 1: steady on a shared machine, where several "
                   "OpenMP threads spin against other jobs; 0 = torch's own choice)")
    p.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed warm-up rounds per variant (default 1)")
    p.add_argument("--decode-tokens", type=int, default=32, metavar="N", help="decode steps timed per repeat (default 32)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set a DDLConfig field for every variant, e.g. --override hidden_size=64 (repeatable)")
    p.add_argument("--out", default="bench.md", metavar="FILE", help="markdown file to write (default bench.md)")
    p.set_defaults(func=run)


def parse_overrides(items: list[str]) -> dict:
    """["hidden_size=64", "delta_backend=torch"] -> {"hidden_size": 64, "delta_backend": "torch"} (JSON values
    where they parse, strings otherwise); unknown fields are refused by DDLConfig."""
    import json

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--override: got {item!r}; allowed: KEY=VALUE, e.g. hidden_size=64")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    import time

    from deep_delta.eval.bench import BenchSettings, bench_table, run_bench, write_bench

    settings = BenchSettings(
        preset=args.preset,
        variants=[v.strip() for v in args.variants.split(",") if v.strip()],
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        steps=args.steps,
        repeats=args.repeats,
        warmup=args.warmup,
        decode_tokens=args.decode_tokens,
        overrides=parse_overrides(args.override),
    ).resolved()
    if args.threads < 0:
        raise ValueError(f"--threads: got {args.threads}; allowed: an integer >= 1, or 0 for torch's choice")
    import torch

    threads = torch.get_num_threads()
    if args.threads > 0 and settings.device == "cpu":
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    try:
        rows = run_bench(settings, progress=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
        print(bench_table(rows, settings))  # the header names the thread count used
        out = write_bench(args.out, rows, settings)
    finally:
        torch.set_num_threads(threads)  # in-process callers keep their setting
    print(f"\nwrote {out} and {out.with_suffix('.json')} ({time.perf_counter() - t0:.0f} s)")
    return 0
