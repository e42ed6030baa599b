"""A study: the runs of variants x paired seeds, at one learning rate or at every lr of a grid (and, through
:mod:`deep_delta.experiments.scaling`, at several widths and lengths), for any kind of run: a language-model
comparison (:mod:`deep_delta.experiments.compare`) or a mechanism task (:mod:`deep_delta.experiments.tasks`).

What every study does, done here once:

- every stored result is checked against the settings asked for now before anything trains (a result of other
  settings is refused, naming the differences), and so are the result files the study will write;
- its output directory is locked while it runs (one study per ``OUT``);
- its runs train one after the other, in seed-major order, each through the trainer; a finished run is reused
  and an interrupted one continued where its kind keeps checkpoints;
- SIGINT / SIGTERM end it after the current optimizer step (the trainer's :class:`~deep_delta.train.signals.
  StopSignals`), or between two runs, with :class:`StudyInterrupted` saying what was kept;
- with an lr grid, one such study per lr in ``OUT/lr_<lr>/``, then each variant's best lr chosen on validation
  data alone (:func:`deep_delta.experiments.lr_grid.choose_lrs`).

A kind of run brings three functions: ``check(key)`` (refuse a stored result of other settings), ``train(key,
tag)`` (train or reuse the run, return its result) and the result files it writes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Key = tuple[str, int]  # (variant, seed)


class StudyInterrupted(Exception):
    """SIGINT or SIGTERM stopped a study; the message says what was kept (every finished result, and the run in
    progress where its kind keeps checkpoints) and what was lost. ``exit_code`` is 128 + the signal, as shells
    report it."""

    def __init__(self, signum: int, kept: str):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; {kept}")


def run_keys(variants: Sequence[str], seeds: Sequence[int]) -> list[Key]:
    """The study's runs in training order: every variant of the first seed, then of the next."""
    return [(v, s) for s in seeds for v in variants]


def run_study(out: str | os.PathLike, keys: Sequence[Key], *, check: Callable[[Key], None],
              train: Callable[[Key, str], Any], outputs: Iterable[Path], lock: str, what: str = "run",
              reused: int = 0, after_each: Callable[[dict[Key, Any]], None] | None = None) -> dict[Key, Any]:
    """Check every run and result file, then train the runs of ``keys`` in ``out`` (locked) one by one;
    returns ``{key: train(key, "[i/n]")}``. ``after_each(results)`` runs after each but the last (a study that
    rewrites its summary as results come in). ``what``: how the message of an interruption names a result;
    ``reused``: the finished ones the caller took from ``out`` without training, kept too."""
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.train.checkpoint import run_lock
    from deep_delta.train.progress import runs_after
    from deep_delta.train.signals import StopSignals
    from deep_delta.train.trainer import TrainingInterrupted

    out, keys = Path(out), list(keys)
    for key in keys:  # every stored result is checked before anything trains
        check(key)
    refuse_replaced_dir(out)
    refuse_unwritable_results(list(outputs))
    results: dict[Key, Any] = {}

    def kept(lost: str = "") -> str:
        return (f"{lost}{reused + len(results)} finished {what}(s) are kept in {out} and are reused when the study "
                "is run again")

    with run_lock(out, lock), StopSignals() as stop:
        for i, key in enumerate(keys, 1):
            name = f"{key[0]} seed {key[1]}"
            try:
                with runs_after(len(keys) - i):  # what the run's estimate of its length adds
                    results[key] = train(key, f"[{i}/{len(keys)}]")
            except TrainingInterrupted as e:
                lost = (f"the run in progress ({name}) is lost; " if e.checkpoint is None else
                        f"the run in progress ({name}) keeps its checkpoint of step {e.step} and continues from it; ")
                raise StudyInterrupted(e.signum, kept(lost)) from None
            if after_each is not None and i < len(keys):
                after_each(results)
            if stop.requested is not None and i < len(keys):
                raise StudyInterrupted(stop.requested, kept())
    return results


def run_lr_study(out: str | os.PathLike, lrs: Sequence[float], variants: Sequence[str], *,
                 check: Callable[[float, Path], None], run_at: Callable[[float, Path], Any],
                 points_at: Callable[[float, Any], list[dict]], higher_is_better: bool,
                 finish: Callable[[dict[float, Any], list[dict], dict], dict], lock: str | None, say=print,
                 grids: dict[str, list[float]] | None = None) -> dict:
    """The study at every lr of ``lrs`` (``run_at(lr, OUT/lr_<lr>)``, each a complete study of the variants whose
    grid holds that lr, resumable as one), then each variant's best lr of its grid (``grids``, {variant: grid};
    None: ``lrs`` for every variant) from the grid points (``points_at(lr, result)``: one per (variant, seed) with
    its validation ``value`` and ``diverged``), and ``finish(per_lr, points, chosen)``, the summary, written while
    ``out`` is still locked (``lock``: what the lock names; None: the caller holds it). Every lr's stored results
    (``check(lr, OUT/lr_<lr>)``) are checked first."""
    from contextlib import nullcontext

    from deep_delta.experiments.lr_grid import check_lrs, choose_lrs, lr_dir
    from deep_delta.train.checkpoint import run_lock

    out, lrs = Path(out), check_lrs(lrs)
    for lr in lrs:  # every stored run of every lr is checked before anything trains
        check(lr, lr_dir(out, lr))
    with run_lock(out, lock) if lock is not None else nullcontext():
        per_lr = {}
        for i, lr in enumerate(lrs, 1):
            say(f"lr {lr:g} ({i}/{len(lrs)} of the grid): {lr_dir(out, lr)}")
            per_lr[lr] = run_at(lr, lr_dir(out, lr))
        points = [p for lr in lrs for p in points_at(lr, per_lr[lr])]
        chosen = choose_lrs(points, variants, grids or lrs, higher_is_better=higher_is_better)
        return finish(per_lr, points, chosen)


__all__ = ["Key", "StudyInterrupted", "run_keys", "run_lr_study", "run_study"]
