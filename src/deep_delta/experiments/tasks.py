"""A study of one mechanism task: several variants with paired seeds (:func:`run_task_study`), or that at every
lr of a grid with each variant at its own best lr (:func:`run_task_lr_grid`), through the study engine
(:mod:`deep_delta.experiments.study`: stored results checked first, OUT locked, interruption); each run is
:func:`deep_delta.experiments.task_runs.train_one`, kept in its own result file; the table and plot are
:mod:`deep_delta.experiments.task_report`.

    settings = TaskSettings().with_assignments(["steps=200", "model.num_hidden_layers=2"])
    summary = run_task_study("shell-game", ["baseline", "ddl-dv1"], [0, 1, 2], settings, "runs/tasks/shell-game")
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from deep_delta.experiments.settings import TaskSettings, model_config, resolve_task
from deep_delta.experiments.task_runs import (
    CHECKSUM,
    finished_results,
    load_result,
    result_checksum,
    result_path,
    train_one,
)
from deep_delta.tasks import Task
from deep_delta.tasks.evaluation import validation_set

OUTPUTS = ("tasks.md", "tasks.json", "tasks.png")


def run_task_study(task_name: str, variants: list[str], seeds: list[int], settings: TaskSettings,
                   out: str | os.PathLike, *, device: str = "auto", overwrite: bool = False, progress: bool = True,
                   say=print) -> dict[str, Any]:
    """Train and evaluate every (variant, seed) of ``task_name`` not yet finished in ``out``; write each result
    (``out/VARIANT-seedS.json``) as it finishes, and after each one the summary (``tasks.md``,
    ``tasks.json``, ``tasks.png``). A finished result is reused when its task, parameters and settings
    are the requested ones; one made with other settings is refused (``overwrite`` retrains it)."""
    from deep_delta.experiments.study import run_keys, run_study
    from deep_delta.experiments.task_report import score_shortcuts, summarize_tasks, write_tasks
    from deep_delta.fsutil import atomic_write

    task = resolve_task(task_name, settings)  # an unknown name is refused here
    for variant in variants:  # every config is checked before anything trains
        model_config(task, variant, settings)
    out = Path(out)
    todo, done = finished_results(task, variants, seeds, settings, out, overwrite=overwrite)
    test = task.test_set(settings.test_seed, settings.test_size)  # a task space too small is refused here
    validation = validation_set(task, settings.test_seed, settings.eval_size)
    shortcuts = score_shortcuts(task, test)
    if done:
        say(f"reusing {len(done)} finished result(s) in {out}")

    def train(key, index: str) -> dict:
        variant, seed = key
        desc = f"{index} {task.name} {variant} seed {seed}"
        record = train_one(task, variant, seed, settings, device=device, progress=progress, desc=desc, test=test,
                           validation=validation)
        record[CHECKSUM] = result_checksum(record)
        atomic_write(result_path(out, variant, seed), json.dumps(record, indent=1) + "\n")
        acc = record["accuracy"]["overall"]
        say(f"{desc}: test accuracy {100 * acc:.1f}% (chance {100 * task.chance:.1f}%), "
            f"{record['train_s']:.0f} s" + (f"; {record['diverged']}" if record["diverged"] else ""))
        return record

    def after_each(results: dict) -> None:
        write_tasks(out, summarize_tasks(task, variants, seeds, {**done, **results}, settings, shortcuts))

    keys = [k for k in run_keys(variants, seeds) if k in todo]
    outputs = [*(result_path(out, v, s) for v, s in keys), *(out / name for name in OUTPUTS)]
    trained = run_study(out, keys, check=lambda key: None, train=train, outputs=outputs, what="result",
                        reused=len(done), lock=f"ddl tasks run {task_name}", after_each=after_each)
    summary = summarize_tasks(task, variants, seeds, {**done, **trained}, settings, shortcuts)
    write_tasks(out, summary)
    return summary


def grid_points(task: Task, variants: list[str], seeds: list[int], lrs: list[float],
                records: dict[tuple[str, float, int], dict]) -> list[dict]:
    """The grid points of :mod:`deep_delta.experiments.lr_grid` from the (variant, lr, seed) records: the value
    is the validation accuracy (never the test accuracy); a run diverged when its training loss was
    non-finite, or its last logged training loss was above ``DIVERGENCE_FACTOR`` x ln(vocabulary size) (a
    uniform guess's loss being ln(vocabulary size)) and no lower than its first logged one. The second
    condition keeps a run whose loss is falling from a start above the limit (large embeddings with a tied
    head start there: the task model's std 0.3) from counting as diverged."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR, divergence

    limit = DIVERGENCE_FACTOR * math.log(task.vocab_size)
    points = []
    for lr in lrs:
        for seed in seeds:
            for variant in variants:
                record = records[variant, lr, seed]
                if "validation" not in record:
                    raise ValueError(f"the result of {variant} seed {seed} at lr {lr:g} has no validation accuracy "
                                     "(made before the lr grid existed); retrain it with `overwrite`")
                curve = record["loss_curve"]
                last = curve[-1][1] if curve else None
                falling = last is not None and math.isfinite(last) and last < curve[0][1]
                why = record.get("diverged") or (None if falling else divergence(last, limit, "training loss"))
                points.append({"variant": variant, "lr": lr, "seed": seed, "diverged": why,
                               "value": None if why else record["validation"]["overall"]})
    return points


def run_task_lr_grid(task_name: str, variants: list[str], seeds: list[int], settings: TaskSettings,
                     out: str | os.PathLike, lrs: list[float], *, device: str = "auto", overwrite: bool = False,
                     progress: bool = True, say=print) -> dict[str, Any]:
    """:func:`run_task_study` at every lr of ``lrs`` (in ``out/lr_<lr>``, each resumable as usual), then each
    variant at its own best lr, chosen on the validation accuracy alone (:func:`validation_set`), and its
    test accuracy at that lr, paired by seed against the baseline at its own best lr. Writes ``tasks.md``,
    ``tasks.json``, ``tasks.png`` and ``lr_sensitivity.png`` in ``out``; returns the summary."""
    from deep_delta.experiments.study import run_lr_study
    from deep_delta.experiments.task_report import write_tasks

    task = resolve_task(task_name, settings)
    out = Path(out)
    records: dict[tuple[str, float, int], dict] = {}

    def run_at(lr: float, where: Path) -> None:
        run_task_study(task_name, variants, seeds, settings.with_values(lr=lr), where, device=device,
                       overwrite=overwrite, progress=progress, say=say)
        for seed in seeds:
            for variant in variants:
                records[variant, lr, seed] = load_result(result_path(where, variant, seed))

    def finish(per_lr: dict, points: list[dict], chosen: dict) -> dict:
        summary = summarize_grid(task, variants, seeds, list(per_lr), settings, records, points, chosen)
        write_tasks(out, summary)
        return summary

    return run_lr_study(
        out, lrs, variants, run_at=run_at, higher_is_better=True, finish=finish, say=say,
        check=lambda lr, where: finished_results(task, variants, seeds, settings.with_values(lr=lr), where,
                                                 overwrite=overwrite),
        points_at=lambda lr, _: grid_points(task, variants, seeds, [lr], records),
        lock=f"ddl tasks run {task_name} --lrs")


def summarize_grid(task: Task, variants: list[str], seeds: list[int], lrs: list[float], settings: TaskSettings,
                   records: dict[tuple[str, float, int], dict], points: list[dict], chosen: dict) -> dict[str, Any]:
    """The study's summary (:func:`deep_delta.experiments.task_report.summarize_tasks`) over each variant's runs
    at its chosen lr, with the grid: ``lr_selection`` (the grid, the method, the choice and every lr's mean) and
    ``lr_grid`` (every point). A variant with no lr free of divergence has no results; its row says why."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR
    from deep_delta.experiments.task_report import summarize_tasks

    at_best = {(v, s): records[v, chosen[v]["lr"], s] for v in variants if chosen[v]["lr"] is not None
               for s in seeds}
    summary = summarize_tasks(task, variants, seeds, at_best, settings)
    for row in summary["rows"]:
        c = chosen[row["variant"]]
        row["lr"] = c["lr"]
        if c["lr"] is None:
            row["diverged"] = {s: c["why"] for s in seeds}
    summary["lr_selection"] = {"method": "per-variant best on the validation accuracy", "lrs": lrs,
                               "chosen": chosen, "divergence_limit": DIVERGENCE_FACTOR * math.log(task.vocab_size)}
    summary["lr_grid"] = points
    summary["settings"]["lr"] = None  # no one lr: each row has its own
    return summary


__all__ = ["grid_points", "run_task_lr_grid", "run_task_study", "summarize_grid"]
