"""``ddl tasks run --wandb``: the study's result tables in one offline W&B run, read back from its files."""

import json

from deep_delta.cli.main import main

MICRO = ["--steps", "2", "--threads", "1", "--no-progress", "--set", "test_size=16", "--set", "eval_size=8",
         "--set", "log_every=1", "--set", "warmup_steps=1", "--set", "batch_size=4", "--set",
         "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2"]



def test_a_study_logs_its_result_tables(tmp_path, wandb_offline):
    out = tmp_path / "out"
    assert main(["tasks", "run", "shell-game", "--variants", "baseline", "ddl-dv1", "--seeds", "1", "--out", str(out),
                 *MICRO, "--wandb", "--wandb-project", "task-tests"]) == 0
    summary = json.loads((out / "tasks.json").read_text())
    [run] = wandb_offline.runs()
    assert (run["name"], run["job_type"], run["project"]) == ("tasks-shell-game", "tasks", "task-tests")
    assert run["config"]["task"] == "shell-game" and run["config"]["settings"]["steps"] == 2
    rows = wandb_offline.table(run, "accuracy")
    assert [(r["variant"], r["overall"]) for r in rows] == [(r["variant"], r["overall"]["mean"])
                                                           for r in summary["rows"]]
    level = f"{summary['difficulty_name']} {summary['level_names'][0]}"
    assert rows[1][level] == summary["rows"][1]["by_difficulty"]["1"]["mean"]
    per_seed = wandb_offline.table(run, "per_seed")
    assert [(r["variant"], r["seed"]) for r in per_seed] == [("baseline", 0), ("ddl-dv1", 0)]
    curves = wandb_offline.table(run, "loss_curves")
    assert [(r["variant"], r["step"]) for r in curves] == [("baseline", 1), ("baseline", 2), ("ddl-dv1", 1),
                                                           ("ddl-dv1", 2)]
    assert run["summary"]["ddl-dv1/overall"] == summary["rows"][1]["overall"]["mean"]


def test_a_project_without_wandb_is_refused(tmp_path, capsys):
    assert main(["tasks", "run", "shell-game", "--out", str(tmp_path), "--wandb-project", "p"]) == 2
    assert "--wandb-project given, but W&B logging is off; add --wandb" in capsys.readouterr().err
