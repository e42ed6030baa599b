"""``ddl bench-kernels``: time the DDL ops and whole training steps, as ratios, in one run.

Arguments only; the measuring is :mod:`deep_delta.eval.kernel_bench` (tables, op cases, steps) with the
timer and interleaving of :mod:`deep_delta.eval.timing`, shared with ``ddl bench``.
"""

from __future__ import annotations

import argparse
import sys

from deep_delta.cli import options


def add_parser(sub) -> None:
    from deep_delta.eval.settings import KernelBenchSettings

    p = sub.add_parser(
        "bench-kernels",
        help="time DDL and HC / mHC kernels vs the PyTorch reference and each variant's training step vs the "
        "baseline",
        description="Times each DDL op (delta update, CC/TC read, EC expansion) and the HC / mHC stream ops "
        "(write, read, Sinkhorn-Knopp), forward+backward, for the plain reference, the lean PyTorch path, "
        "torch.compile of the reference and the Triton kernel (CUDA only), and "
        "the training step of each variant against the baseline (the trainer's own step: forward+backward, "
        "gradient clipping at 1.0, AdamW), with saved-activation bytes and peak training memory. Cases are "
        "interleaved round-robin (the first case rotating each round); each figure is the median over "
        "--repeats rounds. --dtype bfloat16 is autocast over fp32 weights, as in training and `ddl bench`.",
    )
    options.add_settings(p, KernelBenchSettings)
    options.add_threads(p, default=None)  # set for this run only
    counts = p.add_mutually_exclusive_group()
    counts.add_argument("--traffic", action="store_true",
                        help="instead of timing: the bytes each DDL kernel reads and writes per token in one training "
                        "step of each DDL variant (from the launch arguments; no GPU needed), next to the ideal "
                        "2S+4d forward and 3S+6d backward per sublayer")
    counts.add_argument("--launches", action="store_true",
                        help="instead of timing: the kernel launches of one training step (forward + backward) of "
                        "each variant on the GPU's eager path, counted on CPU (Triton launches + ATen compute ops; no "
                        "GPU needed): per step, per sublayer and per sublayer against the baseline")
    options.add_set(p, help=options.SET_HELP + "; model.FIELD applies to the step table's models, other keys are "
                    "bench settings (e.g. seed=1)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the tables as markdown to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deep_delta.eval.kernel_bench import kernel_bench_report
    from deep_delta.eval.settings import KernelBenchSettings, with_assignments

    settings = KernelBenchSettings(**options.given_settings(args, options.setting_names(KernelBenchSettings)))
    settings = with_assignments(settings, args.assignments).resolved()
    if args.out:
        from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results

        refuse_replaced_dir(args.out)
        refuse_unwritable_results([Path(args.out)])
    import torch

    if args.traffic or args.launches:
        from deep_delta.eval.launches import check_counted_step

        check_counted_step(settings, "traffic" if args.traffic else "launches")  # before any model is built
        if args.traffic:
            from deep_delta.eval.traffic import traffic_report as report
        else:
            from deep_delta.eval.launches import launches_report as report
        text = report(settings)
        print(text)
        if args.out:
            Path(args.out).write_text(text)
        return 0

    threads = torch.get_num_threads()
    try:
        options.apply_threads(args.threads)
        text = kernel_bench_report(settings, progress=lambda m: print(f"[bench-kernels] {m}", file=sys.stderr,
                                                                      flush=True))
    finally:
        torch.set_num_threads(threads)  # in-process callers keep their setting
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0
