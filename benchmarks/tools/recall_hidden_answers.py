"""Probe for issue 26 item 3: associative recall with the answers after each query hidden.

``ddl tasks run recall`` shows each query's answer after it (teacher forcing), and every model trained so far
settles on "the most frequent value not yet answered" (docs/tasks.md). Here the answer slots are replaced by
SEP, so that shortcut is gone: a model must look the key up or guess among the values shown. One baseline run
(seed 0, the task recipe's defaults: d = 64, 4 layers, batch 32, lr 2e-3) through the package's own
``tasks.training.train_one``; prints the test accuracy by pair position.

    PYTHONPATH=src .venv/bin/python benchmarks/tools/recall_hidden_answers.py --pairs 2 --steps 3000
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from deep_delta.experiments.settings import TaskSettings
from deep_delta.experiments.task_runs import train_one
from deep_delta.tasks.base import SEP
from deep_delta.tasks.recall import AssociativeRecall


@dataclasses.dataclass(frozen=True)
class HiddenAnswers(AssociativeRecall):
    """Recall with SEP in place of the answer that follows each query (labels unchanged)."""

    def sample(self, rng, n, split="train"):
        batch = super().sample(rng, n, split)
        batch.inputs[:, 2 + 2 * self.num_pairs + 1::2] = SEP
        return batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    torch.set_num_threads(1)
    task = HiddenAnswers(num_pairs=args.pairs)
    record = train_one(task, "baseline", 0, TaskSettings().with_assignments([f"steps={args.steps}"]), device="cpu",
                       progress=False)
    acc = record["accuracy"]
    print(f"{args.pairs} pairs, {args.steps} steps: test accuracy {acc['overall']:.4f} (chance {task.chance:.4f}), "
          f"test loss {record['test_loss']:.4f}; by pair position "
          + ", ".join(f"{k}: {v['accuracy']:.3f}" for k, v in acc["by_difficulty"].items()))


if __name__ == "__main__":
    main()
