"""One mechanism-task run: train a tiny model on a task and measure it (:func:`train_one`, one result record).

Seed s fixes the model's initialisation (``torch.manual_seed(s)`` before it is built) and the order of the
training sequences (a numpy stream of s), the same for every variant; the test set depends only on
``test_seed``. Training draws a fresh batch from the task's train split every step through the trainer's
``optimizer_step`` (the package's one step: AdamW, gradient clipping), under the warm-up + cosine schedule.
"""

from __future__ import annotations

import math
import time
from typing import Any

from deep_delta.tasks import Batch, Task, data_rng
from deep_delta.tasks.evaluation import evaluate, validation_set
from deep_delta.tasks.settings import TaskSettings, model_config


def run_identity(task: Task, variant: str, seed: int, settings: TaskSettings) -> dict[str, Any]:
    """What a finished result must match to be reused: the task and its parameters, variant, seed, settings."""
    return {"task": task.name, "task_params": task.params(), "variant": variant, "seed": seed,
            "settings": settings.to_dict()}


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


def train_one(task: Task, variant: str, seed: int, settings: TaskSettings, *, device: str = "auto",
              progress: bool = True, desc: str | None = None, test: Batch | None = None,
              validation: Batch | None = None) -> dict[str, Any]:
    """Train ``variant`` on ``task`` with ``seed`` for ``settings.steps`` steps, evaluate on the validation set
    (:func:`validation_set`) and the fixed test set; the result record (accuracy by difficulty, validation
    accuracy and loss, loss and accuracy curves, time) as :func:`deep_delta.tasks.study.run_task_study` stores
    it. A non-finite loss stops training there; the record names the step under ``"diverged"``."""
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
