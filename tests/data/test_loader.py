import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_delta.data import ShardError, TokenLoader, write_shard


def make_dir(tmp_path, sizes=(1000, 537, 20), split="train", vocab=300, seed=0):
    """Shards of a random stream; returns (dir, the concatenated stream)."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, n in enumerate(sizes):
        tokens = rng.integers(0, vocab, size=n)
        write_shard(tmp_path / f"{split}_{i:06d}.bin", tokens)
        parts.append(tokens)
    return tmp_path, np.concatenate(parts)


def test_batches_are_windows_of_the_stream(tmp_path):
    d, stream = make_dir(tmp_path)
    T = 16
    loader = TokenLoader(d, "train", batch_size=5, seq_len=T, seed=3)
    assert loader.num_tokens == len(stream) and loader.num_windows == (len(stream) - 1) // T
    seen = []
    for _ in range(loader.num_windows // 5):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (5, T) and x.dtype == y.dtype == torch.int64
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            start = np.flatnonzero([np.array_equal(stream[i * T : i * T + T], row_x) for i in range(loader.num_windows)])
            assert len(start) >= 1
            i = int(start[0])
            np.testing.assert_array_equal(row_y, stream[i * T + 1 : i * T + T + 1])
            seen.append(i)
    # one epoch is a permutation: no window repeats within it
    assert len(set(seen)) == len(seen)


def test_window_crossing_shards(tmp_path):
    d, stream = make_dir(tmp_path, sizes=(10, 0, 3, 30, 0))
    loader = TokenLoader(d, "train", batch_size=1, seq_len=6)
    x, y = loader._batch(range(loader.num_windows))
    for i in range(loader.num_windows):
        np.testing.assert_array_equal(x[i].numpy(), stream[6 * i : 6 * i + 6])
        np.testing.assert_array_equal(y[i].numpy(), stream[6 * i + 1 : 6 * i + 7])


def test_determinism_and_seed(tmp_path):
    d, _ = make_dir(tmp_path)
    a = TokenLoader(d, "train", 4, 8, seed=1)
    b = TokenLoader(d, "train", 4, 8, seed=1)
    c = TokenLoader(d, "train", 4, 8, seed=2)
    xa = [a.next_batch()[0] for _ in range(5)]
    xb = [b.next_batch()[0] for _ in range(5)]
    xc = [c.next_batch()[0] for _ in range(5)]
    assert all(torch.equal(p, q) for p, q in zip(xa, xb))
    assert not all(torch.equal(p, q) for p, q in zip(xa, xc))


@pytest.mark.parametrize("steps_before", [0, 3, 50, 61])
def test_resume_matches_uninterrupted(tmp_path, steps_before):
    d, _ = make_dir(tmp_path)
    B, T = 7, 8  # 194 windows: epochs end mid-batch, so resume crosses epoch boundaries
    ref = TokenLoader(d, "train", B, T, seed=5)
    ref_batches = [ref.next_batch() for _ in range(80)]
    run = TokenLoader(d, "train", B, T, seed=5)
    for _ in range(steps_before):
        run.next_batch()
    state = json.loads(json.dumps(run.state_dict()))
    resumed = TokenLoader(d, "train", B, T, seed=5)
    resumed.load_state_dict(state)
    for k in range(steps_before, 80):
        x, y = resumed.next_batch()
        assert torch.equal(x, ref_batches[k][0]) and torch.equal(y, ref_batches[k][1])
    assert ref.epoch >= 2


def test_ranks_are_disjoint_and_stack_to_single_process(tmp_path):
    d, _ = make_dir(tmp_path)
    W, B, T = 3, 4, 8
    single = TokenLoader(d, "train", B * W, T, seed=9)
    ranks = [TokenLoader(d, "train", B, T, seed=9, rank=r, world_size=W) for r in range(W)]
    for _ in range(6):
        xs = [r.next_batch()[0] for r in ranks]
        rows = [tuple(row.tolist()) for x in xs for row in x]
        per_rank = [{tuple(row.tolist()) for row in x} for x in xs]
        for i in range(W):
            for j in range(i + 1, W):
                assert not per_rank[i] & per_rank[j]
        assert torch.equal(torch.cat(xs), single.next_batch()[0])
        assert len(rows) == B * W


def test_resume_with_other_world_size(tmp_path):
    d, _ = make_dir(tmp_path)
    single = TokenLoader(d, "train", 6, 8, seed=0)
    for _ in range(3):
        single.next_batch()
    state = single.state_dict()
    expect = single.next_batch()[0]
    ranks = [TokenLoader(d, "train", 3, 8, seed=0, rank=r, world_size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    assert torch.equal(torch.cat([r.next_batch()[0] for r in ranks]), expect)


def test_load_state_dict_rejects_other_data(tmp_path):
    d, _ = make_dir(tmp_path)
    state = TokenLoader(d, "train", 2, 8).state_dict()
    with pytest.raises(ValueError, match="saved seq_len=8 but this loader has seq_len=9"):
        TokenLoader(d, "train", 2, 9).load_state_dict(state)
    with pytest.raises(ValueError, match="missing key 'position'"):
        TokenLoader(d, "train", 2, 8).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="position must be an integer in"):
        TokenLoader(d, "train", 2, 8).load_state_dict({"epoch": 0, "position": 10**9})


def test_eval_batches_cover_split_in_order(tmp_path):
    d, stream = make_dir(tmp_path, sizes=(200,))
    T = 10  # 19 windows
    loader = TokenLoader(d, "train", 4, T)
    before = loader.state_dict()
    xs = [x for x, _ in loader.eval_batches()]
    assert [len(x) for x in xs] == [4, 4, 4, 4, 3]
    flat = torch.cat(xs).flatten().numpy()
    np.testing.assert_array_equal(flat, stream[: 19 * T])
    assert loader.state_dict() == before
    assert loader.num_eval_batches() == 5 and loader.num_eval_batches(2) == 2
    assert len(list(loader.eval_batches(max_batches=2))) == 2
    # two ranks: disjoint, same row counts, together everything but at most W-1 windows
    r = [list(TokenLoader(d, "train", 4, T, rank=i, world_size=2).eval_batches()) for i in range(2)]
    assert [len(x) for x, _ in r[0]] == [len(x) for x, _ in r[1]] == [4, 4, 1]
    rows = {tuple(row.tolist()) for b in r for x, _ in b for row in x}
    assert len(rows) == 18


def _two_halves(tmp_path, T=8, windows=40):
    """A split whose first half is token 1 and second half token 2 (``windows`` windows of ``T``)."""
    n = windows * T + 1
    tokens = np.where(np.arange(n) < n // 2, 1, 2)
    write_shard(tmp_path / "val_000000.bin", tokens)
    return tmp_path


def test_spread_windows_reach_the_whole_split_and_first_windows_its_start(tmp_path):
    d = _two_halves(tmp_path)
    loader = TokenLoader(d, "val", 4, 8)
    spread = torch.cat([x for x, _ in loader.eval_batches(max_batches=2)])
    first = torch.cat([x for x, _ in loader.eval_batches(max_batches=2, windows="first")])
    assert spread.shape == first.shape == (8, 8)
    assert set(spread.unique().tolist()) == {1, 2}  # both halves evaluated
    assert (spread[:4] == 1).all() and (spread[4:] == 2).all()  # in stream order
    assert set(first.unique().tolist()) == {1}  # only the first half
    # the windows are floor(i * W / N): 0, 5, 10, ..., 35 of 40
    stream = np.fromfile(d / "val_000000.bin", dtype="<u2", offset=1024)
    for i, row in enumerate(spread.numpy()):
        np.testing.assert_array_equal(row, stream[5 * i * 8 : 5 * i * 8 + 8])


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("max_batches", [None, 5, 6, 100])
def test_both_plans_give_the_same_batches_when_the_whole_split_is_read(tmp_path, world_size, max_batches):
    d, _ = make_dir(tmp_path, sizes=(200,))
    T = 10  # 19 windows: 5 steps of 4 (one process), 3 of 8 (two), 2 of 12 (three)
    for rank in range(world_size):
        loader = TokenLoader(d, "train", 4, T, rank=rank, world_size=world_size)
        if max_batches is not None and max_batches * 4 * world_size < loader.num_windows:
            continue  # part of the split: the plans differ
        a = list(loader.eval_batches(max_batches))
        b = list(loader.eval_batches(max_batches, windows="first"))
        assert len(a) == len(b) == loader.num_eval_batches(max_batches)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_eval_windows_are_even_and_refuse_an_unknown_plan():
    from deep_delta.data.loader import eval_windows

    assert eval_windows(10, 4, "spread").tolist() == [0, 2, 5, 7]
    assert eval_windows(10, 4, "first").tolist() == [0, 1, 2, 3]
    assert eval_windows(10, 99, "spread").tolist() == list(range(10))
    big = eval_windows(10**12, 7, "spread")
    assert big.tolist() == [i * 10**12 // 7 for i in range(7)]
    with pytest.raises(ValueError, match="`windows` got 'middle'; allowed: spread | first"):
        eval_windows(10, 4, "middle")


def test_spread_evaluation_is_split_between_ranks_as_one_process_reads_it(tmp_path):
    d = _two_halves(tmp_path, windows=41)
    whole = torch.cat([x for x, _ in TokenLoader(d, "val", 6, 8).eval_batches(max_batches=2)])
    parts = [list(TokenLoader(d, "val", 3, 8, rank=r, world_size=2).eval_batches(max_batches=2)) for r in range(2)]
    stacked = torch.cat([torch.cat([parts[0][i][0], parts[1][i][0]]) for i in range(2)])
    assert torch.equal(whole, stacked)


def test_vocab_check_names_shard_and_ids(tmp_path):
    write_shard(tmp_path / "train_000000.bin", [1, 2, 3] * 10)
    write_shard(tmp_path / "train_000001.bin", [1, 2, 300] * 10)
    TokenLoader(tmp_path, "train", 1, 4, vocab_size=301)
    with pytest.raises(ShardError, match=r"train_000001\.bin holds token id 300, but the model's vocabulary has 257"):
        TokenLoader(tmp_path, "train", 1, 4, vocab_size=257)


def test_too_few_tokens(tmp_path):
    write_shard(tmp_path / "val_000000.bin", [1] * 16)
    with pytest.raises(ValueError, match="has 16 tokens, fewer than seq_len \\+ 1 = 17"):
        TokenLoader(tmp_path, "val", 1, 16)
    TokenLoader(tmp_path, "val", 1, 15)


def test_missing_split_and_dir(tmp_path):
    write_shard(tmp_path / "train_000000.bin", [1] * 16)
    with pytest.raises(FileNotFoundError, match="no 'val' shards .* splits found: train"):
        TokenLoader(tmp_path, "val", 1, 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TokenLoader(tmp_path / "nope", "train", 1, 4)


def test_corrupted_shard_is_reported(tmp_path):
    d, _ = make_dir(tmp_path)
    path = d / "train_000001.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ShardError, match=r"train_000001\.bin is truncated"):
        TokenLoader(d, "train", 1, 4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"seq_len": 2.5}, "seq_len must be an integer >= 1, got 2.5"),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size=2\), got 2"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"split": "../x"}, "split must be a name"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    make_dir(tmp_path)
    args = {"split": "train", "batch_size": 2, "seq_len": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        TokenLoader(tmp_path, args.pop("split"), args.pop("batch_size"), args.pop("seq_len"), **args)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4).filter(lambda s: sum(s) >= 12),
    seq_len=st.integers(1, 11),
    batch=st.integers(1, 5),
    world=st.integers(1, 3),
    before=st.integers(0, 12),
    seed=st.integers(0, 2**32),
)
def test_property_ranks_and_resume(tmp_path_factory, sizes, seq_len, batch, world, before, seed):
    d, _ = make_dir(tmp_path_factory.mktemp("p"), sizes=sizes, seed=seed % 7)
    single = TokenLoader(d, "train", batch * world, seq_len, seed=seed)
    ranks = [TokenLoader(d, "train", batch, seq_len, seed=seed, rank=r, world_size=world) for r in range(world)]
    for _ in range(before):
        stacked = torch.cat([r.next_batch()[1] for r in ranks])
        assert torch.equal(stacked, single.next_batch()[1])
    resumed = TokenLoader(d, "train", batch * world, seq_len, seed=seed)
    resumed.load_state_dict(json.loads(json.dumps(ranks[0].state_dict())))
    for _ in range(3):
        x, y = resumed.next_batch()
        assert torch.equal(x, single.next_batch()[0])
        assert torch.equal(x[:, 1:], y[:, :-1])


def _prepared_with_a_bad_last_shard(tmp_path):
    """A prepared byte-level directory (shard records in meta.json) whose last train shard had one token changed
    to 300 after preparation (the byte tokenizer has 257 ids); its size and header are unchanged."""
    from deep_delta.data import ByteTokenizer, write_dataset
    from deep_delta.data.shards import HEADER_BYTES

    d = tmp_path / "data"
    write_dataset(["a document of plain text. " * 60 for _ in range(4)], ByteTokenizer(), d, val_fraction=0.25,
                  shard_tokens=1000)
    last = sorted(d.glob("train_*.bin"))[-1]
    raw = bytearray(last.read_bytes())
    raw[HEADER_BYTES + 10: HEADER_BYTES + 12] = np.array([300], dtype="<u2").tobytes()
    last.write_bytes(bytes(raw))
    return d, last


def test_a_shard_changed_after_preparation_is_named_when_it_is_mapped(tmp_path):
    """Before: the loader trusted meta.json's largest id and never checked the tokens it mapped (an IndexError in
    the embedding, or nothing at all when no batch reached the shard)."""
    d, last = _prepared_with_a_bad_last_shard(tmp_path)
    loader = TokenLoader(d, "train", 2, 16, vocab_size=257)  # a fast start: only headers are read here
    loader.check_tokens_in_background()
    with pytest.raises(ShardError, match=rf"{last.name} holds token id 300, but the model's vocabulary has 257"):
        loader.wait_for_token_check()
    with pytest.raises(ShardError, match=last.name):  # and the next batch does not pretend otherwise
        loader.next_batch()
    every = TokenLoader(d, "train", 2, 16, vocab_size=257)  # mapped by a batch: the same check, once per shard
    with pytest.raises(ShardError, match=last.name):
        for _ in range(every.num_windows):
            every.next_batch()


def test_a_short_training_run_names_a_changed_shard_it_never_reads(tmp_path, capsys):
    from deep_delta.cli.main import main

    d, last = _prepared_with_a_bad_last_shard(tmp_path)
    code = main(["train", "--variant", "baseline", "--preset", "tiny", "--data", str(d), "--out", str(tmp_path / "r"),
                 "--steps", "1", "--batch-size", "1", "--seq-len", "16", "--eval-every", "0", "--device", "cpu",
                 "--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
                 "model.num_attention_heads=2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"{last} holds token id 300" in err and "Traceback" not in err
