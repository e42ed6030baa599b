"""The residual designs of issue 56 (Peri-LN, Full and Block AttnRes, the untied gates) through the same commands as
every other variant: ``ddl compare`` (rows, its timing of each step in the same process), ``ddl analyze`` (the
depth weights, both gates), ``ddl tasks run``, ``ddl train`` then ``ddl export`` and ``ddl generate`` (greedy, with
and without the cache, compiled). The model-level tests (values, caches, compile, export round trip) are the
parametrised tests over every variant in tests/models and tests/hf."""

from __future__ import annotations

import json

import pytest

from deep_delta.cli.main import main
from deep_delta.variants import paper_name

NEW = ["peri-ln", "attnres", "attnres-block", "ddl-cc-untied"]
TINY = ["--config", "debug/baseline", "--steps", "2", "--eval-every", "2", "--eval-batches", "1", "--threads", "1",
        "--no-progress"]


def test_compare_and_analyze_take_the_new_designs(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--variants", "baseline", *NEW, "--time-repeats", "1", "--out", str(out)]) == 0
    table = (out / "compare.md").read_text()
    for v in NEW:
        assert f"| {paper_name(v)} | {v} |" in table
    timing = json.loads((out / "compare.json").read_text())["timing"]["step_time_s"]
    assert set(timing) == {"baseline", *NEW} and all(t > 0 for t in timing.values())
    capsys.readouterr()
    assert main(["analyze", "--model", str(out / "attnres-block"), "--out", str(tmp_path / "a1"), "--batches", "1"]) == 0
    assert "| sublayer | sources | on the embedding |" in (tmp_path / "a1" / "analysis.md").read_text()
    assert main(["analyze", "--model", str(out / "ddl-cc-untied"), "--out", str(tmp_path / "a2"), "--batches", "1"]) == 0
    assert "| sublayer | erase gate mean | write gate mean |" in (tmp_path / "a2" / "analysis.md").read_text()
    assert main(["analyze", "--model", str(out / "peri-ln"), "--out", str(tmp_path / "a3"), "--batches", "1"]) == 0
    assert "| sublayer | state norm entering |" in (tmp_path / "a3" / "analysis.md").read_text()


def test_tasks_take_the_new_designs(tmp_path):
    micro = ["--steps", "2", "--threads", "1", "--no-progress", "--set", "test_size=16", "--set", "eval_size=8",
             "--set", "eval_every=2", "--set", "batch_size=4", "--set", "model.hidden_size=32",
             "--set", "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2"]
    assert main(["tasks", "run", "flip-flop", "--variants", "peri-ln", "attnres-block", "ddl-cc-untied", "--seeds", "1",
                 "--out", str(tmp_path), *micro]) == 0
    table = (tmp_path / "tasks.md").read_text()
    assert all(paper_name(v) in table for v in ("peri-ln", "attnres-block", "ddl-cc-untied"))


@pytest.mark.parametrize("variant", ["attnres-block", "ddl-cc-untied", "peri-ln"])
def test_train_export_and_generate(tmp_path, capsys, variant):
    run, exported = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--config", f"debug/{variant}", "--steps", "2", "--threads", "1", "--no-progress",
                 "--out", str(run)]) == 0
    assert main(["export", "--model", str(run), "--out", str(exported)]) == 0
    assert json.loads((exported / "config.json").read_text())["variant"] == variant
    texts = []
    for extra in ([], ["--no-cache"], ["--compile"]):
        capsys.readouterr()
        assert main(["generate", "--model", str(exported), "--prompt", "The ", "--max-new-tokens", "6", "--greedy",
                     "--threads", "1", *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] == texts[2] and texts[0].strip()
