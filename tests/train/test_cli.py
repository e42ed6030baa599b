"""``ddl train`` and ``ddl compare`` end to end, in-process through ``deep_delta.cli.main.main``."""

from __future__ import annotations

import json

import pytest

from deep_delta.cli.main import main
from deep_delta.train import latest_checkpoint
from deep_delta.train.metrics import read_metrics
from helpers import with_options

MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]


def _train_args(data_dir, out, *extra):
    return with_options(["train", "--variant", "ddl-dv1", "--data", str(data_dir), "--out", str(out), "--steps",
                         "3", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1", "--device", "cpu",
                         "--no-progress", *MODEL], *extra)


def test_train_then_resume(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    assert main(_train_args(data_dir, out, "--lr", "3e-4", "--warmup-steps", "1")) == 0
    assert latest_checkpoint(out).name == "step_0000003"
    assert json.loads((out / "run.json").read_text())["train_config"]["lr"] == 3e-4
    assert main(_train_args(data_dir, out, "--lr", "3e-4", "--warmup-steps", "1", "--steps", "4", "--resume")) == 0
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3, 4]
    captured = capsys.readouterr()
    assert "resuming at step 3" in captured.out + captured.err


def test_train_picks_its_threads_by_load_and_says_why(tmp_path, data_dir, capsys, monkeypatch):
    """Not given, ``--threads`` is auto, as in ``ddl compare``: the cores other work does not keep busy (issue 66:
    PyTorch's 2 threads on a busy 2-core machine took 34-37 s a step against 8-11 s with one), said in the first
    line; given, as given; under torchrun (WORLD_SIZE > 1) PyTorch's own choice, its processes sharing the cores
    (said by rank 0 only)."""
    import torch

    from deep_delta import runtime
    from deep_delta.cli.train import _apply_threads

    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runtime, "busy_cores", lambda interval=0.3: 2.6)
    assert main(_train_args(data_dir, tmp_path / "run", "--steps", "1")) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("ddl train: 1 CPU thread (--threads auto, the default: 4 cores, 2.6 kept busy by other work; "
                     "--threads N sets another)")
    assert torch.get_num_threads() == 1
    _apply_threads("auto")
    assert capsys.readouterr().out == "ddl train: 1 CPU thread (--threads auto: 4 cores, 2.6 kept busy by other work)\n"
    _apply_threads("2")
    assert capsys.readouterr().out == "ddl train: 2 CPU threads (--threads 2)\n" and torch.get_num_threads() == 2
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    torch.set_num_threads(3)  # what PyTorch (or torchrun's OMP_NUM_THREADS) chose: left alone
    _apply_threads(None)
    assert torch.get_num_threads() == 3
    assert capsys.readouterr().out == ("ddl train: 3 CPU threads per process, PyTorch's own choice (under torchrun "
                                       "its 4 processes share the cores; --threads N sets another)\n")
    _apply_threads("1")
    assert torch.get_num_threads() == 1 and capsys.readouterr().out == "ddl train: 1 CPU thread (--threads 1)\n"
    monkeypatch.setenv("RANK", "1")
    _apply_threads("2")
    assert torch.get_num_threads() == 2 and capsys.readouterr().out == ""


def test_train_from_a_config_file_with_overrides(tmp_path, data_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"variant: baseline\ndata: {data_dir}\nsteps: 2\nbatch_size: 2\nseq_len: 16\n"
                   f"eval_batches: 1\ndevice: cpu\nmodel:\n  hidden_size: 32\n  num_hidden_layers: 1\n"
                   f"  num_attention_heads: 2\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--steps", "1", "--no-progress"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["train_config"]["steps"] == 1 and run["train_config"]["variant"] == "baseline"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "bogus=1"], "unknown key(s) ['bogus']"),
        (["--set", "model.bogus=1"], "unknown model field(s) ['bogus']"),
        (["--config", "tiny/nope"], "not a shipped config name"),
        (["--set", "steps=-1"], "--steps got -1"),  # the library names `steps`; the CLI the flag
    ],
)
def test_bad_settings_exit_2_and_write_nothing(tmp_path, data_dir, capsys, extra, message):
    out = tmp_path / "run"
    assert main(_train_args(data_dir, out, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddl train: error:") and message in err
    assert not out.exists()


def test_existing_run_refused_without_resume(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    assert main(_train_args(data_dir, out, "--steps", "1")) == 0
    assert main(_train_args(data_dir, out, "--steps", "1")) == 2
    assert "already holds a training run" in capsys.readouterr().err


def test_print_and_list_configs(capsys):
    assert main(["train", "--config", "small/ddl-cc", "--lr", "5e-4", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "variant: ddl-cc" in text and "lr: 0.0005" in text and "global_batch_size: 480" in text
    assert main(["train", "--list-configs"]) == 0
    assert "medium/ddl-tc-noec" in capsys.readouterr().out


def test_compare_end_to_end(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--out", str(out), "--data", str(data_dir), "--steps", "2", "--batch-size", "2",
            "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1", "--device", "cpu", "--no-progress",
            *MODEL]
    assert main(args) == 0
    printed = capsys.readouterr().out
    for name in ("Baseline", "DDL (d_v=1)", "DDL-TC", "DDL-CC", "val loss", "d ppl", "step ms (interleaved)"):
        assert name in printed
    summary = json.loads((out / "compare.json").read_text())
    rows = {r["variant"]: r for r in summary["rows"]}
    assert list(rows) == ["baseline", "ddl-dv1", "ddl-tc", "ddl-cc"]
    for v, r in rows.items():
        vals = [x["val_loss"] for x in read_metrics(out / v) if "val_loss" in x]
        assert r["val_loss"] == vals[-1] and r["tokens"] == 2 * 2 * 16 and r["parameters"] > 0
        assert r["d_val_loss"] == pytest.approx(r["val_loss"] - rows["baseline"]["val_loss"])
    assert rows["ddl-tc"]["parameters"] > rows["baseline"]["parameters"]
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| DDL-CC | ddl-cc |" in (out / "compare.md").read_text()
    # a second call reuses the finished runs (same settings) instead of training again
    before = (out / "ddl-cc" / "metrics.jsonl").read_text()
    assert main(args) == 0
    assert (out / "ddl-cc" / "metrics.jsonl").read_text() == before
    # a different budget is refused without --overwrite
    assert main([*args[:6], "3", *args[7:]]) == 2
    assert "was made with other settings (steps: run has 2, now 3)" in capsys.readouterr().err


def test_non_finite_loss_exits_1_naming_the_step(tmp_path, data_dir, capsys, monkeypatch):
    from deep_delta.train import trainer as trainer_mod

    real_build = trainer_mod.build_model

    def nan_model(model_config):
        model = real_build(model_config)
        forward = model.forward

        def fwd(*args, **kwargs):
            out = forward(*args, **kwargs)
            if model.training:
                out.loss = out.loss + float("inf")
            return out

        model.forward = fwd
        return model

    monkeypatch.setattr(trainer_mod, "build_model", nan_model)
    assert main(_train_args(data_dir, tmp_path / "run")) == 1
    err = capsys.readouterr().err
    assert "ddl train: error: non-finite loss" in err and "at step 1" in err and "none (no checkpoint" in err


def test_compare_reports_a_diverging_variant_and_trains_the_others(tmp_path, data_dir, capsys, monkeypatch):
    from deep_delta.train import trainer as trainer_mod

    real_build = trainer_mod.build_model

    def build(model_config):
        model = real_build(model_config)
        if model_config.variant == "ddl-dv1":  # this variant's loss is NaN from its second step on
            forward, calls = model.forward, [0]

            def fwd(*args, **kwargs):
                out = forward(*args, **kwargs)
                calls[0] += model.training
                if calls[0] >= 2:
                    out.loss = out.loss * float("nan")
                return out

            model.forward = fwd
        return model

    monkeypatch.setattr(trainer_mod, "build_model", build)
    out = tmp_path / "cmp"
    assert main(["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data_dir),
                 "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1", "--device", "cpu",
                 "--no-progress", *MODEL]) == 1
    captured = capsys.readouterr()
    assert "| DDL (d_v=1) | ddl-dv1 |" in captured.out and "diverged" in captured.out
    assert "ddl-dv1 diverged: non-finite loss" in captured.err and "at step 2" in captured.err
    rows = {r["variant"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert rows["ddl-dv1"]["val_loss"] is None and rows["baseline"]["val_loss"] is not None
