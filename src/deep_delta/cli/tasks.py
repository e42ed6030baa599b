"""``ddl tasks``: mechanism tasks (docs/tasks.md). ``list`` shows them; ``run`` trains variants x paired seeds on
one task and writes its accuracy-by-difficulty table, JSON and plot."""

from __future__ import annotations

import argparse

from deep_delta.cli import options

DEFAULT_TASK_VARIANTS = ("baseline", "ddl-dv1", "ddl-cc")


def add_parser(sub) -> None:
    from deep_delta.experiments.settings import TaskSettings
    from deep_delta.tasks import TASKS
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.recipes import tasks

    p = sub.add_parser("tasks", help="mechanism tasks: swap tracking, pointer chasing, recall, flip-flop",
                       description="Synthetic tasks built so that the delta rewrite should matter (shell game: "
                       "reflection; pointer chase: erase) or should not (recall, flip-flop: attention controls). "
                       "See docs/tasks.md.")
    tsub = p.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND")
    lp = tsub.add_parser("list", help="the tasks, their sequence layout, difficulty levels and parameters")
    lp.set_defaults(func=run_list)
    rp = tsub.add_parser(
        "run", help="train variants x paired seeds on one task, report test accuracy by difficulty",
        description="Train each VARIANT with each seed on TASK (fresh sequences of the train split every step) "
        "and measure accuracy on a fixed held-out test set, by difficulty. Seed s fixes the initialisation and "
        "the training data for every variant (paired). Writes OUT/tasks.md (mean +- sd over seeds), "
        "OUT/tasks.json (every per-seed number) and OUT/tasks.png; each finished (variant, seed) is kept in "
        "OUT/VARIANT-seedS.json, so an interrupted run continues where it stopped.")
    rp.add_argument("task", metavar="TASK", help=f"one of {', '.join(TASKS)}")
    options.add_variants(rp, DEFAULT_TASK_VARIANTS)
    options.add_seeds(rp, "paired seeds: a list (--seeds 0 1 2), or one number N for seeds 0..N-1 (default 3)",
                      default=[3])
    options.add_lrs(rp, "every variant")
    rp.add_argument("--out", default=None, help="output directory (default runs/tasks/TASK)")
    options.add_device(rp)
    options.add_threads(rp)
    options.add_set(rp, help="override a setting: KEY=VALUE, the value parsed as YAML. Settings: "
                    f"{', '.join(setting_names())} (their flags below); model.FIELD sets a "
                    "DDLConfig field (e.g. model.beta_max=1), task.PARAM a task parameter (ddl tasks list). "
                    "Repeatable")
    rp.add_argument("--overwrite", action="store_true", help="retrain results already in OUT")
    options.add_wandb(rp, "the result tables (one W&B run per study)")
    options.add_progress(rp)
    train = rp.add_argument_group("training settings of every run (TrainConfig's, the defaults the recipe tasks'; "
                               "--eval-every: the accuracy curve, --log-every: the loss curve's window; "
                               "model.FIELD: see --set)")
    options.add_settings(train, TrainConfig, skip=_not_taken(TrainConfig), defaults={**TrainConfig.defaults(),
                                                                                      **tasks()})
    measure = rp.add_argument_group("the task's test and validation sets (task.PARAM: see --set)")
    options.add_settings(measure, TaskSettings)
    rp.set_defaults(func=run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _not_taken(config: type) -> list[str]:
    """The TrainConfig fields a task run sets itself (no flag)."""
    from deep_delta.experiments.settings import TRAIN_FIELDS

    return [name for name in config.field_names() if name not in TRAIN_FIELDS]


def setting_names() -> list[str]:
    """Every setting of ``ddl tasks run`` that has a flag: the training fields it takes, then its own."""
    from deep_delta.experiments.settings import TRAIN_FIELDS, TaskSettings

    return [*(n for n in TRAIN_FIELDS if n != "model"), *options.setting_names(TaskSettings)]


def run_list(args: argparse.Namespace) -> int:
    from deep_delta.tasks import TASKS

    print("\n\n".join(task().describe() for task in TASKS.values()))
    return 0


def run(args: argparse.Namespace) -> int:
    import torch

    from deep_delta.experiments.settings import TaskSettings, model_config, resolve_task
    from deep_delta.experiments.task_report import log_tasks, task_table
    from deep_delta.experiments.tasks import run_task_lr_grid, run_task_study

    project = options.wandb_project(args)
    given = options.given_settings(args, setting_names())
    lrs = options.lr_grid(args.lrs, given.get("lr"), args.assignments)
    settings = TaskSettings().with_values(**given).with_assignments(args.assignments)
    task = resolve_task(args.task, settings)  # a bad name or parameter is refused before anything is printed
    variants = options.variant_list(args.variants)
    seeds = options.seed_list(args.seeds, 0)
    for variant in variants:
        model_config(task, variant, settings)
    options.apply_threads(args.threads)
    out = args.out or f"runs/tasks/{args.task}"
    grid = f", every lr of {' '.join(f'{x:g}' for x in lrs)}" if lrs else ""
    print(f"ddl tasks run {args.task}: {', '.join(variants)}{grid}, paired seeds {', '.join(map(str, seeds))}, "
          f"{settings.train['steps']} steps x {settings.train['batch_size']} sequences; {torch.get_num_threads()} CPU thread(s); "
          f"results in {out}", flush=True)
    if lrs is None:
        summary = run_task_study(args.task, variants, seeds, settings, out, device=args.device,
                                 overwrite=args.overwrite, progress=not args.no_progress)
    else:
        summary = run_task_lr_grid(args.task, variants, seeds, settings, out, lrs, device=args.device,
                                   overwrite=args.overwrite, progress=not args.no_progress)
    print()
    if lrs is not None:
        from deep_delta.experiments.lr_grid import grid_table

        print("validation accuracy (%) at every lr (bold: each variant's chosen lr; test accuracy below is at it)")
        print(grid_table(summary["lr_selection"]["chosen"], lrs, lambda x: f"{100 * x:.1f}") + "\n")
    print(f"test accuracy (%) by {summary['difficulty_name']}, mean +- sd over seeds")
    print(task_table(summary))
    for note in summary.get("notes", []):  # e.g. the figures not drawn: which extra draws them
        print(f"note: {note}")
    print(f"\nwrote {', '.join(_written(out, summary))}")
    if args.wandb:
        log_tasks(summary, out, project)
    return 1 if any(r["diverged"] for r in summary["rows"]) else 0


def _written(out: str, summary: dict) -> list[str]:
    """The report's files that are there now, each with its folder (an lr grid's adds its sensitivity figure)."""
    from pathlib import Path

    names = ("tasks.md", "tasks.json", "tasks.png") + (("lr_sensitivity.png",) if summary.get("lr_selection") else ())
    return [f"{out}/{name}" for name in names if (Path(out) / name).is_file()]
