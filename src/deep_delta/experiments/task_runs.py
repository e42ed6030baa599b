"""One mechanism-task run and its result file: :func:`train_one` trains a tiny model on a task through the
package's trainer and measures it (one result record); :func:`result_path`, :func:`load_result`,
:func:`check_result` and :func:`finished_results` keep each finished (variant, seed) in its own checksummed JSON
file, so an interrupted study continues where it stopped.

Seed s fixes the model's initialisation (``torch.manual_seed(s)`` before it is built) and the order of the
training sequences (a numpy stream of s), the same for every variant; the test set depends only on
``test_seed``. The run trains through the :class:`~deep_delta.train.trainer.Trainer` (a run kept in memory) on
a fresh batch of the task's train split every step (:meth:`deep_delta.tasks.Task.batches`), under the warm-up +
cosine schedule; its accuracy curve is the trainer's evaluation callback.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from deep_delta.experiments.settings import TaskSettings, model_config
from deep_delta.tasks import Batch, Task
from deep_delta.tasks.evaluation import evaluate, validation_set


def run_identity(task: Task, variant: str, seed: int, settings: TaskSettings) -> dict[str, Any]:
    """What a finished result must match to be reused: the task and its parameters, variant, seed, settings."""
    return {"task": task.name, "task_params": task.params(), "variant": variant, "seed": seed,
            "settings": settings.to_dict()}


def build_model(task: Task, variant: str, seed: int, settings: TaskSettings):
    """The run's model, initialised under ``torch.manual_seed(seed)`` (the same init for every study of the seed)."""
    import torch

    from deep_delta.models import DDLForCausalLM

    torch.manual_seed(seed)
    return DDLForCausalLM(model_config(task, variant, settings))


def loss_curve(records: list[dict], every: int, steps: int) -> list[list]:
    """The mean training loss of each ``every`` steps (and of the last, shorter, window at ``steps``)."""
    curve, window = [], []
    for r in records:
        if "loss" not in r:
            continue
        window.append(r["loss"])
        if r["step"] % every == 0 or r["step"] == steps:
            curve.append([r["step"], sum(window) / len(window)])
            window = []
    return curve


def train_one(task: Task, variant: str, seed: int, settings: TaskSettings, *, device: str = "auto",
              progress: bool = True, desc: str | None = None, test: Batch | None = None,
              validation: Batch | None = None) -> dict[str, Any]:
    """Train ``variant`` on ``task`` with ``seed`` for ``settings.train["steps"]`` steps through the trainer (a run kept in
    memory, on fresh batches of the task, evaluated by its accuracy on the first ``eval_size`` test sequences),
    then measure it on the validation set (:func:`validation_set`) and the fixed test set; the result record
    (accuracy by difficulty, validation accuracy and loss, loss and accuracy curves, time) as
    :func:`deep_delta.experiments.tasks.run_task_study` stores it. A non-finite loss ends training at the last good
    step; the record says why under ``"diverged"``."""
    import torch

    from deep_delta.models import count_parameters
    from deep_delta.runtime import resolve_device
    from deep_delta.train.trainer import Trainer

    dev = resolve_device(device)
    test = task.test_set(settings.test_seed, settings.test_size) if test is None else test
    validation = validation_set(task, settings.test_seed, settings.eval_size) if validation is None else validation
    curve_set = test.take(slice(0, settings.eval_size))
    model = build_model(task, variant, seed, settings)
    trainer = Trainer(settings.train_config(task, variant, seed, str(dev)), model=model, persist=False,
                      batches=task.batches(seed, settings.train["batch_size"]), progress=progress, quiet=True,
                      desc=desc or f"{task.name} {variant} seed {seed}",
                      evaluate=lambda m: {"accuracy": evaluate(m, task, curve_set, dev)["overall"]})
    t0 = time.perf_counter()
    result = trainer.run()
    train_s = time.perf_counter() - t0
    final = evaluate(model, task, test, dev)
    held_out = evaluate(model, task, validation, dev)
    return {
        **run_identity(task, variant, seed, settings),
        "accuracy": {"overall": final["overall"], "correct": final["correct"], "total": final["total"],
                     "by_difficulty": {str(k): v for k, v in final["by_difficulty"].items()}},
        "test_loss": final["loss"], "validation": {"overall": held_out["overall"], "loss": held_out["loss"]},
        "chance": task.chance, "levels": list(task.levels),
        "level_names": list(task.level_names), "difficulty_name": task.difficulty_name,
        "loss_curve": loss_curve(trainer.records, settings.train["log_every"], settings.train["steps"]),
        "accuracy_curve": [[r["step"], r["accuracy"]] for r in trainer.records if "accuracy" in r],
        "steps_done": result.step, "diverged": result.diverged,
        "parameters": count_parameters(model), "model_config": model.config.to_diff_dict(),
        "train_s": train_s, "wall_s": time.perf_counter() - t0, "device": str(dev),
        "threads": torch.get_num_threads(),
    }


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
