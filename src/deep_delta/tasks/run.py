"""Train a tiny model on a mechanism task and measure its test accuracy by difficulty; several variants with
paired seeds, each (variant, seed) kept in its own JSON file so an interrupted study continues where it stopped.

    settings = TaskSettings().with_assignments(["steps=200", "model.num_hidden_layers=2"])
    summary = run_task_study("shell-game", ["baseline", "ddl-dv1"], [0, 1, 2], settings, "runs/tasks/shell-game")

Seed s fixes the model's initialisation (``torch.manual_seed(s)`` before it is built) and the order of the
training sequences (a numpy stream of s), the same for every variant; the test set depends only on
``test_seed``. Training draws a fresh batch from the task's train split every step (the trainer's
``optimizer_step``: AdamW, gradient clipping, the warm-up + cosine schedule).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deep_delta.settings import check_fields
from deep_delta.tasks import TASKS, Batch, Task, accuracy_by_difficulty, data_rng, get_task

# The model: the tiny preset narrowed to d = 64 (4 layers, 4 heads of 16), so that a run of the default
# 1000 steps takes minutes on a CPU core; the vocabulary and the positions are the task's own (model_config).
MODEL_DEFAULTS: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4)


@dataclass
class TaskSettings:
    """Everything a (task, variant, seed) run depends on besides those three; ``--set KEY=VALUE`` sets a field,
    ``model.FIELD`` a DDLConfig field, ``task.PARAM`` a task parameter (``ddl tasks list`` shows them)."""

    preset: str = "tiny"
    steps: int = 1000
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    grad_clip: float = 1.0
    log_every: int = 25  # training-loss curve: the mean loss of each LOG_EVERY steps
    eval_every: int = 200  # accuracy curve on the first eval_size test sequences (0: only at the end)
    eval_size: int = 500
    test_size: int = 2000  # the fixed test set (flip-flop: at most this many, see FlipFlop.test_set)
    test_seed: int = 1234
    model: dict[str, Any] = field(default_factory=lambda: dict(MODEL_DEFAULTS))
    task: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        check_fields(self)  # the types, from the annotations
        for name in ("steps", "batch_size", "test_size", "log_every", "eval_size"):
            if getattr(self, name) < 1:
                raise _bad(name, getattr(self, name), "an integer >= 1")
        for name in ("warmup_steps", "eval_every"):
            if getattr(self, name) < 0:
                raise _bad(name, getattr(self, name), "an integer >= 0")
        if self.lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"TaskSettings: lr {self.lr}, weight_decay {self.weight_decay}, grad_clip "
                             f"{self.grad_clip}, min_lr_ratio {self.min_lr_ratio}; allowed: lr > 0, the others "
                             ">= 0, min_lr_ratio <= 1")
        betas = self.betas
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            raise _bad("betas", betas, "two numbers in [0, 1), e.g. [0.9, 0.98]")
        self.betas = [float(b) for b in betas]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_assignments(self, assignments: list[str]) -> TaskSettings:
        """These settings with ``KEY=VALUE`` strings applied (values parsed as YAML, as ``ddl train --set``)."""
        from deep_delta.settings import parse_assignment

        values = self.to_dict()
        fields = {f.name for f in dataclasses.fields(self)} - {"model", "task"}
        for item in assignments:
            key, value = parse_assignment(item)
            group, dot, name = key.partition(".")
            if dot and group == "model" and name in model_fields():
                values["model"][name] = value
            elif dot and group == "model":
                raise ValueError(f"`assignments` got {item!r}: DDLConfig has no field {name!r}; allowed model "
                                 f"fields: {', '.join(sorted(model_fields()))}")
            elif dot and group == "task" and name:
                values["task"][name] = value
            elif key in fields:
                values[key] = value
            else:
                raise ValueError(f"`assignments` got {item!r}: no setting {key!r}; allowed: "
                                 f"{', '.join(sorted(fields))}, model.FIELD (a DDLConfig field) or task.PARAM "
                                 "(a task parameter, see `ddl tasks list`)")
        return TaskSettings(**values)


def model_fields() -> set[str]:
    """The DDLConfig fields ``model.FIELD`` may set (variant and preset are chosen by name, not set)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    return DDLConfig.field_names() - {"variant", "preset"}


def _bad(name: str, got: Any, allowed: str) -> ValueError:
    return ValueError(f"TaskSettings: `{name}` got {got!r}; allowed: {allowed}")


def model_config(task: Task, variant: str, settings: TaskSettings):
    """The variant's DDLConfig at ``settings.preset``, narrowed by ``settings.model``, with the task's
    vocabulary and sequence length (unless ``settings.model`` sets them)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    overrides = {"vocab_size": task.vocab_size, "max_position_embeddings": task.seq_len, **settings.model}
    cfg = DDLConfig.from_variant(variant, settings.preset, **overrides)  # a value of the wrong type is named here
    if cfg.vocab_size < task.vocab_size or cfg.max_position_embeddings < task.seq_len:
        raise ValueError(f"`model.vocab_size` {cfg.vocab_size} / `model.max_position_embeddings` "
                         f"{cfg.max_position_embeddings}; allowed: at least the task's vocabulary "
                         f"{task.vocab_size} and sequence length {task.seq_len}")
    return cfg


def resolve_task(name: str, settings: TaskSettings) -> Task:
    return get_task(name, **settings.task)


def run_identity(task: Task, variant: str, seed: int, settings: TaskSettings) -> dict[str, Any]:
    """What a finished result must match to be reused: the task and its parameters, variant, seed, settings."""
    return {"task": task.name, "task_params": task.params(), "variant": variant, "seed": seed,
            "settings": settings.to_dict()}


# ---------------------------------------------------------------------- one (task, variant, seed)
def evaluate(model, task: Task, test: Batch, device, batch_size: int = 500) -> dict[str, Any]:
    """Greedy (argmax over the whole vocabulary) accuracy on ``test`` by difficulty, and the mean test loss
    (nats) at the scored positions: :func:`accuracy_by_difficulty` plus ``"loss"``."""
    import torch

    from deep_delta.tasks.base import IGNORE

    was_training = model.training
    model.eval()
    predictions, loss_sum, scored = [], 0.0, 0
    with torch.no_grad():
        for lo in range(0, len(test), batch_size):
            x = torch.from_numpy(test.inputs[lo:lo + batch_size]).to(device)
            y = torch.from_numpy(test.labels[lo:lo + batch_size]).to(device)
            out = model(x, shift_labels=y, use_cache=False)
            predictions.append(out.logits.argmax(-1).cpu().numpy())
            n = int((y != IGNORE).sum())
            loss_sum, scored = loss_sum + float(out.loss) * n, scored + n
    model.train(was_training)
    result = accuracy_by_difficulty(np.concatenate(predictions), test.labels, test.difficulty, task.levels)
    result["loss"] = loss_sum / scored if scored else None
    return result


def build_run(task: Task, variant: str, seed: int, settings: TaskSettings, device):
    """The model (initialised under ``torch.manual_seed(seed)``), its AdamW optimizer and the schedule."""
    import torch

    from deep_delta.models import DDLForCausalLM
    from deep_delta.train.optim import WarmupCosine, build_optimizer

    torch.manual_seed(seed)
    model = DDLForCausalLM(model_config(task, variant, settings)).to(device).train()
    optimizer = build_optimizer(model, settings.lr, settings.weight_decay, tuple(settings.betas))
    return model, optimizer, WarmupCosine(settings.warmup_steps, settings.steps, settings.min_lr_ratio)


def train_steps(model, optimizer, schedule, task: Task, seed: int, settings: TaskSettings, device, bar,
                curve_set: Batch) -> dict[str, Any]:
    """``settings.steps`` steps of the trainer's ``optimizer_step``, each on a fresh batch of the train split
    drawn from the seed's stream; stops at a non-finite loss. Returns the curves, the steps done and
    ``diverged`` (None, or why training stopped)."""
    import torch

    from deep_delta.train.distributed import DistInfo
    from deep_delta.train.optim import set_learning_rate
    from deep_delta.train.trainer import optimizer_step

    rng, info = data_rng(seed, f"{task.name}/train"), DistInfo(device=device)
    loss_curve, acc_curve, window, diverged, step = [], [], [], None, 0
    for step in range(1, settings.steps + 1):
        set_learning_rate(optimizer, schedule(step - 1))
        batch = task.generate(rng, settings.batch_size, "train")
        pair = (torch.from_numpy(batch.inputs), torch.from_numpy(batch.labels))
        loss, _ = optimizer_step(model, optimizer, [pair], grad_clip=settings.grad_clip, info=info)
        window.append(float(loss))
        if not math.isfinite(window[-1]):
            diverged = f"non-finite training loss at step {step}"
            break
        if step % settings.log_every == 0 or step == settings.steps:
            loss_curve.append([step, sum(window) / len(window)])
            window = []
            bar.update(step, loss_curve[-1][1])
        if settings.eval_every and step % settings.eval_every == 0 and step < settings.steps:
            acc_curve.append([step, evaluate(model, task, curve_set, device)["overall"]])
    acc_curve.append([step, evaluate(model, task, curve_set, device)["overall"]])
    return {"loss_curve": loss_curve, "accuracy_curve": acc_curve, "steps_done": step, "diverged": diverged}


def validation_set(task: Task, settings: TaskSettings) -> Batch:
    """``settings.eval_size`` held-out sequences of the train split (never a test sequence), from a stream of
    their own (``test_seed``, "validation"), not the training stream: what an lr grid chooses on."""
    return task.generate(data_rng(settings.test_seed, f"{task.name}/validation"), settings.eval_size, "train")


def train_one(task: Task, variant: str, seed: int, settings: TaskSettings, *, device: str = "auto",
              progress: bool = True, desc: str | None = None, test: Batch | None = None,
              validation: Batch | None = None) -> dict[str, Any]:
    """Train ``variant`` on ``task`` with ``seed`` for ``settings.steps`` steps, evaluate on the validation set
    (:func:`validation_set`) and the fixed test set; the result record (accuracy by difficulty, validation
    accuracy and loss, loss and accuracy curves, time) as :func:`run_task_study` stores it. A non-finite loss
    stops training there; the record names the step under ``"diverged"``."""
    import torch

    from deep_delta.models import count_parameters
    from deep_delta.runtime import resolve_device

    dev = resolve_device(device)
    test = task.test_set(settings.test_seed, settings.test_size) if test is None else test
    validation = validation_set(task, settings) if validation is None else validation
    model, optimizer, schedule = build_run(task, variant, seed, settings, dev)
    t0 = time.perf_counter()
    with _bar(settings.steps, desc or f"{task.name} {variant} seed {seed}", progress) as bar:
        trained = train_steps(model, optimizer, schedule, task, seed, settings, dev, bar,
                              test.take(slice(0, settings.eval_size)))
    train_s = time.perf_counter() - t0
    final = evaluate(model, task, test, dev)
    held_out = evaluate(model, task, validation, dev)
    return {
        **run_identity(task, variant, seed, settings),
        "accuracy": {"overall": final["overall"], "correct": final["correct"], "total": final["total"],
                     "by_difficulty": {str(k): v for k, v in final["by_difficulty"].items()}},
        "test_loss": final["loss"], "validation": {"overall": held_out["overall"], "loss": held_out["loss"]},
        "chance": task.chance, "levels": list(task.levels),
        "level_names": list(task.level_names), "difficulty_name": task.difficulty_name, **trained,
        "parameters": count_parameters(model), "model_config": model.config.to_diff_dict(),
        "train_s": train_s, "wall_s": time.perf_counter() - t0, "device": str(dev),
        "threads": torch.get_num_threads(),
    }


class _bar:
    """A tqdm bar over steps with the running loss, or (``progress`` False) a plain line every tenth."""

    def __init__(self, total: int, desc: str, progress: bool):
        self.total, self.desc, self.progress, self.done = total, desc, progress, 0
        self.tqdm = None

    def __enter__(self) -> _bar:
        if self.progress:
            from tqdm import tqdm

            self.tqdm = tqdm(total=self.total, desc=self.desc, unit="step", dynamic_ncols=True, leave=False)
        return self

    def update(self, step: int, loss: float) -> None:
        if self.tqdm is not None:
            self.tqdm.update(step - self.done)
            self.tqdm.set_postfix(loss=f"{loss:.4f}", refresh=False)
        elif step * 10 // self.total > self.done * 10 // self.total or step == self.total:
            print(f"{self.desc}: step {step}/{self.total} loss {loss:.4f}", flush=True)
        self.done = step

    def __exit__(self, *exc) -> None:
        if self.tqdm is not None:
            self.tqdm.close()


# ---------------------------------------------------------------------- a study: variants x seeds
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

    if task_name not in TASKS:
        raise ValueError(f"`task` got {task_name!r}; allowed: {' | '.join(TASKS)}")
    task = resolve_task(task_name, settings)
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
    non-finite or its last logged training loss was above ``DIVERGENCE_FACTOR`` x ln(vocabulary size), a
    uniform guess's loss being ln(vocabulary size)."""
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
                last = record["loss_curve"][-1][1] if record["loss_curve"] else None
                why = record.get("diverged") or divergence(last, limit, "training loss")
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
