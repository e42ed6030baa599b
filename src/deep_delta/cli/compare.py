"""``ddl compare``: the main job. Train baseline and DDL variants on the same data and budget, compare them."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from deep_delta.models.ddl.configuration_ddl import PRESETS, VARIANTS
    from deep_delta.train.compare import COMPARE_DEFAULTS, DEFAULT_VARIANTS

    d = COMPARE_DEFAULTS
    p = sub.add_parser(
        "compare",
        help="train several variants with the same seed, data and budget and compare them (the main job)",
        description="Train each VARIANT with the same seed, data and token budget (one run directory per "
        "variant under OUT), then print a Table-3-style comparison (parameters, final validation loss, "
        "perplexity, training tokens/s, differences to the baseline) and write OUT/compare.md, "
        "OUT/compare.json and OUT/curves.png. With no arguments: baseline, ddl-dv1, ddl-tc and ddl-cc at "
        "the tiny preset on the embedded text, about ten minutes on 2 CPU cores. Finished runs in OUT with "
        "the same settings are reused and interrupted ones continued; other settings need --overwrite.",
    )
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS),
                   metavar="VARIANT", help=f"variants to train, in table order (default: {' '.join(DEFAULT_VARIANTS)})")
    p.add_argument("--preset", default=None, choices=list(PRESETS), help=f"(default {d['preset']}) model size")
    p.add_argument("--out", default="runs/compare", help="output directory (default runs/compare)")
    p.add_argument("--data", default=None, help="prepared data directory (default: the embedded text)")
    p.add_argument("--steps", type=int, default=None, help=f"(default {d['steps']}) optimizer steps per variant")
    p.add_argument("--batch-size", type=int, default=None, help=f"(default {d['batch_size']}) sequences per step")
    p.add_argument("--seq-len", type=int, default=None, help=f"(default {d['seq_len']}) tokens per sequence")
    p.add_argument("--lr", type=float, default=None, help=f"(default {d['lr']}) peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=None, help=f"(default {d['warmup_steps']}) warm-up steps")
    p.add_argument("--eval-every", type=int, default=None, help=f"(default {d['eval_every']}) validate every N steps")
    p.add_argument("--eval-batches", type=int, default=None, help=f"(default {d['eval_batches']}) validation batches")
    p.add_argument("--seed", type=int, default=None, help=f"(default {d['seed']}) seed of initialisation and data order")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"], help="(default auto) device")
    p.add_argument("--threads", default="auto", metavar="N|auto",
                   help="CPU threads for PyTorch (default auto: the cores not already busy, at least 1)")
    p.add_argument("--config", metavar="FILE|NAME",
                   help="start from this YAML config instead of the compare defaults (flags above still apply)")
    p.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                   help="any other training setting, e.g. --set model.hidden_size=64 (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="retrain runs already in OUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from deep_delta.cli.main import UsageError
    from deep_delta.data import DataUnavailableError
    from deep_delta.train.compare import COMPARE_DEFAULTS, format_table, run_compare
    from deep_delta.train.config import load_config
    from deep_delta.train.distributed import cpu_threads

    flags = ("preset", "data", "steps", "batch_size", "seq_len", "lr", "warmup_steps", "eval_every",
             "eval_batches", "seed", "device")
    given = {k: getattr(args, k) for k in flags if getattr(args, k) is not None}
    settings = given if args.config else {**COMPARE_DEFAULTS, **given}
    base = load_config(args.config, settings, args.assignments)
    threads = cpu_threads(args.threads)
    if threads is not None:
        torch.set_num_threads(threads)
    print(f"ddl compare: {', '.join(args.variants)} at preset {base.preset}, {base.steps} steps x "
          f"{base.batch_size} x {base.seq_len} tokens each, same seed ({base.seed}) and data; "
          f"{torch.get_num_threads()} CPU thread(s); runs in {args.out}", flush=True)
    try:
        summary = run_compare(base, args.variants, args.out, overwrite=args.overwrite,
                              progress=not args.no_progress)
    except (FileExistsError, DataUnavailableError) as e:
        raise UsageError(str(e)) from e
    rows = summary["rows"]
    print()
    tokens = max(r["tokens"] for r in rows)
    print(f"{tokens:,} training tokens per variant; differences against {summary['reference']}; "
          f"wall time {summary['wall_s']:.0f} s")
    print(format_table(summary))
    failed = [r for r in rows if r.get("diverged")]
    for r in failed:
        print(f"ddl compare: {r['variant']} diverged: {r['diverged']}", file=sys.stderr)
    print(f"\nwrote {args.out}/compare.md, {args.out}/compare.json, {args.out}/curves.png")
    return 1 if failed else 0
