"""What `ddl compare` tells a newcomer (issue 58): one measure of a variant's cost in the table, so that the
terminal and compare.md cannot contradict themselves on which variant is faster; one closing sentence saying what
the comparison found; an estimate of the job's length after its first steps; the MFU note once; and the time of
the runs, every session of an interrupted and resumed one counted (run.json's segments)."""

from __future__ import annotations

import json
import re

from deep_delta.cli.main import main
from deep_delta.experiments.compare_report import (
    compare_rows,
    comparison_report,
    comparison_table,
    variant_row,
)


def _seed(val_loss: float, tokens_per_s: float) -> dict:
    return {"seed": 0, "parameters": 1000, "steps": 600, "tokens": 614400, "final_train_loss": val_loss,
            "val_loss": val_loss, "val_ppl": 2.0 ** val_loss, "val_curve": [[300, val_loss + 0.2], [600, val_loss]],
            "tokens_per_s": tokens_per_s, "train_wall_s": 100.0, "diverged": None}


def _summary(step_times: dict | None) -> dict:
    """The main job's contradiction: DDL-CC's run-average throughput (measured while the machine was busier for
    the baseline) says 1.29x faster, its interleaved step time 1.41x slower."""
    rows = [variant_row("baseline", [_seed(1.30, 648.0)]), variant_row("ddl-cc", [_seed(1.29, 835.0)])]
    timing = {"step_time_s": step_times, "repeats": 5, "device": "cpu", "dtype": "float32"} if step_times else None
    for r in rows:
        compare_rows(r, rows[0], timing)
    return {"rows": rows, "reference": "baseline", "seeds": [0], "settings": {"lr": 2e-3, "preset": "tiny"},
            "timing": timing, "wall_s": 40.0,
            "machine": {"device": "cpu", "cpu_count": 2, "processor": "x86_64", "torch": "2.13.0", "torch_threads": 1}}


def test_the_table_shows_one_measure_of_cost():
    timed = _summary({"baseline": 0.9061, "ddl-cc": 1.2776})
    table = comparison_table(timed)
    assert "step ms (interleaved)" in table and "| 1277.6 | 1.41x |" in table
    assert "tok/s" not in table and "1.29x" not in table  # the run-average, which said the opposite, is not shown
    untimed = comparison_table(_summary(None))
    assert "| run-avg train tok/s | run-avg speed vs ref. |" in untimed and "| 835 | 1.29x |" in untimed
    assert "step ms" not in untimed
    report = comparison_report(timed)
    assert "tok/s" not in report.split("\n\n")[2] and "in compare.json (`tokens_per_s`)" in report


def test_the_report_ends_with_one_sentence_of_what_it_found():
    report = comparison_report(_summary({"baseline": 0.9061, "ddl-cc": 1.2776}))
    last = report.rstrip("\n").split("\n")[-1]
    assert last == ("Found (one seed, so no interval: an anecdote): at equal steps, against the Baseline's validation "
                    "loss, DDL-CC lower by 0.0100 nats, its step 1.41x the Baseline's (step times measured interleaved "
                    "on this machine).")
    assert last.count(". ") == 0 and "Training time of the runs: 200 s in all" in report


def test_the_main_job_estimates_its_length_and_says_the_mfu_note_once(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--config", "debug", "--variants", "baseline", "ddl-cc", "--data", str(data_dir),
                 "--out", str(out), "--steps", "25", "--time-repeats", "0", "--threads", "1", "--device", "cpu",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("MFU not reported") <= 1, printed  # once per process at most, not once per run
    first = [line for line in printed.splitlines() if line.startswith("[1/2] baseline: about ")]
    assert len(first) == 1 and re.fullmatch(
        r"\[1/2\] baseline: about \d+ (s|min) left for this run \(\d+ ms a step so far\); with the 1 run\(s\) of the "
        r"study after it, about \d+ (s|min), if each costs as much \(.*\)", first[0]), first
    assert printed.index(first[0]) < printed.index("[2/2] ddl-cc")
    before_wrote = printed[:printed.rindex("\nwrote ")].rstrip().split("\n")
    assert before_wrote[-1].startswith("Found (one seed")  # the report's last line, before the files it wrote


def test_block_attnres_with_as_many_blocks_as_sublayers_is_said_to_be_full_attnres(tmp_path, data_dir, capsys):
    """Round 6's N11: at 1 layer (2 sublayers) the paper's 8 blocks are Full AttnRes; the report and compare.json
    say so for the compared Block AttnRes, from its design's own description, and nothing for the other designs."""
    from tests.experiments.test_compare_scaling import micro

    out = tmp_path / "attnres"
    argv = micro(out, data_dir, "--steps", "2")
    argv[argv.index("--variants") + 1: argv.index("--variants") + 3] = ["baseline", "attnres", "attnres-block"]
    assert main(argv) == 0
    note = ("attnres-block (Block AttnRes) at these settings: Attention Residuals, Block (2 blocks of the 2 "
            "sublayers; as many blocks as sublayers: this is Full AttnRes, the same model)")
    summary = json.loads((out / "compare.json").read_text())
    assert [n for n in summary["notes"] if "AttnRes" in n] == [note]
    assert f"- {note}" in (out / "compare.md").read_text()
    assert f"note: {note}" in capsys.readouterr().out
    rows = {r["variant"]: r["val_loss"] for r in summary["rows"]}
    assert rows["attnres-block"] == rows["attnres"]  # the same model: the same numbers


def test_ddl_info_says_when_block_attnres_is_full_attnres(capsys):  # round 6's N11
    assert main(["info", "--variant", "attnres-block", "--preset", "tiny"]) == 0
    assert ("residual  Attention Residuals, Block (8 blocks of the 8 sublayers; as many blocks as sublayers: this is "
            "Full AttnRes, the same model)") in capsys.readouterr().out
    assert main(["info", "--variant", "attnres-block", "--preset", "small"]) == 0
    assert "(8 blocks of the 24 sublayers)\n" in capsys.readouterr().out
