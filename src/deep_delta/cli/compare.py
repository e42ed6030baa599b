"""``ddl compare``: the main job. Train baseline and DDL variants on the same data and budget, compare them."""

from __future__ import annotations

import argparse

from deep_delta.cli import options

# The TrainConfig fields compare sets for each run itself (its --out is the comparison's directory); every other
# field has its flag, the default shown the recipe `compare`'s.
PER_RUN = ("variant", "out", "wandb_run_name")


def add_parser(sub) -> None:
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.recipes import compare
    from deep_delta.variants import DEFAULT_VARIANTS

    p = sub.add_parser(
        "compare",
        help="train several variants with the same seed, data and budget and compare them (the main job)",
        description="Train each VARIANT with the same seed, data and token budget (one run directory per "
        "variant under OUT), then print a Table-3-style comparison (parameters, final validation loss, "
        "perplexity, training tokens/s, differences to the baseline) and write OUT/compare.md, "
        "OUT/compare.json and OUT/curves.png. With no arguments: baseline, ddl-dv1, ddl-tc and ddl-cc at "
        "the tiny preset on the embedded text, about ten minutes on 2 CPU cores. Finished runs in OUT with "
        "the same settings and data are reused and interrupted ones continued; a run made with any other setting "
        "that changes results (--eval-batches, --steps, --dtype, ...) or other data is refused unless --overwrite. "
        "With --wandb, every run is logged (one W&B group per comparison, unless --wandb-group names one) and so "
        "are the comparison table and curves.",
    )
    options.add_variants(p, DEFAULT_VARIANTS)
    p.add_argument("--out", default="runs/compare", metavar="DIR", help="output directory (default runs/compare)")
    options.add_lrs(p, "every variant")
    options.add_seeds(p, "several paired seeds: a list (--seeds 0 1 2), or one number N for seeds 0..N-1 "
                      "(--seeds 3); every variant trains with every seed, and the table shows mean +- sd, the paired "
                      "difference to the baseline with its 95%% t-interval, and the seeds in which it was lower "
                      "(default: the one --seed)")
    p.add_argument("--widths", type=options.integer, nargs="+", default=None, metavar="W",
                   help="the width / length study: run the whole comparison at each model width (hidden size; "
                   "the preset's layers and heads stay) in OUT/d<W>_s<STEPS>/ and write OUT/scaling.md, "
                   "scaling.json and scaling.png (the difference to the baseline against width and compute, with "
                   "95%% t-intervals); with --lrs each variant is at its own best lr at every point (default: the "
                   "preset's width)")
    p.add_argument("--lengths", type=options.integer, nargs="+", default=None, metavar="STEPS",
                   help="training lengths (optimizer steps) of the width / length study (default: the one "
                   "--steps)")
    p.add_argument("--step-costs", nargs="+", default=None, metavar="VARIANT=RATIO",
                   help="an equal-cost comparison: VARIANT's step costs RATIO x the baseline's (its step time over "
                   "the baseline's, e.g. from `ddl bench` on the machine the comparison stands for), so it trains "
                   "round(STEPS / RATIO) steps with its own warm-up and cosine schedule, where STEPS is the "
                   "baseline's (--steps, or each of --lengths); e.g. --step-costs ddl-cc=1.22 ddl-tc=1.45")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write OUT/scaling.md, scaling.json and scaling.png from the finished points "
                   "already in OUT (every d<W>_s<STEPS>/ of earlier --widths runs; with --widths / --lengths only "
                   "those), each point with its own seeds and lr grid, for a study run in parts; or, for an OUT "
                   "without such points, OUT/compare.md, compare.json and curves.png (and an lr grid's best-lr "
                   "report) from the finished run directories there, e.g. runs made on several machines and "
                   "brought together without their checkpoints (each run's device is recorded; each run is what its "
                   "own run.json says and must stand where `ddl compare` puts it, once). The points or runs "
                   "must share every setting but width, length, variant, lr, steps and seeds, and the data. "
                   "Refused with the options that train")
    p.add_argument("--time-repeats", type=options.integer, default=5, metavar="R",
                   help="interleaved rounds timing each variant's step after training, for the equal-wall-clock "
                   "columns (0: skip; default 5)")
    options.add_threads(p)
    p.add_argument("--config", metavar="FILE|NAME",
                   help="start from this YAML file or recipe (small/baseline) instead of the recipe compare, "
                   "whose values the (default ...) of the settings below show (their flags still apply)")
    options.add_set(p)
    p.add_argument("--overwrite", action="store_true", help="retrain runs already in OUT")
    options.add_progress(p)
    options.add_settings(p.add_argument_group("settings of every run (override the recipe compare or --config)"),
                         TrainConfig, skip=PER_RUN, defaults={**TrainConfig.defaults(), **compare()})
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from deep_delta.experiments.compare import run_compare, run_lr_grid
    from deep_delta.experiments.compare_report import comparison_table, verdicts
    from deep_delta.train.config import TrainConfig, load_config

    given = options.given_settings(args, options.setting_names(TrainConfig, PER_RUN))
    if args.report_only:
        return _report_only(args, given)
    lrs = options.lr_grid(args.lrs, given.get("lr"), args.assignments)
    base = load_config(args.config or "compare", given, args.assignments)  # the recipe `compare` by default
    options.check_wandb_names([n for n in options.WANDB_NAMES if n in given], base.wandb, config=True)
    variants = options.variant_list(args.variants)
    options.apply_threads(args.threads)
    seeds = options.seed_list(args.seeds, base.seed)
    step_costs = parse_step_costs(args.step_costs)
    grid = f" at every lr of {' '.join(f'{x:g}' for x in lrs)}" if lrs else ""
    if step_costs:
        grid += "; equal cost: " + ", ".join(f"{v}'s step {c:g}x the baseline's" for v, c in step_costs.items())
    steps = "/".join(map(str, args.lengths)) if args.lengths else str(base.steps)
    widths = f", widths {' '.join(map(str, args.widths))}" if args.widths else ""
    print(f"ddl compare: {', '.join(variants)} at preset {base.preset}{widths}, {steps} steps x "
          f"{base.batch_size} x {base.seq_len} tokens each{grid}, paired seeds {', '.join(map(str, seeds))}; "
          f"{torch.get_num_threads()} CPU thread(s); runs in {args.out}", flush=True)
    if lrs is not None:
        from deep_delta.experiments.lr_grid import gap_warning

        warning = gap_warning(lrs)
        if warning:
            print(f"ddl compare: {warning}", file=sys.stderr, flush=True)
    if args.widths is not None or args.lengths is not None:
        return _run_scaling(args, given, base, variants, seeds, lrs, step_costs)
    if lrs is None:
        summary = run_compare(base, variants, args.out, seeds=seeds, overwrite=args.overwrite,
                              progress=not args.no_progress, time_repeats=args.time_repeats, step_costs=step_costs)
    else:
        summary = run_lr_grid(base, variants, args.out, lrs, seeds=seeds, overwrite=args.overwrite,
                              progress=not args.no_progress, time_repeats=args.time_repeats, step_costs=step_costs)
    rows = summary["rows"]
    print()
    tokens = max(r["tokens"] for r in rows)
    each = (" per variant" if not step_costs else f" for {summary['reference']} (" + ", ".join(
        f"{r['variant']} {r['tokens']:,}" for r in rows if r["variant"] in step_costs) + ")")
    print(f"{tokens:,} training tokens{each}; differences against {summary['reference']}; "
          f"wall time {summary['wall_s']:.0f} s")
    if lrs is not None:
        from deep_delta.experiments.lr_grid import grid_table

        print("final validation loss at every lr (bold: each variant's chosen lr, on validation loss)")
        print(grid_table(summary["lr_selection"]["chosen"], lrs, lambda x: format(x, ".4f")) + "\n")
    print(comparison_table(summary))
    print("\n".join(verdicts(summary)))
    failed = [r for r in rows if r.get("diverged")]
    for r in failed:
        print(f"ddl compare: {r['variant']} diverged: {r['diverged']}", file=sys.stderr)
    _say_written(args.out, summary)
    return 1 if failed else 0


COMPARE_FILES = ("compare.md", "compare.json", "curves.png", "lr_sensitivity.png")
SCALING_FILES = ("scaling.md", "scaling.json", "scaling.png")


def _say_written(out: str, summary: dict, names: tuple[str, ...] = COMPARE_FILES) -> None:
    """The report's files (of ``names``) that are there now, and its notes (step times not kept, figures not
    drawn)."""
    from pathlib import Path

    written = [f"{out}/{name}" for name in names if (Path(out) / name).is_file()
               and (name != "lr_sensitivity.png" or summary.get("lr_selection"))]
    for note in summary.get("notes", []):
        print(f"note: {note}")
    print(f"\nwrote {', '.join(written)}")


def parse_step_costs(items: list[str] | None) -> dict[str, float]:
    """``--step-costs VARIANT=RATIO ...`` as {variant: ratio}; a malformed item is an error naming it."""
    costs = {}
    for item in items or []:
        variant, sep, ratio = item.partition("=")
        try:
            value = float(ratio) if sep and variant else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"`step_costs` got {item!r}; allowed: VARIANT=RATIO, e.g. ddl-cc=1.22")
        if variant in costs:
            raise ValueError(f"`step_costs` names {variant!r} twice; allowed: each variant once")
        costs[variant] = value
    return costs


def _run_scaling(args: argparse.Namespace, given: dict, base, variants: list[str], seeds: list[int], lrs,
                 step_costs: dict[str, float]) -> int:
    """``--widths`` / ``--lengths``: the comparison at every (width, length), then the study's summary."""
    from deep_delta.experiments.scaling import format_scaling, run_scaling
    from deep_delta.models.ddl.configuration_ddl import PRESETS

    keys = {a.partition("=")[0].strip() for a in args.assignments}
    if args.widths is not None and "model.hidden_size" in keys:
        raise ValueError("`widths` and `--set model.hidden_size=...` were both given; allowed: one of them")
    if args.lengths is not None and ("steps" in given or "steps" in keys):
        raise ValueError("`lengths` and one length (`steps`, or --set steps=...) were both given; allowed: one "
                         "of them")
    widths = args.widths or [base.model.get("hidden_size", PRESETS[base.preset]["hidden_size"])]
    summary = run_scaling(base, variants, args.out, widths=widths, lengths=args.lengths or [base.steps], lrs=lrs,
                          seeds=seeds, overwrite=args.overwrite, progress=not args.no_progress,
                          time_repeats=args.time_repeats, step_costs=step_costs)
    print()
    print(format_scaling(summary))
    _say_written(args.out, summary, SCALING_FILES)
    return 1 if any(p["d_val_loss"] is None for p in summary["points"]) else 0


def _report_only(args: argparse.Namespace, given: dict) -> int:
    """``--report-only``: from what OUT holds, training nothing: the width / length study's summary from its
    finished points (``d<W>_s<N>/``), or else one comparison's (with an lr grid: each lr's and the best-lr one)
    from its finished run directories; ``given``: the settings given on the command line, each of them an option
    that trains (refused)."""
    from pathlib import Path

    from deep_delta.experiments.scaling import collect_scaling, format_scaling
    from deep_delta.variants import DEFAULT_VARIANTS

    trains = {"--variants": args.variants != list(DEFAULT_VARIANTS), "--set": bool(args.assignments),
              "--time-repeats": args.time_repeats != 5, "--step-costs": args.step_costs is not None,
              "--lrs": args.lrs is not None, "--seeds": args.seeds is not None, "--config": args.config is not None,
              "--overwrite": args.overwrite}
    refused = [flag for flag, on in trains.items() if on] + ["--" + k.replace("_", "-") for k in given]
    if refused:
        raise ValueError(f"`report_only` trains nothing, but got {', '.join(refused)}; allowed with it: --out, "
                         "--widths and --lengths (which points to summarise), --threads, --no-progress")
    if args.widths is None and args.lengths is None and not any(Path(args.out).glob("d*_s*")):
        return _report_comparison(args.out)
    summary = collect_scaling(args.out, widths=args.widths, lengths=args.lengths)
    print(format_scaling(summary))
    _say_written(args.out, summary, SCALING_FILES)
    return 1 if any(p["d_val_loss"] is None for p in summary["points"]) else 0


def _report_comparison(out: str) -> int:
    """``--report-only`` on a comparison's OUT: its report from the finished runs there."""
    from deep_delta.experiments.compare import collect_comparison
    from deep_delta.experiments.compare_report import comparison_table, verdicts

    summary = collect_comparison(out)
    print(comparison_table(summary))
    print("\n".join(verdicts(summary)))
    _say_written(out, summary)
    return 1 if any(r.get("diverged") for r in summary["rows"]) else 0
