"""How a model trained on a mechanism task is measured: greedy accuracy by difficulty and the test loss
(:func:`evaluate`), on the fixed test set (``Task.test_set``) or on the validation set an lr grid chooses on
(:func:`validation_set`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from deep_delta.tasks import IGNORE, Batch, Task, accuracy_by_difficulty, data_rng


def evaluate(model, task: Task, test: Batch, device, batch_size: int = 500) -> dict[str, Any]:
    """Greedy (argmax over the whole vocabulary) accuracy on ``test`` by difficulty, and the mean test loss
    (nats) at the scored positions: :func:`accuracy_by_difficulty` plus ``"loss"``."""
    import torch

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


def validation_set(task: Task, test_seed: int, size: int) -> Batch:
    """``size`` held-out sequences of the train split (never a test sequence), from a stream of their own
    (``test_seed``, "validation"), not the training stream: what an lr grid chooses on."""
    return task.generate(data_rng(test_seed, f"{task.name}/validation"), size, "train")
