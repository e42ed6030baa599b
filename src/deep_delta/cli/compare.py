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

    from deep_delta.experiments.settings import HeldOutSettings
    from deep_delta.train.config import TrainConfig, load_config

    given = options.given_settings(args, options.setting_names(TrainConfig, PER_RUN))
    held_given = options.given_settings(args, options.setting_names(HeldOutSettings))
    held = HeldOutSettings(**held_given)
    if args.report_only:
        return _report_only(args, {**given, **held_given}, held)
    lrs = options.lr_grid(args.lrs, given.get("lr"), args.assignments)
    # the recipe `compare` by default; checked as the first variant compared (each run's own is checked too), so that a
    # setting is refused naming a variant of the comparison
    first = {"variant": args.variants[0]} if args.variants else {}
    base = load_config(args.config or "compare", {**given, **first}, args.assignments)
    options.check_wandb_names([n for n in options.WANDB_NAMES if n in given], base.wandb, config=True)
    variants = options.variant_list(args.variants)
    if isinstance(lrs, dict):  # each variant's own grid
        from deep_delta.experiments.lr_grid import variant_grids

        lrs = variant_grids(lrs, variants)
        if args.widths is not None or args.lengths is not None:
            raise ValueError("`lrs` with a grid per variant and `widths` / `lengths`: the width / length study "
                             "takes one grid for every variant; allowed: plain lrs (--lrs 1e-3 2e-3 4e-3)")
    options.apply_threads(args.threads)
    seeds = options.seed_list(args.seeds, base.seed)
    step_costs = parse_step_costs(args.step_costs)
    if step_costs:  # refused before the banner announces them
        from deep_delta.experiments.compare import check_step_costs

        check_step_costs(step_costs, variants, args.lengths or [base.steps],
                         "lengths" if args.lengths else "steps")
    checks = parse_step_costs(args.break_even_checks, "break_even_checks")
    _check_held_out(args, held, lrs, checks, given=set(held_given))
    print(_banner(args, base, variants, seeds, lrs, step_costs, held, torch.get_num_threads()), flush=True)
    if lrs is not None:
        from deep_delta.experiments.lr_grid import gap_warning

        for variant, grid in (lrs.items() if isinstance(lrs, dict) else [(None, lrs)]):
            warning = gap_warning(grid)
            if warning:
                print(f"ddl compare: {variant + chr(39) + 's grid: ' if variant else ''}{warning}", file=sys.stderr,
                      flush=True)
    if args.widths is not None or args.lengths is not None:
        return _run_scaling(args, given, base, variants, seeds, lrs, step_costs)
    kw = dict(seeds=seeds, overwrite=args.overwrite, progress=not args.no_progress, time_repeats=args.time_repeats,
              step_costs=step_costs)
    if held.eval_seeds is not None:
        from deep_delta.experiments.held_out import run_held_out

        summary = run_held_out(base, variants, args.out, lrs, eval_seeds=held.eval_seeds,
                               eval_seed_start=held.eval_seed_start, test_tokens=held.test_tokens,
                               break_even_checks=checks, **kw)
    elif lrs is None:
        from deep_delta.experiments.compare import run_compare

        summary = run_compare(base, variants, args.out, **kw)
    else:
        from deep_delta.experiments.compare import run_lr_grid

        summary = run_lr_grid(base, variants, args.out, lrs, **kw)
    return _print_report(args.out, summary)


def _check_held_out(args: argparse.Namespace, held, lrs, checks: dict[str, float],
                    given: set[str] = frozenset()) -> None:
    """The evaluation seeds go with an lr grid (they report its choice), not with the width / length study; their
    first seed (``given``: the HeldOutSettings fields given) and the break-even checks with the evaluation seeds."""
    if "eval_seed_start" in given and held.eval_seeds is None:
        raise ValueError("`eval_seed_start` got a value without `eval_seeds`; allowed: with `eval_seeds` (the first "
                         "of the evaluation seeds; without them no evaluation seed is trained)")
    if held.eval_seeds is not None and lrs is None:
        raise ValueError("`eval_seeds` reports fresh seeds at each variant's chosen lr, but no lr grid was given; "
                         "allowed: with `lrs` (e.g. --lrs 1e-3 2e-3 4e-3)")
    if held.eval_seeds is not None and (args.widths is not None or args.lengths is not None):
        raise ValueError("`eval_seeds` with `widths` / `lengths`: the width / length study reports its selection "
                         "runs; allowed: `eval_seeds` with one comparison (its `lrs`)")
    if checks and held.eval_seeds is None:
        raise ValueError("`break_even_checks` checks r* at the first evaluation seed; allowed: with `eval_seeds`")


def _banner(args, base, variants: list[str], seeds: list[int], lrs, step_costs: dict[str, float], held,
            threads: int) -> str:
    """The line ``ddl compare`` starts with: what it trains, where, and how the lr is chosen and reported."""
    if isinstance(lrs, dict):
        grid = " each at every lr of its own grid (" + "; ".join(
            f"{v} {' '.join(f'{x:g}' for x in g)}" for v, g in lrs.items()) + ")"
    else:
        grid = f" at every lr of {' '.join(f'{x:g}' for x in lrs)}" if lrs else ""
    if step_costs:
        grid += "; equal cost: " + ", ".join(f"{v}'s step {c:g}x the baseline's" for v, c in step_costs.items())
    steps = "/".join(map(str, args.lengths)) if args.lengths else str(base.steps)
    widths = f", widths {' '.join(map(str, args.widths))}" if args.widths else ""
    seeds_text = f"paired seeds {', '.join(map(str, seeds))}"
    if held.eval_seeds is not None:
        last = held.eval_seed_start + held.eval_seeds - 1
        seeds_text = (f"lr chosen on val at the selection seeds {', '.join(map(str, seeds))}, reported on test at the "
                      f"evaluation seeds {held.eval_seed_start}..{last}")
    elif lrs:
        seeds_text += " (lr chosen and reported on the same seeds and validation sample)"
    return (f"ddl compare: {', '.join(variants)} at preset {base.preset}{widths}, {steps} steps x "
            f"{base.batch_size} x {base.seq_len} tokens each{grid}, {seeds_text}; {threads} CPU thread(s); runs in "
            f"{args.out}")


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


def parse_step_costs(items: list[str] | None, name: str = "step_costs") -> dict[str, float]:
    """``--step-costs VARIANT=RATIO ...`` (or ``--break-even-check``: ``name``) as {variant: ratio}; a malformed
    item is an error naming it."""
    costs = {}
    for item in items or []:
        variant, sep, ratio = item.partition("=")
        try:
            value = float(ratio) if sep and variant else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"`{name}` got {item!r}; allowed: VARIANT=RATIO, e.g. ddl-cc=1.22")
        if variant in costs:
            raise ValueError(f"`{name}` names {variant!r} twice; allowed: each variant once")
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


def _report_only(args: argparse.Namespace, given: dict, held) -> int:
    """``--report-only``: from what OUT holds, training nothing: the width / length study's summary from its
    finished points (``d<W>_s<N>/``), or else one comparison's (with an lr grid: each lr's and the best-lr one;
    with evaluation seeds, the selection's and the evaluation's) from its finished run directories; ``given``: the
    settings given on the command line, each of them an option that trains (refused)."""

    from deep_delta.experiments.scaling import collect_scaling, format_scaling, has_points
    from deep_delta.variants import DEFAULT_VARIANTS

    trains = {"--variants": args.variants != list(DEFAULT_VARIANTS), "--set": bool(args.assignments),
              "--time-repeats": args.time_repeats != 5, "--step-costs": args.step_costs is not None,
              "--lrs": args.lrs is not None, "--seeds": args.seeds is not None, "--config": args.config is not None,
              "--overwrite": args.overwrite, "--break-even-check": args.break_even_checks is not None}
    refused = [flag for flag, on in trains.items() if on] + ["--" + k.replace("_", "-") for k in given]
    if refused:
        raise ValueError(f"`report_only` trains nothing, but got {', '.join(refused)}; allowed with it: --out, "
                         "--widths and --lengths (which points to summarise), --threads, --no-progress")
    if args.widths is None and args.lengths is None and not has_points(args.out):
        from deep_delta.experiments.collect import collect_comparison

        return _print_report(args.out, collect_comparison(args.out))
    summary = collect_scaling(args.out, widths=args.widths, lengths=args.lengths)
    print(format_scaling(summary))
    _say_written(args.out, summary, SCALING_FILES)
    return 1 if any(p["d_val_loss"] is None for p in summary["points"]) else 0
