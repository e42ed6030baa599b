"""``ddl bench-kernels``: time the DDL ops and whole training steps, as ratios, in one run.

Arguments only; the measuring is :mod:`deep_delta.eval.kernel_bench` (tables, op cases, steps) with the
timer and interleaving of :mod:`deep_delta.eval.timing`, shared with ``ddl bench``.
"""

from __future__ import annotations

import argparse
import sys


class _DeprecatedAlias(argparse.Action):
    """A hidden old spelling of a flag: stores into the new flag's dest and says so on stderr."""

    def __init__(self, option_strings, dest, replacement: str, **kwargs):
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"ddl bench-kernels: {option_string} is deprecated; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_parser(sub) -> None:
    from deep_delta.cli.options import add_batch, add_threads
    from deep_delta.eval.kernel_bench import DEFAULT_VARIANTS
    from deep_delta.eval.timing import BENCH_DTYPES, DTYPE_HELP

    default_variants = ",".join(DEFAULT_VARIANTS)
    p = sub.add_parser(
        "bench-kernels",
        help="time DDL kernels vs the PyTorch reference and each variant's training step vs the baseline",
        description="Times each DDL op (delta update, CC/TC read, EC expansion; forward+backward) for the "
        "plain reference, the lean PyTorch path, torch.compile of the reference and the Triton kernel, and "
        "the training step of each variant against the baseline (the trainer's own step: forward+backward, "
        "gradient clipping at 1.0, AdamW), with saved-activation bytes and peak training memory. Cases are "
        "interleaved round-robin (the first case rotating each round); each figure is the median over "
        "--repeats rounds. --dtype bfloat16 is autocast over fp32 weights, as in training and `ddl bench`.",
    )
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N (default: cpu)")
    p.add_argument("--dtype", default="float32", choices=list(BENCH_DTYPES), help=f"{DTYPE_HELP} (default: float32)")
    p.add_argument("--preset", default="tiny", help="model preset: tiny | small | medium (default: tiny)")
    add_batch(p, "sequences per step (default: 4)", "tokens per sequence (default: 256)", batch_default=4,
              seq_default=256)
    # the old spellings, kept working (hidden)
    p.add_argument("--batch", dest="batch_size", type=int, action=_DeprecatedAlias, replacement="--batch-size",
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--seq", dest="seq_len", type=int, action=_DeprecatedAlias, replacement="--seq-len",
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--variants", default=default_variants, help=f"comma list (default: {default_variants})")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default: 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default: 2)")
    add_threads(p, default=None)  # set for this run only
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="also time torch.compile of the reference ops (default: on CUDA only)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--skip-ops", action="store_true", help="only the training-step table")
    p.add_argument("--skip-steps", action="store_true", help="only the op table")
    p.add_argument("--out", default=None, help="also write the tables as markdown to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deep_delta.cli.options import apply_threads
    from deep_delta.eval.kernel_bench import KernelBenchSettings, kernel_bench_report

    settings = KernelBenchSettings(
        preset=args.preset,
        variants=[v.strip() for v in args.variants.split(",") if v.strip()],
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        repeats=args.repeats,
        warmup=args.warmup,
        compile=args.compile,
        ops=not args.skip_ops,
        steps=not args.skip_steps,
    ).resolved()
    import torch

    threads = torch.get_num_threads()
    try:
        apply_threads(args.threads)
        text = kernel_bench_report(settings, progress=lambda m: print(f"[bench-kernels] {m}", file=sys.stderr,
                                                                      flush=True))
    finally:
        torch.set_num_threads(threads)  # in-process callers keep their setting
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0
