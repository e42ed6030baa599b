"""``ddl compare``: the main job. Train baseline and DDL variants on the same data and budget, compare them."""

from __future__ import annotations

import argparse

from deep_delta.cli import options

# The TrainConfig fields compare sets for each run itself (its --out is the comparison's directory); every other
# field has its flag, the default shown the recipe `compare`'s.
PER_RUN = ("variant", "out", "wandb_run_name")


def add_parser(sub) -> None:
    from deep_delta.experiments.settings import HeldOutSettings
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
        "the tiny preset on the embedded text, about ten minutes on 2 idle CPU cores (longer while other work "
        "keeps them busy). Finished runs in OUT with "
        "the same settings and data are reused and interrupted ones continued; a run made with any other setting "
        "that changes results (--eval-batches, --steps, --dtype, ...) or other data is refused unless --overwrite. "
        "With --wandb, every run is logged (one W&B group per comparison, unless --wandb-group names one) and so "
        "are the comparison table and curves.",
    )
    options.add_variants(p, DEFAULT_VARIANTS)
    p.add_argument("--out", default="runs/compare", metavar="DIR", help="output directory (default runs/compare)")
    options.add_lrs(p, "every variant", per_variant=True)
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
    p.add_argument("--break-even-check", dest="break_even_checks", nargs="+", default=None,
                   metavar="VARIANT=RATIO",
                   help="with --eval-seeds: check the break-even ratio r* against an exact run: VARIANT at its "
                   "chosen lr and the first evaluation seed, trained round(STEPS / RATIO) steps with its own schedule "
                   "(as --step-costs trains it) in OUT/break_even/r_RATIO/VARIANT; the report prints its final "
                   "validation loss minus the estimate of VARIANT's STEPS-step curve at that step (the truncated-"
                   "curve approximation's error); choose RATIO near the r* an earlier report printed. Refused before "
                   "anything trains: a RATIO below 1 or whose steps fall before the curve's first validation (no "
                   "estimate to check), and one whose whole steps cost STEPS off by more than 5%% (as --step-costs "
                   "refuses; the refusal names the nearest ratios that fit)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write OUT/scaling.md, scaling.json and scaling.png from the finished points "
                   "already in OUT (every d<W>_s<STEPS>/ of earlier --widths runs; with --widths / --lengths only "
                   "those), each point with its own seeds and lr grid, for a study run in parts; or, for an OUT "
                   "without such points, OUT/compare.md, compare.json and curves.png (and an lr grid's best-lr "
                   "report) from the finished run directories there, e.g. runs made on several machines and "
                   "brought together without their checkpoints (each run's device is recorded, and the report's "
                   "machine is the runs' own: their kernel switches, which must agree, threads and commit; each run is "
                   "what its own run.json says and must stand where `ddl compare` puts it, once). The points or runs "
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
    p.add_argument("--overwrite", action="store_true",
                   help="retrain every run already in OUT from step 0, the finished ones too (a study's every lr, "
                   "seed and evaluation run); to retrain one run alone, remove its directory (OUT/.../VARIANT) and "
                   "run the same command again: only the runs that are missing train")
    options.add_progress(p)
    options.add_settings(p.add_argument_group("evaluation seeds and the test split (with --lrs)"), HeldOutSettings)
    options.add_settings(p.add_argument_group("settings of every run (override the recipe compare or --config)"),
                         TrainConfig, skip=PER_RUN, defaults={**TrainConfig.defaults(), **compare()})
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from deep_delta.experiments.plan import build_plan, parse_step_costs
    from deep_delta.experiments.settings import HeldOutSettings
    from deep_delta.train.config import TrainConfig, load_config

    given = options.given_settings(args, options.setting_names(TrainConfig, PER_RUN))
    held_given = options.given_settings(args, options.setting_names(HeldOutSettings))
    held = HeldOutSettings(**held_given)
    if args.report_only:
        return _report_only(args, {**given, **held_given})
    lrs = options.lr_grid(args.lrs, given.get("lr"), args.assignments)
    # the recipe `compare` by default; checked as the first variant compared (each run's own is checked too), so that a
    # setting is refused naming a variant of the comparison
    first = {"variant": args.variants[0]} if args.variants else {}
    base = load_config(args.config or "compare", {**given, **first}, args.assignments)
    options.check_wandb_names([n for n in options.WANDB_NAMES if n in given], base.wandb, config=True)
    _check_points(args, given)
    plan = build_plan(base, options.variant_list(args.variants), seeds=options.seed_list(args.seeds, base.seed),
                      lrs=lrs, eval_seeds=held.eval_seeds, eval_seed_start=held.eval_seed_start,
                      test_tokens=held.test_tokens, step_costs=parse_step_costs(args.step_costs),
                      checks=parse_step_costs(args.break_even_checks, "break_even_checks"), widths=args.widths,
                      lengths=args.lengths, given=frozenset(held_given))
    options.apply_threads(args.threads)
    print(plan.describe(base, args.out, torch.get_num_threads()), flush=True)
    from deep_delta.experiments.lr_grid import gap_warning

    # a grid per variant (--lrs ... ddl-cc=...) warned about per variant, one grid for all once
    per_variant = isinstance(lrs, dict)
    for variant, grid in (plan.grids.items() if per_variant else [(None, plan.lrs)]) if plan.grids else []:
        warning = gap_warning(grid)
        if warning:
            print(f"ddl compare: {variant + chr(39) + 's grid: ' if variant else ''}{warning}", file=sys.stderr,
                  flush=True)
    from deep_delta.experiments.runner import run_plan

    summary = run_plan(plan, base, args.out, overwrite=args.overwrite, progress=not args.no_progress,
                       time_repeats=args.time_repeats)
    if plan.mode == "scaling":
        return _print_scaling(args.out, summary)
    return _print_report(args.out, summary)


def _check_points(args: argparse.Namespace, given: dict) -> None:
    """The width / length study sets each point's width and length: refused beside one width or length given."""
    keys = {a.partition("=")[0].strip() for a in args.assignments}
    if args.widths is not None and "model.hidden_size" in keys:
        raise ValueError("`widths` and `--set model.hidden_size=...` were both given; allowed: one of them")
    if args.lengths is not None and ("steps" in given or "steps" in keys):
        raise ValueError("`lengths` and one length (`steps`, or --set steps=...) were both given; allowed: one "
                         "of them")


def _print_report(out: str, summary: dict) -> int:
    """The report on the terminal (as compare.md has it), the runs that diverged on stderr, the files written;
    returns the exit code (1 when a run diverged)."""
    import sys

    from deep_delta.experiments.compare_report import runs_training_s, terminal_report, tokens_text

    rows = summary["rows"]
    print()
    trained = runs_training_s(summary)
    wall = (f"; the runs' training time {trained:.0f} s (their run.json)" if trained is not None else "") + (
        f"; wall time of this call {summary['wall_s']:.0f} s" if summary.get("wall_s") is not None else "")
    print(f"{tokens_text(summary)}; differences against {summary['reference']}{wall}")
    print(terminal_report(summary))
    failed = [r for r in rows if r.get("diverged")]
    for r in failed:
        print(f"ddl compare: {r['variant']} diverged: {r['diverged']}", file=sys.stderr)
    _say_written(out, summary)
    return 1 if failed else 0


COMPARE_FILES = ("compare.md", "compare.json", "curves.png", "lr_sensitivity.png", "selection.md", "selection.json",
                 "selection_curves.png")
SCALING_FILES = ("scaling.md", "scaling.json", "scaling.png")


def _say_written(out: str, summary: dict, names: tuple[str, ...] = COMPARE_FILES) -> None:
    """The report's files (of ``names``) that are there now, and its notes (step times not kept, figures not
    drawn)."""
    from pathlib import Path

    written = [f"{out}/{name}" for name in names if (Path(out) / name).is_file()
               and (name != "lr_sensitivity.png" or summary.get("lr_selection"))
               and (not name.startswith("selection") or summary.get("held_out"))]
    for note in summary.get("notes", []):
        print(f"note: {note}")
    print(f"\nwrote {', '.join(written)}")


def _print_scaling(out: str, summary: dict) -> int:
    from deep_delta.experiments.scaling import format_scaling

    print()
    print(format_scaling(summary))
    _say_written(out, summary, SCALING_FILES)
    return 1 if any(p["d_val_loss"] is None for p in summary["points"]) else 0


def _report_only(args: argparse.Namespace, given: dict) -> int:
    """``--report-only``: from what OUT holds, training nothing: the width / length study's summary from its
    finished points (``d<W>_s<N>/``), or else one comparison's (with an lr grid: each lr's and the best-lr one;
    with evaluation seeds, the selection's and the evaluation's) from its finished run directories; ``given``: the
    settings given on the command line, each of them an option that trains (refused)."""

    from deep_delta.experiments.plan import recorded_mode
    from deep_delta.experiments.scaling import collect_scaling
    from deep_delta.variants import DEFAULT_VARIANTS

    trains = {"--variants": args.variants != list(DEFAULT_VARIANTS), "--set": bool(args.assignments),
              "--time-repeats": args.time_repeats != 5, "--step-costs": args.step_costs is not None,
              "--lrs": args.lrs is not None, "--seeds": args.seeds is not None, "--config": args.config is not None,
              "--overwrite": args.overwrite, "--break-even-check": args.break_even_checks is not None}
    refused = [flag for flag, on in trains.items() if on] + ["--" + k.replace("_", "-") for k in given]
    if refused:
        raise ValueError(f"`report_only` trains nothing, but got {', '.join(refused)}; allowed with it: --out, "
                         "--widths and --lengths (which points to summarise), --threads, --no-progress")
    if args.widths is None and args.lengths is None and recorded_mode(args.out) != "scaling":
        from deep_delta.experiments.collect import collect_comparison

        return _print_report(args.out, collect_comparison(args.out))
    return _print_scaling(args.out, collect_scaling(args.out, widths=args.widths, lengths=args.lengths))
