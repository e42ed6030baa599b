"""The mechanism task generators: deterministic per seed, labels equal to an independent brute-force solver's
answers at exactly the positions that matter, difficulty levels, and train / test disjoint by construction."""

import numpy as np
import pytest

from deep_delta.tasks import (
    BOS,
    IGNORE,
    NO_LEVEL,
    SEP,
    TASKS,
    accuracy_by_difficulty,
    data_rng,
    get_task,
    sequence_hash,
    split_of,
)

NAMES = list(TASKS)


# ---------------------------------------------------------------------- brute-force solvers, token by token
def solve_shell_game(task, row):
    """{position: (answer token, level)}: replay the swaps on an explicit list of cups."""
    cup0 = task.roles["cups"].start
    assert row[0] == BOS and row[2] == SEP
    cups = [False] * task.num_cups
    cups[row[1] - cup0] = True
    answers = {}
    for t in range(task.num_swaps):
        i, j = row[3 + 2 * t] - cup0, row[4 + 2 * t] - cup0
        assert i != j
        cups[i], cups[j] = cups[j], cups[i]
        answers[4 + 2 * t] = (cup0 + cups.index(True), t + 1)
    return answers


def solve_pointer_chase(task, row):
    """Read the pairs into a dict (each x once: a permutation), then follow it from s once per H."""
    k, sym0 = task.num_symbols, task.roles["symbols"].start
    pairs = [(int(row[1 + 2 * i]), int(row[2 + 2 * i])) for i in range(k)]
    f = dict(pairs)
    assert sorted(f) == sorted(f.values()) == list(range(sym0, sym0 + k))
    assert row[1 + 2 * k] == SEP
    cur, answers = int(row[2 + 2 * k]), {}
    first = 2 + 2 * k if task.first_answer == "start" else 3 + 2 * k  # s, or the first H
    for j in range(task.num_hops):
        cur = f[cur]
        answers[first + j] = (cur, j + 1)
    return answers


def solve_recall(task, row):
    p = task.num_pairs
    shown = [(int(row[1 + 2 * i]), int(row[2 + 2 * i])) for i in range(p)]
    keys = [key for key, _ in shown]
    assert len(set(keys)) == p and row[1 + 2 * p] == SEP
    answers = {}
    for q in range(p):
        at = 2 + 2 * p + 2 * q
        key = int(row[at])
        answers[at] = (dict(shown)[key], keys.index(key) + 1)
        assert row[at + 1] == dict(shown)[key]  # the answer is shown after the query
    return answers


def solve_flip_flop(task, row):
    ins0, bit0 = task.roles["instructions"].start, task.roles["bits"].start
    write, ignore, read = ins0, ins0 + 1, ins0 + 2
    answers, last_bit, last_at = {}, None, None
    for t in range(task.num_instructions):
        op, bit = int(row[1 + 2 * t]), int(row[2 + 2 * t])
        assert op in (write, ignore, read) and bit in (bit0, bit0 + 1)
        if op == read:
            distance = t - last_at
            level = 1 + sum(distance >= edge for edge in task.edges[1:])
            answers[1 + 2 * t] = (last_bit, level)
            assert bit == last_bit
        elif op == write:
            last_bit, last_at = bit, t
    return answers


SOLVERS = {"shell-game": solve_shell_game, "pointer-chase": solve_pointer_chase, "recall": solve_recall,
           "flip-flop": solve_flip_flop}


@pytest.mark.parametrize("name, params", [(n, {}) for n in NAMES] + [("pointer-chase", {"first_answer": "start"})])
@pytest.mark.parametrize("split", ["train", "test"])
def test_labels_match_brute_force_only_where_they_matter(name, params, split):
    task = get_task(name, **params)
    batch = task.generate(data_rng(3, split), 300, split)
    assert batch.inputs.shape == (300, task.seq_len) and batch.inputs.dtype == np.int64
    assert batch.inputs.min() >= 0 and batch.inputs.max() < task.vocab_size
    for row, labels, levels in zip(batch.inputs, batch.labels, batch.difficulty):
        answers = SOLVERS[name](task, row)
        assert sorted(np.nonzero(labels != IGNORE)[0].tolist()) == sorted(answers)
        assert (levels != NO_LEVEL).tolist() == (labels != IGNORE).tolist()
        for at, (answer, level) in answers.items():
            assert labels[at] == answer and levels[at] == level


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_per_seed(name):
    task = get_task(name)
    a, b = task.generate(data_rng(7, "x"), 64), task.generate(data_rng(7, "x"), 64)
    c = task.generate(data_rng(8, "x"), 64)
    for field in ("inputs", "labels", "difficulty"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.inputs, c.inputs)
    assert np.array_equal(task.test_set(5, 100).inputs, task.test_set(5, 100).inputs)


@pytest.mark.parametrize("name", NAMES)
def test_train_and_test_are_disjoint(name):
    task = get_task(name)
    test = task.test_set(1234, 400)
    train = task.generate(data_rng(0, f"{task.name}/train"), 3000, "train")
    assert all(split_of(row) == "test" for row in test.inputs)
    assert all(split_of(row) == "train" for row in train.inputs)
    assert not {sequence_hash(r) for r in test.inputs} & {sequence_hash(r) for r in train.inputs}
    # the hash split is what keeps them apart: the raw distribution does draw test sequences
    raw = task.sample(data_rng(0, "raw"), 800, "train")
    assert 0 < sum(split_of(row) == "test" for row in raw.inputs) < 800


@pytest.mark.parametrize("name", NAMES)
def test_every_level_is_in_the_test_set(name):
    task = get_task(name)
    test = task.test_set(1234, 400)
    scored = test.difficulty[test.labels != IGNORE]
    assert set(scored.tolist()) == set(task.levels)
    assert len(task.level_names) == len(task.levels)


def test_flip_flop_is_sparser_at_test():
    task = get_task("flip-flop")
    ignore = task.roles["instructions"].start + 1
    for split, p in (("train", 0.8), ("test", 0.98)):
        ops = task.generate(data_rng(0, split), 2000, split).inputs[:, 3:-2:2]  # between the first and last
        assert abs((ops == ignore).mean() - p) < 0.01, split
    edges = task.edges
    assert edges[0] == 1 and task.bucket(np.array([1, edges[1] - 1, edges[1], task.num_instructions - 1])).tolist() \
        == [1, 1, 2, len(edges)]


def test_shapes_and_chance_of_the_issue():
    shell, chase, recall = get_task("shell-game"), get_task("pointer-chase"), get_task("recall")
    assert (shell.num_cups, shell.levels, shell.chance) == (5, tuple(range(1, 9)), 0.2)
    assert (chase.num_symbols, chase.levels, chase.seq_len) == (16, (1, 2, 3, 4, 5), 40)
    assert recall.num_pairs == 8 and recall.seq_len <= 40
    assert get_task("flip-flop").test_ignore == 0.98


def test_bad_task_and_parameters_are_refused():
    with pytest.raises(ValueError, match=r"`task` got 'nope'; allowed: shell-game \| pointer-chase"):
        get_task("nope")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['cups'\]; allowed: \['num_cups', 'num_swaps'\]"):
        get_task("shell-game", cups=3)
    with pytest.raises(ValueError, match=r"`num_swaps` got 0; allowed: an integer >= 1"):
        get_task("shell-game", num_swaps=0)
    with pytest.raises(ValueError, match=r"`test_ignore` got 1.0; allowed: a probability"):
        get_task("flip-flop", test_ignore=1.0)
    with pytest.raises(ValueError, match=r"`first_answer` got 'end'; allowed: 'hop' \| 'start'"):
        get_task("pointer-chase", first_answer="end")


def test_the_metric_can_fail():
    task = get_task("shell-game")
    test = task.test_set(0, 500)
    perfect = accuracy_by_difficulty(test.labels, test.labels, test.difficulty, task.levels)
    assert perfect["overall"] == 1.0
    assert all(v["accuracy"] == 1.0 for v in perfect["by_difficulty"].values())
    cup0 = task.roles["cups"].start
    wrong = np.where(test.labels != IGNORE, cup0 + (test.labels - cup0 + 1) % task.num_cups, test.labels)
    assert accuracy_by_difficulty(wrong, test.labels, test.difficulty, task.levels)["overall"] == 0.0
    guess = data_rng(0, "guess").integers(cup0, cup0 + task.num_cups, test.labels.shape)
    got = accuracy_by_difficulty(guess, test.labels, test.difficulty, task.levels)
    assert abs(got["overall"] - task.chance) < 0.04
    # unscored positions do not count, whatever is predicted there
    noisy = np.where(test.labels == IGNORE, 0, test.labels)
    assert accuracy_by_difficulty(noisy, test.labels, test.difficulty, task.levels)["overall"] == 1.0
