"""A study of one mechanism task: several variants with paired seeds (:func:`run_task_study`), or that at
every lr of a grid with each variant at its own best lr (:func:`run_task_lr_grid`); each (variant, seed) is
kept in its own JSON file (the result cache: :func:`result_path`, :func:`load_result`, :func:`check_result`) so
an interrupted study continues where it stopped.

    settings = TaskSettings().with_assignments(["steps=200", "model.num_hidden_layers=2"])
    summary = run_task_study("shell-game", ["baseline", "ddl-dv1"], [0, 1, 2], settings, "runs/tasks/shell-game")

One run is :func:`deep_delta.tasks.training.train_one`; the table and plot are :mod:`deep_delta.tasks.report`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from deep_delta.tasks import Task
from deep_delta.tasks.evaluation import validation_set
from deep_delta.tasks.settings import TaskSettings, model_config, resolve_task
from deep_delta.tasks.training import run_identity, train_one


# ---------------------------------------------------------------------- a study stopped by a signal
class StudyInterrupted(Exception):
    """SIGINT or SIGTERM stopped a study; the message says what was kept (every finished result) and what was
    lost (the run in training). ``exit_code`` is 128 + the signal, as shells report it."""

    def __init__(self, signum: int, kept: str):
        import signal

        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; {kept}")


@contextlib.contextmanager
def _stop_on_signals(kept):
    """While a study trains (main thread only), SIGINT and SIGTERM stop it at once with :class:`StudyInterrupted`,
    whose message is ``kept()``: a run of a task is short, so it is retrained rather than checkpointed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise StudyInterrupted(signum, kept())

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------- the result cache: one file per run
def result_path(out: str | os.PathLike, variant: str, seed: int) -> Path:
    return Path(out) / f"{variant}-seed{seed}.json"


CHECKSUM = "checksum"  # of every other entry of a result file: an edit of any number is found


def result_checksum(record: dict[str, Any]) -> str:
    """SHA-256 of ``record`` without its checksum, as canonical JSON (floats round-trip through JSON exactly)."""
    import hashlib

    body = {k: v for k, v in record.items() if k != CHECKSUM}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def load_result(path: Path) -> dict[str, Any] | None:
    """A finished result file, or None where there is none. A file that cannot be read as a result is an error
    naming it (results are written atomically: a partial file means something else wrote there), and so is one
    whose checksum does not match what it holds (edited by hand). :func:`check_result` checks its fields."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not a valid result file ({e}); delete it or retrain with `overwrite`") from None
    if not isinstance(record, dict) or "accuracy" not in record or "settings" not in record:
        raise ValueError(f"{path} is not a task result file; delete it or use `overwrite`")
    if CHECKSUM in record and record[CHECKSUM] != result_checksum(record):
        raise ValueError(f"{path}: its numbers do not match its `{CHECKSUM}`: the file was changed after it was "
                         f"written; delete it, or retrain it with `overwrite`")
    return record


def check_result(record: dict[str, Any], path: Path, task: Task) -> None:
    """A result is used only when every field the report reads is there with a usable value, and its accuracies
    are the ones its counts give (overall and per level; the levels' counts add up to the overall ones)."""

    def bad(field: str, got: Any, allowed: str) -> ValueError:
        return ValueError(f"{path}: field {field!r} got {got!r}; allowed: {allowed}. The file is damaged or was "
                          f"edited: delete it, or retrain it with `overwrite`")

    def count(field: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(field, value, "an integer >= 0")
        return value

    def share(field: str, value: Any, correct: int, total: int) -> None:
        expected = correct / total if total else None
        if expected is None and value is not None:
            raise bad(field, value, "null (no scored position)")
        if expected is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                     or not math.isclose(value, expected, rel_tol=1e-12, abs_tol=1e-15)):
            raise bad(field, value, f"{expected!r}, the share its counts give ({correct} / {total})")

    acc = record["accuracy"]
    if not isinstance(acc, dict):
        raise bad("accuracy", acc, "an object with overall, correct, total and by_difficulty")
    correct, total = count("accuracy.correct", acc.get("correct")), count("accuracy.total", acc.get("total"))
    share("accuracy.overall", acc.get("overall"), correct, total)
    levels = acc.get("by_difficulty")
    if not isinstance(levels, dict):
        raise bad("accuracy.by_difficulty", levels, "an object with one entry per level")
    sums = [0, 0]
    for level in map(str, task.levels):
        entry = levels.get(level)
        where = f"accuracy.by_difficulty.{level}"
        if not isinstance(entry, dict):
            raise bad(where, entry, "an object with accuracy, correct and total")
        c, t = count(f"{where}.correct", entry.get("correct")), count(f"{where}.total", entry.get("total"))
        share(f"{where}.accuracy", entry.get("accuracy"), c, t)
        sums = [sums[0] + c, sums[1] + t]
    if sums != [correct, total]:
        raise bad("accuracy.correct / total", [correct, total], f"the sums over the levels, {sums}")
    for name, ok, allowed in (
        ("test_loss", lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
         "a number or null"),  # NaN after a diverged run
        ("train_s", _is_number, "a number"),
        ("parameters", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        ("steps_done", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        ("diverged", lambda v: v is None or isinstance(v, str), "null or a message"),
        ("loss_curve", lambda v: isinstance(v, list), "a list of [step, loss]"),
        ("accuracy_curve", lambda v: isinstance(v, list), "a list of [step, accuracy]"),
    ):
        if not ok(record.get(name)):
            raise bad(name, record.get(name), allowed)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finished_results(task: Task, variants: list[str], seeds: list[int], settings: TaskSettings, out: Path, *,
                     overwrite: bool) -> tuple[list[tuple[str, int]], dict[tuple[str, int], dict]]:
    """The (variant, seed) runs still to train in ``out`` and the finished results to reuse; a result made with
    other settings (or edited after it was written) is refused, naming the differences."""
    from deep_delta.train.provenance import check_belongs

    todo, done = [], {}
    for seed in seeds:
        for variant in variants:
            path = result_path(out, variant, seed)
            saved = None if overwrite else load_result(path)
            if saved is None:
                todo.append((variant, seed))
                continue
            check_belongs({k: saved.get(k) for k in ("task", "task_params", "variant", "seed", "settings")},
                          run_identity(task, variant, seed, settings), what=f"the result {path}", has="file has",
                          remedy="use another output directory, or `overwrite` to retrain it")
            check_result(saved, path, task)
            done[variant, seed] = saved
    return todo, done


# ---------------------------------------------------------------------- a study: variants x seeds
def run_task_study(task_name: str, variants: list[str], seeds: list[int], settings: TaskSettings,
                   out: str | os.PathLike, *, device: str = "auto", overwrite: bool = False, progress: bool = True,
                   say=print) -> dict[str, Any]:
    """Train and evaluate every (variant, seed) of ``task_name`` not yet finished in ``out``; write each result
    (``out/VARIANT-seedS.json``) as it finishes, and after each one the summary (``tasks.md``,
    ``tasks.json``, ``tasks.png``). A finished result is reused when its task, parameters and settings
    are the requested ones; one made with other settings is refused (``overwrite`` retrains it)."""
    from deep_delta.fsutil import atomic_write, refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.tasks.report import score_shortcuts, summarize, write_outputs
    from deep_delta.train.checkpoint import run_lock

    task = resolve_task(task_name, settings)  # an unknown name is refused here
    for variant in variants:  # every config is checked before anything trains
        model_config(task, variant, settings)
    out = Path(out)
    todo, done = finished_results(task, variants, seeds, settings, out, overwrite=overwrite)
    refuse_replaced_dir(out)
    refuse_unwritable_results([*(result_path(out, v, s) for v, s in todo), *(out / f"tasks.{ext}"
                                                                            for ext in ("md", "json", "png"))])
    test = task.test_set(settings.test_seed, settings.test_size)  # a task space too small is refused here
    validation = validation_set(task, settings)
    shortcuts = score_shortcuts(task, test)
    running: list[str] = []  # the (variant, seed) in training, for the message of an interrupted study

    def kept() -> str:
        lost = f"the run in progress ({running[0]}) is lost; " if running else ""
        return f"{lost}{len(done)} finished result(s) are kept in {out} and are reused when the study is run again"

    with run_lock(out, f"ddl tasks run {task_name}"), _stop_on_signals(kept):
        if done:
            say(f"reusing {len(done)} finished result(s) in {out}")
        for i, (variant, seed) in enumerate(todo, 1):
            desc = f"[{i}/{len(todo)}] {task.name} {variant} seed {seed}"
            running[:] = [f"{variant} seed {seed}"]
            record = train_one(task, variant, seed, settings, device=device, progress=progress, desc=desc,
                               test=test, validation=validation)
            record[CHECKSUM] = result_checksum(record)
            atomic_write(result_path(out, variant, seed), json.dumps(record, indent=1) + "\n")
            done[variant, seed] = record
            running.clear()
            acc = record["accuracy"]["overall"]
            say(f"{desc}: test accuracy {100 * acc:.1f}% (chance {100 * task.chance:.1f}%), "
                f"{record['train_s']:.0f} s" + (f"; {record['diverged']}" if record["diverged"] else ""))
            if i < len(todo):  # the last one is written below
                write_outputs(out, summarize(task, variants, seeds, done, settings, shortcuts))
        summary = summarize(task, variants, seeds, done, settings, shortcuts)
        write_outputs(out, summary)
    return summary


# ---------------------------------------------------------------------- an lr grid: variants x lrs x seeds
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
    from deep_delta.experiments.lr_grid import check_lrs, choose_lrs, lr_dir
    from deep_delta.tasks.report import write_outputs
    from deep_delta.train.checkpoint import run_lock

    lrs = check_lrs(lrs)
    task = resolve_task(task_name, settings)
    out = Path(out)
    for lr in lrs:  # every lr's stored results are checked before anything trains
        finished_results(task, variants, seeds, dataclasses.replace(settings, lr=lr), lr_dir(out, lr),
                         overwrite=overwrite)
    records = {}
    with run_lock(out, f"ddl tasks run {task_name} --lrs"):
        for i, lr in enumerate(lrs, 1):
            say(f"lr {lr:g} ({i}/{len(lrs)} of the grid): {lr_dir(out, lr)}")
            run_task_study(task_name, variants, seeds, dataclasses.replace(settings, lr=lr), lr_dir(out, lr),
                           device=device, overwrite=overwrite, progress=progress, say=say)
            for seed in seeds:
                for variant in variants:
                    records[variant, lr, seed] = load_result(result_path(lr_dir(out, lr), variant, seed))
        points = grid_points(task, variants, seeds, lrs, records)
        chosen = choose_lrs(points, variants, lrs, higher_is_better=True)
        summary = summarize_grid(task, variants, seeds, lrs, settings, records, points, chosen)
        write_outputs(out, summary)
    return summary


def summarize_grid(task: Task, variants: list[str], seeds: list[int], lrs: list[float], settings: TaskSettings,
                   records: dict[tuple[str, float, int], dict], points: list[dict], chosen: dict) -> dict[str, Any]:
    """The study's summary (:func:`deep_delta.tasks.report.summarize`) over each variant's runs at its chosen
    lr, with the grid: ``lr_selection`` (the grid, the method, the choice and every lr's mean) and ``lr_grid``
    (every point). A variant with no lr free of divergence has no results; its row says why."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR
    from deep_delta.tasks.report import summarize

    at_best = {(v, s): records[v, chosen[v]["lr"], s] for v in variants if chosen[v]["lr"] is not None
               for s in seeds}
    summary = summarize(task, variants, seeds, at_best, settings)
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
