"""SW5: the kernel switches (``deep_delta.ops.switches``: the paths not yet run on a GPU) are recorded beside the
figures they made: each run's run.json and checkpoints, a comparison's compare.json (the process that measured its
step times) and `ddl bench --out`'s JSON; a run made with a switch on is not resumed with it off. They were recorded
nowhere: a run or a bench made on an untested GPU path could not be told from one made without it."""

from __future__ import annotations

import json

import pytest

from deep_delta.cli.main import main
from deep_delta.ops import switches
from deep_delta.train.checkpoint import latest_checkpoint, load_checkpoint
from deep_delta.train.trainer import Trainer


def test_a_run_records_its_switches_and_resumes_only_with_them(tmp_path, make_config):
    cfg = make_config(tmp_path / "run", steps=4, save_every=2, eval_every=0)
    with switches.override(tc_one_pass=True):
        Trainer(cfg, progress=False, quiet=True, stop_at=2).run()
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["kernel_switches"] == {**switches.current(), "TC_ONE_PASS": True}
    meta = load_checkpoint(latest_checkpoint(tmp_path / "run"))["meta"]
    assert meta["kernel_switches"]["TC_ONE_PASS"] is True
    with switches.override(tc_one_pass=False), pytest.raises(FileExistsError, match=r"other kernel paths .*"
                                                                  r"kernel switch TC_ONE_PASS: run has True, now False"):
        Trainer(cfg, progress=False, quiet=True, resume=True).run()
    with switches.override(tc_one_pass=True):
        assert Trainer(cfg, progress=False, quiet=True, resume=True).run().step == 4


def test_a_comparison_and_a_bench_record_the_switches(tmp_path, data_dir):
    with switches.override(inkernel_reduce=True):
        assert main(["compare", "--config", "debug", "--variants", "baseline", "--data", str(data_dir), "--out",
                     str(tmp_path / "cmp"), "--steps", "2", "--time-repeats", "1", "--threads", "1", "--device",
                     "cpu", "--no-progress"]) == 0
        out = tmp_path / "bench.md"
        assert main(["bench", "--variants", "baseline", "--batch-size", "1", "--seq-len", "12", "--steps", "1",
                     "--repeats", "1", "--warmup", "0", "--decode-tokens", "2", "--device", "cpu", "--out", str(out),
                     "--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
                     "model.num_attention_heads=2", "--set", "model.vocab_size=64"]) == 0
    summary = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert summary["machine"]["kernel_switches"]["INKERNEL_REDUCE"] is True
    # a finished run made with a switch on is not reused by a comparison with it off (it was, before)
    again = ["compare", "--config", "debug", "--variants", "baseline", "--data", str(data_dir), "--out",
             str(tmp_path / "cmp"), "--steps", "2", "--time-repeats", "0", "--threads", "1", "--device", "cpu",
             "--no-progress"]
    with switches.override(inkernel_reduce=False):
        assert main(again) == 2
    with switches.override(inkernel_reduce=True):
        assert main(again) == 0
    assert json.loads((tmp_path / "cmp" / "baseline" / "run.json").read_text())["kernel_switches"]["INKERNEL_REDUCE"]
    assert json.loads(out.with_suffix(".json").read_text())["kernel_switches"]["INKERNEL_REDUCE"] is True


def test_a_run_records_its_cpu_threads(tmp_path, make_config):
    """What a reproduction of a run's numbers on a CPU matches: run.json says how many threads PyTorch had."""
    import torch

    Trainer(make_config(tmp_path / "run", steps=1, eval_every=0), progress=False, quiet=True).run()
    device = json.loads((tmp_path / "run" / "run.json").read_text())["device"]
    assert device == {"type": "cpu", "name": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads()}
