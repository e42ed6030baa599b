"""The task metric through the real evaluation path (`tasks.evaluation.evaluate`): a hand-built oracle that answers
with the brute-force solver scores 100% at every difficulty level with a test loss near 0, an oracle that knows
only the easy levels scores 100% there and about chance above, and an untrained model scores about chance.
So the accuracy the study reports can be high, can be low, and is attributed to the right level."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_task_generators import SOLVERS

from deep_delta.experiments.settings import TaskSettings, model_config
from deep_delta.models import DDLForCausalLM
from deep_delta.tasks import IGNORE, TASKS, accuracy_by_difficulty, get_task
from deep_delta.tasks.evaluation import evaluate


class Oracle(torch.nn.Module):
    """Answers every scored position with the solver's token (logit 20, 0 elsewhere) when its level is at most
    ``max_level``; above it, a uniformly random token of the answer's role (a guess at chance)."""

    def __init__(self, task, max_level: int | None = None, seed: int = 0):
        super().__init__()
        self.task, self.max_level = task, max_level
        self.gen = np.random.default_rng(seed)
        self.answer_tokens = sorted({int(t) for t in task.test_set(0, 200).labels.ravel() if t != IGNORE})

    def forward(self, input_ids, shift_labels=None, use_cache=False):
        logits = torch.zeros(*input_ids.shape, self.task.vocab_size)
        for b, row in enumerate(input_ids.numpy()):
            for at, (answer, level) in SOLVERS[self.task.name](self.task, row).items():
                if self.max_level is not None and level > self.max_level:
                    answer = self.gen.choice(self.answer_tokens)
                logits[b, at, answer] = 20.0
        loss = F.cross_entropy(logits.flatten(0, 1), shift_labels.flatten(), ignore_index=IGNORE)
        return SimpleNamespace(logits=logits, loss=loss)


@pytest.mark.parametrize("name", list(TASKS))
def test_an_oracle_scores_100_percent_at_every_level(name):
    task = get_task(name)
    result = evaluate(Oracle(task), task, task.test_set(0, 400), torch.device("cpu"), batch_size=128)
    assert result["overall"] == 1.0
    assert {level: v["accuracy"] for level, v in result["by_difficulty"].items()} == {
        level: 1.0 for level in result["by_difficulty"]}
    assert len(result["by_difficulty"]) == len(task.levels)
    assert result["loss"] < 1e-6


@pytest.mark.parametrize("name", ["shell-game", "pointer-chase"])
def test_an_oracle_of_the_easy_levels_is_placed_at_those_levels(name):
    task = get_task(name)
    result = evaluate(Oracle(task, max_level=2), task, task.test_set(0, 1500), torch.device("cpu"))
    by_level = result["by_difficulty"]
    for level, v in by_level.items():
        if int(level) <= 2:
            assert v["accuracy"] == 1.0
        else:  # a uniform guess among the role's tokens: chance, within sampling noise
            assert abs(v["accuracy"] - task.chance) < 0.06, (level, v)
    assert task.chance < result["overall"] < 1.0


@pytest.mark.parametrize("name", list(TASKS))
def test_an_untrained_model_is_not_better_than_chance(name):
    task = get_task(name)
    settings = TaskSettings().with_values(model={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2})
    torch.manual_seed(0)
    model = DDLForCausalLM(model_config(task, "baseline", settings))
    result = evaluate(model, task, task.test_set(0, 300), torch.device("cpu"))
    # argmax over the whole vocabulary of an untrained model: a fixed guess at best, never a solution
    assert result["overall"] < 2 * task.chance
    assert result["loss"] > 0.5 * np.log(1 / task.chance)


def test_pointer_chase_shortcut_scores_what_cycle_lengths_predict(tmp_path):
    """Repeating the start symbol is right at hop j when the cycle through s has a length dividing j; that
    length is uniform on 1..16, so the expected accuracy at hop j is (divisors of j) / 16."""
    from deep_delta.experiments.task_report import summarize_tasks, task_table

    task = get_task("pointer-chase")
    test = task.test_set(0, 4000)
    predict = task.shortcuts()["repeat the start symbol"]
    got = accuracy_by_difficulty(predict(test.inputs), test.labels, test.difficulty, task.levels)
    for hop, v in got["by_difficulty"].items():
        expected = sum(1 for c in range(1, task.num_symbols + 1) if int(hop) % c == 0) / task.num_symbols
        assert abs(v["accuracy"] - expected) < 0.025, (hop, v["accuracy"], expected)
    # the study's table shows it beside the models; a task without shortcuts has no such row
    summary = summarize_tasks(task, ["baseline"], [0], {}, TaskSettings(test_size=300))
    assert "| shortcut: repeat the start symbol |" in task_table(summary)
    assert summarize_tasks(get_task("flip-flop"), ["baseline"], [0], {}, TaskSettings(test_size=300))["shortcuts"] == {}


def test_shell_game_shortcut_scores_the_chance_of_no_net_move():
    """The ball is back under its starting cup after t swaps with probability 1/c + (1 - 1/c) lam^t, where
    lam = 1 - 2 / (c - 1) is the second eigenvalue of one swap's transition matrix (1/2 at 5 cups)."""
    task = get_task("shell-game")
    test = task.test_set(0, 4000)
    predict = task.shortcuts()["the starting cup"]
    got = accuracy_by_difficulty(predict(test.inputs), test.labels, test.difficulty, task.levels)
    c = task.num_cups
    lam = 1 - 2 / (c - 1)
    for t, v in got["by_difficulty"].items():
        assert abs(v["accuracy"] - (1 / c + (1 - 1 / c) * lam ** int(t))) < 0.03, (t, v["accuracy"])


def test_recall_shortcut_is_the_best_guess_without_lookup():
    """A uniform guess among the most frequent unanswered values scores, in expectation, sum over queries of
    [answer among them] / (how many); the shortcut (ties to the lowest id) matches it and lies far above
    chance, and far below a lookup (100%)."""
    from collections import Counter

    task = get_task("recall")
    test = task.test_set(0, 2000)
    p = task.num_pairs
    expected = []
    for row in test.inputs:
        left = Counter(row[2:2 + 2 * p:2].tolist())
        for q in range(p):
            answer = int(row[3 + 2 * p + 2 * q])
            best = [v for v, c in left.items() if c == max(left.values())]
            expected.append((answer in best) / len(best))
            left[answer] -= 1
            left = +left  # drop values used up
    got = accuracy_by_difficulty(task.shortcuts()["most frequent unanswered value"](test.inputs), test.labels,
                                 test.difficulty, task.levels)
    assert abs(got["overall"] - np.mean(expected)) < 0.02
    assert 0.3 < got["overall"] < 0.55


def test_a_tie_with_the_baseline_reads_zero_not_minus_zero():
    from deep_delta.experiments.task_report import summarize_tasks, task_report

    task = get_task("flip-flop")
    levels = {str(lv): {"accuracy": 1.0, "correct": 1, "total": 1} for lv in task.levels}
    record = {"accuracy": {"overall": 1.0, "by_difficulty": levels}, "test_loss": 0.0, "train_s": 1.0,
              "parameters": 10, "diverged": None, "loss_curve": [[1, 0.1]], "accuracy_curve": []}
    results = {(v, s): record for v in ("baseline", "ddl-dv1") for s in (0, 1, 2)}
    summary = summarize_tasks(task, ["baseline", "ddl-dv1"], [0, 1, 2], results, TaskSettings(test_size=50))
    d = summary["rows"][1]["vs_baseline_pp"]
    assert d["mean"] == 0.0 and str(d["mean"]) == "0.0" and [str(x) for x in d["ci95"]] == ["0.0", "0.0"]
    assert "-0.0" not in task_report(summary)
