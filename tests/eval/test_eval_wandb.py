"""``ddl eval lm-eval --wandb``: the results table in an offline W&B run, read back from its files."""

from __future__ import annotations

import json

from eval_helpers import make_run
from test_eval_harness import _write_task, offline  # noqa: F401 (offline: the fixture)

from deep_delta.cli.main import main


def test_lm_eval_logs_its_results_table(tmp_path, offline, wandb_offline):  # noqa: F811
    tasks_dir = _write_task(tmp_path / "toy")
    run, _ = make_run(tmp_path / "run", variant="ddl-cc", max_position_embeddings=128)
    out = tmp_path / "res" / "table.md"
    assert main(["eval", "lm-eval", "--model", str(run), "--name", "toy-cc", "--tasks", "ddl_toy_mc",
                 "--include-path", str(tasks_dir), "--num-fewshot", "0", "--batch-size", "4", "--device", "cpu",
                 "--out", str(out), "--wandb", "--wandb-project", "eval-tests"]) == 0
    raw = json.loads(out.with_suffix(".json").read_text())["toy-cc"]["0"]["results"]["ddl_toy_mc"]
    [logged] = wandb_offline.runs()
    assert (logged["name"], logged["job_type"], logged["project"]) == ("lm-eval", "eval", "eval-tests")
    assert logged["config"]["tasks"] == ["ddl_toy_mc"] and logged["config"]["num_fewshot"] == [0]
    [row] = wandb_offline.table(logged, "lm_eval")
    assert (row["model"], row["shots"]) == ("toy-cc", 0)
    assert row["ddl_toy_mc"] == row["Avg."] == 100 * raw["acc_norm,none"]
    metrics = {(r["task"], r["metric"]): r["value"] for r in wandb_offline.table(logged, "lm_eval_metrics")}
    assert metrics[("ddl_toy_mc", "acc")] == raw["acc,none"]
    assert metrics[("ddl_toy_mc", "acc_norm")] == raw["acc_norm,none"]
