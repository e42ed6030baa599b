"""`ddl eval loss`: validation loss and perplexity on a token split."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from eval_helpers import make_byte_data, make_run

from deep_delta.cli.main import main
from deep_delta.data import open_shard
from deep_delta.eval import evaluate_loss
from helpers import tiny_model


def _reference_loss(model, data_dir, seq_len: int, max_windows: int | None = None,
                    spread: bool = False) -> tuple[float, int]:
    """Plain reference: the val tokens cut into windows of T+1 (stride T), all windows in one forward; with
    ``max_windows``, that many: the first ones, or (``spread``) windows floor(i * W / N)."""
    tokens = np.concatenate([np.asarray(open_shard(p)) for p in sorted(data_dir.glob("val_*.bin"))]).astype(np.int64)
    total = (len(tokens) - 1) // seq_len
    n = total if max_windows is None else min(total, max_windows)
    picked = [i * total // n for i in range(n)] if spread else range(n)
    w = torch.stack([torch.from_numpy(tokens[i * seq_len : i * seq_len + seq_len + 1]) for i in picked])
    with torch.no_grad():
        logits = model(w[:, :-1], use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), w[:, 1:].reshape(-1))
    return loss.item(), n * seq_len


def test_loss_matches_reference_and_ignores_batching(tmp_path):
    data = make_byte_data(tmp_path / "data")
    model = tiny_model("ddl-tc")
    ref, count = _reference_loss(model, data, 32)
    for bs in (1, 7):
        res = evaluate_loss(model, data, batch_size=bs, seq_len=32)
        assert res.tokens == count
        assert res.loss == pytest.approx(ref, rel=1e-5)
        assert res.perplexity == pytest.approx(math.exp(ref), rel=1e-5)
    capped = evaluate_loss(model, data, batch_size=2, seq_len=32, max_batches=2)
    assert capped.batches == 2 and capped.tokens == 4 * 32 and "spread evenly" in capped.windows
    assert capped.loss == pytest.approx(_reference_loss(model, data, 32, max_windows=4, spread=True)[0], rel=1e-5)
    first = evaluate_loss(model, data, batch_size=2, seq_len=32, max_batches=2, eval_windows="first")
    assert first.tokens == 4 * 32 and "the first ones" in first.windows
    assert first.loss == pytest.approx(_reference_loss(model, data, 32, max_windows=4)[0], rel=1e-5)
    assert first.loss != capped.loss
    assert not model.training


def test_loss_errors(tmp_path):
    data = make_byte_data(tmp_path / "data")
    model = tiny_model()
    with pytest.raises(ValueError, match=r"`seq_len` got 65; allowed: 1..64"):
        evaluate_loss(model, data, seq_len=65)
    with pytest.raises(FileNotFoundError, match="no 'test' shards"):
        evaluate_loss(model, data, split="test", seq_len=16)


def test_ddl_eval_loss_cli(tmp_path, capsys):
    data = make_byte_data(tmp_path / "data")
    run, model = make_run(tmp_path / "run")
    assert main(["eval", "loss", "--model", str(run), "--data", str(data), "--batch-size", "4", "--seq-len", "32",
                 "--max-batches", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == 8 * 32
    assert got["loss"] == pytest.approx(_reference_loss(model, data, 32, max_windows=8, spread=True)[0], rel=1e-5)
    assert main(["eval", "loss", "--model", str(run), "--data", str(data), "--batch-size", "4", "--seq-len", "32",
                 "--max-batches", "2", "--eval-windows", "first", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["loss"] == pytest.approx(_reference_loss(model, data, 32, max_windows=8)[0], rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]), rel=1e-9)
    assert main(["eval", "loss", "--model", str(run), "--data", str(data), "--max-batches", "1"]) == 0
    out = capsys.readouterr().out
    assert "val loss" in out and "perplexity" in out
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "tokenizer": "gpt2"}))
    assert main(["eval", "loss", "--model", str(run), "--data", str(data)]) == 2
    assert "tokenized with 'gpt2', but the model was trained with 'byte'" in capsys.readouterr().err


def _two_sources(root):
    """Byte data of two named sources: documents of English (``prose``) then of reversed English (``backwards``)."""
    from pydoc_data.topics import topics

    from deep_delta.data import ByteTokenizer, write_dataset

    texts = [topics[k][:600] for k in sorted(topics)[:12]]
    docs = texts[:6] + [t[::-1] for t in texts[6:]]
    write_dataset(docs, ByteTokenizer(), root, val_fraction=0.3, sources=[("prose", 6), ("backwards", 6)])
    return root


def test_the_loss_per_source_is_each_sources_own_loss(tmp_path):
    from deep_delta.data import TokenLoader, read_meta

    data = _two_sources(tmp_path / "data")
    model = tiny_model("ddl-tc")
    runs = read_meta(data)["splits"]["val"]["sources"]
    assert [name for _, name in runs] == ["prose", "backwards"]
    res = evaluate_loss(model, data, batch_size=3, seq_len=32, by_source=True)
    plain = evaluate_loss(model, data, batch_size=3, seq_len=32)
    assert res.loss == plain.loss and res.tokens == plain.tokens and plain.sources is None  # the plain path unchanged
    # by hand: every window's tokens, each target token given to the source whose run holds its position
    tokens = np.concatenate([np.asarray(open_shard(p)) for p in sorted(data.glob("val_*.bin"))]).astype(np.int64)
    n = TokenLoader(data, "val", 3, 32).num_windows
    w = torch.stack([torch.from_numpy(tokens[i * 32 : i * 32 + 33]) for i in range(n)])
    with torch.no_grad():
        logits = model(w[:, :-1], use_cache=False).logits
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), w[:, 1:].reshape(-1), reduction="none")
    positions = (torch.arange(n)[:, None] * 32 + 1 + torch.arange(32)).reshape(-1)
    boundary = runs[1][0]
    by_hand = {"prose": losses[positions < boundary], "backwards": losses[positions >= boundary]}
    assert set(res.sources) == {"prose", "backwards"}
    for name, x in by_hand.items():
        assert res.sources[name]["tokens"] == len(x)
        assert res.sources[name]["loss"] == pytest.approx(x.mean().item(), rel=1e-5)
    assert sum(s["tokens"] for s in res.sources.values()) == res.tokens
    assert res.sources["backwards"]["loss"] != pytest.approx(res.sources["prose"]["loss"], rel=1e-3)


def test_ddl_eval_loss_by_source(tmp_path, capsys):
    data = _two_sources(tmp_path / "data")
    run, _ = make_run(tmp_path / "run")
    assert main(["eval", "loss", "--model", str(run), "--data", str(data), "--seq-len", "32", "--by-source"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("prose", "backwards"))]
    assert [r[0] for r in rows] == ["prose", "backwards"] and "source" in out and "tokens" in out
    assert main(["eval", "loss", "--model", str(run), "--data", str(data), "--seq-len", "32", "--by-source",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got["sources"]) == ["prose", "backwards"] and got["sources_note"] is None
    plain = make_byte_data(tmp_path / "plain")
    assert main(["eval", "loss", "--model", str(run), "--data", str(plain), "--seq-len", "32", "--by-source"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("no loss per source")]
    assert said == [f"no loss per source: split val of {plain} records no sources (its source (python iterable) "
                    "names no sources)"]
