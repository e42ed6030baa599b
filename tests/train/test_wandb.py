"""Weights & Biases beside metrics.jsonl: what a training run logs (read back from the offline run files), the
resumed run's id, the offline choice without an API key, and a missing package or refused login as one line."""

from __future__ import annotations

import json
import re
import sys

import pytest

from deep_delta.cli.main import main
from deep_delta.data import read_meta
from deep_delta.train import TrainConfig
from deep_delta.train.metrics import read_metrics
from deep_delta.train.provenance import data_fingerprint
from deep_delta.train.trainer import train
from deep_delta.train.wandb_sink import WANDB_FILE, WandbSink, has_credentials, resolve_mode, start_wandb


def _wandb_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("W&B")]


def test_a_run_logs_its_config_every_step_validation_and_summary(tmp_path, make_config, data_dir, wandb_offline):
    cfg = make_config(tmp_path / "run", steps=4, eval_every=2, save_every=0, wandb=True, wandb_project="ddl-tests",
                      tensorboard=True)
    result = train(cfg, progress=False, quiet=True)
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))  # both sinks at once
    [run] = wandb_offline.runs()
    assert run["id"] == json.loads((tmp_path / "run" / WANDB_FILE).read_text())["id"]
    assert (run["project"], run["name"], run["job_type"], run["exit_code"]) == ("ddl-tests", "ddl-cc-tiny-s0",
                                                                               "train", 0)
    config = run["config"]
    assert (config["variant"], config["preset"], config["steps"], config["lr"]) == ("ddl-cc", "tiny", 4, cfg.lr)
    assert config["parameters"] == result.parameters
    assert config["model"]["hidden_size"] == 32 and config["model"]["variant"] == "ddl-cc"
    assert config["data"]["fingerprint"] == data_fingerprint(data_dir, read_meta(data_dir))
    assert config["data"]["tokenizer"] == "byte" and config["tokens_per_step"] == 4 * 32
    records = read_metrics(tmp_path / "run")
    steps = [{k: r[k] for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s")} for r in records if "loss" in r]
    assert [{k: row[k] for k in steps[0]} for row in run["history"] if "loss" in row] == steps
    vals = [(r["step"], r["val_loss"], r["val_ppl"]) for r in records if "val_loss" in r]
    assert [(row["step"], row["val_loss"], row["val_ppl"]) for row in run["history"] if "val_loss" in row] == vals
    assert [s for s, _, _ in vals] == [2, 4]
    summary = run["summary"]
    assert (summary["step"], summary["val_loss"], summary["parameters"]) == (4, result.val_loss, result.parameters)
    assert summary["tokens"] == 4 * 4 * 32 and summary["checkpoint"] == str(result.checkpoint)


def test_a_resumed_run_continues_the_same_wandb_run_and_overwrite_starts_another(tmp_path, make_config,
                                                                                 wandb_offline, capsys):
    cfg = make_config(tmp_path / "run", steps=4, eval_every=0, save_every=0, wandb=True)
    train(cfg, stop_at=2, progress=False, quiet=True)
    first = json.loads((tmp_path / "run" / WANDB_FILE).read_text())["id"]
    train(cfg, resume=True, progress=False, quiet=False)
    assert f"W&B: continuing run {first} (offline)" in _wandb_lines(capsys.readouterr().out)
    a, b = wandb_offline.runs()
    assert a["id"] == b["id"] == first
    assert json.loads((tmp_path / "run" / WANDB_FILE).read_text())["id"] == first
    assert [row["step"] for row in a["history"] if "loss" in row] == [1, 2]
    assert [row["step"] for row in b["history"] if "loss" in row] == [3, 4]
    assert b["summary"]["step"] == 4

    train(cfg, overwrite=True, progress=False, quiet=True)
    third = wandb_offline.runs()[-1]
    assert third["id"] != first
    assert json.loads((tmp_path / "run" / WANDB_FILE).read_text())["id"] == third["id"]


def test_a_run_that_turns_wandb_on_when_resumed_sends_its_earlier_records_first(tmp_path, make_config,
                                                                               wandb_offline):
    cfg = make_config(tmp_path / "run", steps=4, eval_every=2, save_every=0)
    train(cfg, stop_at=2, progress=False, quiet=True)
    train(make_config(tmp_path / "run", steps=4, eval_every=2, save_every=0, wandb=True), resume=True,
          progress=False, quiet=True)
    [run] = wandb_offline.runs()
    assert [row["step"] for row in run["history"] if "loss" in row] == [1, 2, 3, 4]
    assert [row["step"] for row in run["history"] if "val_loss" in row] == [2, 4]


def test_a_run_that_ends_in_an_error_is_finished_in_wandb_with_its_exit_code(tmp_path, make_config, wandb_offline,
                                                                            monkeypatch):
    from deep_delta.train import NonFiniteLossError
    from deep_delta.train.trainer import Trainer

    def diverge_at_step_2(self, loss, norm):
        if self.step == 1:
            raise NonFiniteLossError("non-finite loss at step 2 (a test)")

    monkeypatch.setattr(Trainer, "_check_finite", diverge_at_step_2)
    with pytest.raises(NonFiniteLossError):
        train(make_config(tmp_path / "run", steps=4, eval_every=0, wandb=True), progress=False, quiet=True)
    [run] = wandb_offline.runs()
    assert run["exit_code"] == 1 and [row["step"] for row in run["history"] if "loss" in row] == [1]


def test_a_missing_wandb_package_is_refused_before_any_work(tmp_path, make_config, wandb_offline, monkeypatch):
    """As `tensorboard` without tensorboard is: a run that asks for W&B logging without the package is refused in
    one line naming the extra, before anything is written (it went on without W&B, a warning scrolling past)."""
    from deep_delta.extras import MissingExtra

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    cfg = make_config(tmp_path / "run", steps=2, eval_every=0, wandb=True)
    with pytest.raises(MissingExtra, match=r"^`wandb` \(Weights & Biases logging\) needs wandb, which is not "
                                           r"installed: pip install 'deep-delta-learning\[wandb\]'$"):
        train(cfg, progress=False, quiet=False)
    assert not (tmp_path / "run").exists() and not wandb_offline.files()


def test_a_refused_login_is_one_line_and_training_goes_on(tmp_path, make_config, wandb_offline, monkeypatch,
                                                          capsys):
    import wandb

    def refuse(**kwargs):
        raise wandb.errors.AuthenticationError("API key must be 40 characters long, yours was 3\nmore detail")

    monkeypatch.setattr(wandb, "init", refuse)
    result = train(make_config(tmp_path / "run", steps=2, eval_every=0, wandb=True), progress=False, quiet=False)
    assert result.step == 2
    assert _wandb_lines(capsys.readouterr().out) == [
        "W&B: could not start a run (AuthenticationError: API key must be 40 characters long, yours was 3); going "
        "on without W&B"]


def test_without_an_api_key_the_run_is_offline_and_says_so(tmp_path, wandb_offline, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    said = []
    sink = start_wandb(project="p", name="n", config={"a": 1}, directory=tmp_path, say=said.append)
    sink.log({"step": 1, "loss": 2.5, "note": "text is not plotted"})
    sink.close()
    assert sink.mode == "offline"
    root = wandb_offline.root / "wandb"
    assert said == [f"W&B: no API key configured (WANDB_API_KEY or `wandb login`): logging offline under {root}; "
                    f"upload with `wandb sync {root}/offline-run-*`"]
    [run] = wandb_offline.runs()
    assert run["config"]["a"] == 1 and [{k: r[k] for k in ("step", "loss")} for r in run["history"]] == [
        {"step": 1, "loss": 2.5}]
    assert "note" not in run["history"][0]


def test_a_bad_wandb_mode_is_one_line_naming_it(tmp_path, wandb_offline, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offlin")
    said = []
    assert start_wandb(project="p", name="n", config={}, directory=tmp_path, say=said.append) is None
    assert said == ["W&B: WANDB_MODE got 'offlin'; allowed: online, offline, disabled; going on without W&B"]


def test_the_mode_follows_wandb_mode_then_the_credentials(tmp_path, wandb_offline, monkeypatch):
    assert resolve_mode() == ("offline", False)  # WANDB_MODE=offline, as set
    monkeypatch.delenv("WANDB_MODE")
    assert not has_credentials() and resolve_mode() == ("offline", True)
    netrc = tmp_path / "wandb-root" / "netrc"
    netrc.write_text("machine 127.0.0.1 login user password " + "k" * 40 + "\n")  # WANDB_BASE_URL's host
    netrc.chmod(0o600)
    assert has_credentials() and resolve_mode() == ("online", False)
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode() == ("online", False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode() == ("disabled", False)


class _BrokenRun:
    id = "abc"
    dir = "/nowhere/files"
    settings = type("S", (), {"mode": "offline"})()

    def __init__(self):
        self.finished = []

    def log(self, values):
        raise RuntimeError("the W&B service went away")

    def finish(self, exit_code=0):
        self.finished.append(exit_code)


def test_an_error_inside_wandb_is_one_line_then_nothing_more_is_logged():
    said, run = [], _BrokenRun()
    sink = WandbSink(run, wandb_module=None, say=said.append)
    sink.log({"step": 1, "loss": 1.0})
    sink.log({"step": 2, "loss": 1.0})
    sink.summary({"val_loss": 1.0})
    sink.close()
    assert said == ["W&B: logging failed (RuntimeError: the W&B service went away); going on without W&B"]
    assert run.finished == [1]


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("wandb_project", "team/project", "a name without any of / \\ # ? % :"),
    ("wandb_run_name", " ", "null or a non-empty name of at most 128 characters"),
    ("wandb_group", "g" * 129, "null or a non-empty name of at most 128 characters"),
    ("wandb", "yes", "true or false"),
])
def test_bad_wandb_settings_are_refused_by_name(field, value, allowed):
    with pytest.raises(ValueError, match=rf"`{field}` got .*; allowed: {re.escape(allowed)}"):
        TrainConfig(**{field: value})


def test_wandb_names_without_wandb_are_refused_on_the_command_line(tmp_path, capsys):
    assert main(["train", "--wandb-project", "p", "--wandb-group", "g", "--out", str(tmp_path / "r"),
                 "--print-config"]) == 2
    assert capsys.readouterr().err.strip() == ("ddl train: error: --wandb-project, --wandb-group given, but W&B "
                                               "logging is off; add --wandb (or wandb: true in the config)")
    assert main(["train", "--wandb", "--wandb-project", "p", "--print-config"]) == 0
    assert "wandb: true\nwandb_project: p\n" in capsys.readouterr().out


def test_compare_groups_its_runs_and_logs_the_table_and_curves(tmp_path, data_dir, wandb_offline):
    out = tmp_path / "cmp"
    args = ["compare", "--variants", "baseline", "ddl-cc", "--out", str(out), "--data", str(data_dir), "--steps", "2",
            "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1", "--device", "cpu",
            "--no-progress", "--time-repeats", "0", "--wandb", "--wandb-project", "cmp-tests",
            "--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
            "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]
    assert main(args) == 0
    runs = wandb_offline.runs()
    group = json.loads((out / WANDB_FILE).read_text())["group"]
    assert group.startswith("cmp-")
    assert [(r["name"], r["job_type"], r["group"], r["project"]) for r in runs] == [
        ("baseline-seed0", "train", group, "cmp-tests"), ("ddl-cc-seed0", "train", group, "cmp-tests"),
        ("comparison", "compare", group, "cmp-tests")]
    assert [row["step"] for row in runs[1]["history"] if "val_loss" in row] == [1, 2]
    summary = json.loads((out / "compare.json").read_text())
    rows = wandb_offline.table(runs[2], "comparison")
    assert [(r["variant"], r["val_loss"]) for r in rows] == [(r["variant"], r["val_loss"]) for r in summary["rows"]]
    curves = wandb_offline.table(runs[2], "val_curves")
    assert [(c["variant"], c["step"]) for c in curves] == [("baseline", 1), ("baseline", 2), ("ddl-cc", 1),
                                                           ("ddl-cc", 2)]
    assert curves[3]["val_loss"] == summary["rows"][1]["val_loss"]
    folder = runs[2]["folder"]
    assert list((folder / "files" / "media" / "images").glob("curves_*.png"))
    assert runs[2]["summary"]["ddl-cc/val_loss"] == rows[1]["val_loss"]

    assert main(args) == 0  # started again: the finished runs are reused, in the same group and comparison run
    again = wandb_offline.runs()[3:]
    assert {r["group"] for r in again} == {group}
    assert again[-1]["id"] == runs[2]["id"]
