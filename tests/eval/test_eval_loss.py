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
