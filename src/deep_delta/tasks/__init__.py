"""Mechanism tasks: small synthetic sequence tasks that probe what the delta residual can do that an additive
residual cannot (reflection, erase), with controls that attention alone solves. See docs/tasks.md.

    from deep_delta.tasks import get_task
    task = get_task("shell-game")                  # or get_task("shell-game", num_swaps=4)
    batch = task.generate(rng, 64, "train")        # inputs, labels (-100 where unscored), difficulty
    test = task.test_set(seed=1234, size=2000)

A run's data: ``Task.batches(seed, batch_size)``, a stream the
trainer draws from; its measure: :mod:`deep_delta.tasks.evaluation`. Nothing here trains or reports: one run is
:mod:`deep_delta.experiments.task_runs` (through the trainer), a study of variants x seeds (and lr grids)
:mod:`deep_delta.experiments.tasks`, its table and plot :mod:`deep_delta.experiments.task_report`, its settings
:class:`deep_delta.experiments.settings.TaskSettings`.
"""

from __future__ import annotations

from deep_delta.tasks.base import (
    BOS,
    IGNORE,
    NO_LEVEL,
    PAD,
    SEP,
    Batch,
    Task,
    data_rng,
    sequence_hash,
    split_of,
)
from deep_delta.tasks.flip_flop import FlipFlop
from deep_delta.tasks.metrics import accuracy_by_difficulty
from deep_delta.tasks.pointer_chase import PointerChase
from deep_delta.tasks.recall import AssociativeRecall
from deep_delta.tasks.shell_game import ShellGame

TASKS: dict[str, type[Task]] = {t.name: t for t in (ShellGame, PointerChase, AssociativeRecall, FlipFlop)}


def get_task(name: str, **params) -> Task:
    """The task ``name`` (see ``TASKS``) with its default parameters, or others given as keywords."""
    if name not in TASKS:
        raise ValueError(f"`task` got {name!r}; allowed: {' | '.join(TASKS)}")
    return TASKS[name]().with_params(**params)


__all__ = ["TASKS", "get_task", "Task", "Batch", "ShellGame", "PointerChase", "AssociativeRecall", "FlipFlop",
           "accuracy_by_difficulty", "split_of", "sequence_hash", "data_rng", "IGNORE", "NO_LEVEL", "PAD", "BOS",
           "SEP"]
