"""A verdict read from measured step times (issue 66 item 7): the break-even "pays" states the spread of its timing
rounds and is "undecided" where the spread reaches the other side; a rerun that times the steps again says what
changed (the earlier report's ratio, then and now); ``--report-only`` does not call the runs' training time its own
wall time; docs/training.md shows the columns the comparison table has.

The trial: studies/deep12/run.sh rerun on a copy reused all 144 runs and timed the steps again; the twin's ratio
came out 1.67x instead of 1.34x and its "pays" became "undecided", with no word of either."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deep_delta.cli.main import main
from deep_delta.experiments import break_even as be
from deep_delta.experiments.compare_report import compare_rows, comparison_table, variant_row

ROOT = Path(__file__).resolve().parents[2]

# ddl-cc-write in studies/deep12/all/compare.json: r* 1.630 [1.508, 1.762]
TWIN = {"geo_mean": 1.630, "ci95": [1.508, 1.762], "per_seed": [], "outside_seeds": [], "n": 4}


def test_a_timing_verdict_states_its_spread_and_is_undecided_within_it():
    assert be.verdict(TWIN, 1.342) == "pays (measured ratio below r*)"  # a record without its rounds: as before
    steady = be.verdict(TWIN, 1.342, [1.31, 1.38])
    assert steady == "pays (measured ratio below r*, at every timing round's ratio too, 1.310-1.380)"
    flips = be.verdict(TWIN, 1.342, [1.31, 1.67])
    assert flips == ("undecided (pays at the median ratio 1.342, but not over the timing rounds' ratios 1.310-1.670: "
                     "pays at 1.310, undecided at 1.670)")
    assert be.verdict_word(TWIN, 1.342, [1.31, 1.67]) == "undecided" and be.verdict_word(TWIN, 1.342) == "pays"
    assert be.verdict(TWIN, 2.0, [1.9, 2.1]).startswith("does not pay (measured ratio above r*, at every timing")
    behind = {"geo_mean": None, "ci95": None, "per_seed": [{"seed": 0, "r": None, "outside": "below", "bound": 1.0}]}
    assert be.verdict(behind, 1.3, [1.2, 1.4]) == "does not pay (behind at equal steps in every seed)"  # not timed


def test_the_break_even_table_says_a_verdict_that_a_new_timing_changed():
    """The trial's numbers: the twin's r* 1.630 [1.508, 1.762], its step 1.342x the baseline's in the earlier report,
    1.67x (1.60x-1.70x over 5 rounds) now."""
    twin = {"variant": "ddl-cc-write", "break_even": TWIN, "time_ratio": 1.67, "time_ratio_spread": [1.60, 1.70],
            "time_rounds": 5, "earlier_time_ratio": 1.342}
    summary = {"rows": [{"variant": "baseline"}, twin], "reference": "baseline", "settings": {"steps": 600},
               "timing": {"earlier": {"file": "selection.json", "repeats": 5, "step_time_s": {}}}}
    table = "\n".join(be.break_even_table(summary))
    assert "| 1.670 (1.600-1.700) | undecided (measured ratio inside the interval of r*; the timing rounds' ratios " \
           "1.600-1.700) |" in table
    assert ("The step times were measured again (the earlier report's, in selection.json, 5 rounds): measured step "
            "ratio ddl-cc-write 1.342 then, 1.670 now ('pays' then, 'undecided' now).") in table


def _seed(val_loss: float) -> dict:
    return {"seed": 0, "parameters": 1000, "steps": 600, "tokens": 614400, "final_train_loss": val_loss,
            "val_loss": val_loss, "val_ppl": 2.0 ** val_loss, "val_curve": [[300, val_loss + 0.2], [600, val_loss]],
            "tokens_per_s": 1000.0, "train_wall_s": 100.0, "diverged": None}


def test_the_spread_is_the_ratio_of_each_round():
    rows = [variant_row("baseline", [_seed(1.30)]), variant_row("ddl-cc", [_seed(1.29)])]
    timing = {"step_time_s": {"baseline": 1.0, "ddl-cc": 1.5}, "repeats": 3, "device": "cpu", "dtype": "float32",
              "step_time_rounds_s": {"baseline": [1.0, 2.0, 1.0], "ddl-cc": [1.5, 2.6, 1.6]}}
    for r in rows:
        compare_rows(r, rows[0], timing)
    assert rows[1]["time_ratio_spread"] == pytest.approx([1.3, 1.6]) and rows[1]["time_rounds"] == 3


def planted(times: dict[str, list[float]]):
    """A measure_step_times that returns ``times`` (seconds per round) instead of timing anything."""
    import statistics

    def measure(base, variants, data_vocab, *, repeats=5, warmup=1):
        return {"step_time_s": {v: statistics.median(times[v]) for v in variants}, "repeats": len(times["baseline"]),
                "device": "cpu", "dtype": "float32", "step_time_rounds_s": {v: times[v] for v in variants}}
    return measure


def test_a_rerun_that_times_the_steps_again_says_what_changed(tmp_path, data_dir, capsys, monkeypatch):
    from tests.experiments.test_compare_scaling import micro

    from deep_delta.experiments import compare

    out = tmp_path / "cmp"
    argv = micro(out, data_dir, "--steps", "4")
    argv[argv.index("--time-repeats") + 1] = "3"
    monkeypatch.setattr(compare, "measure_step_times", planted({"baseline": [1.0, 1.0, 1.0],
                                                                 "ddl-dv1": [1.30, 1.34, 1.36]}))
    assert main(argv) == 0
    first = json.loads((out / "compare.json").read_text())
    assert "earlier" not in first["timing"] and "measured again" not in (out / "compare.md").read_text()
    row = next(r for r in first["rows"] if r["variant"] == "ddl-dv1")
    assert row["time_ratio"] == pytest.approx(1.34) and row["time_ratio_spread"] == pytest.approx([1.30, 1.36])
    capsys.readouterr()
    monkeypatch.setattr(compare, "measure_step_times", planted({"baseline": [1.0, 1.0, 1.0],
                                                                 "ddl-dv1": [1.60, 1.67, 1.70]}))
    assert main(argv) == 0  # every run reused; the steps timed again
    printed = capsys.readouterr().out
    again = json.loads((out / "compare.json").read_text())
    assert again["timing"]["earlier"]["step_time_s"] == first["timing"]["step_time_s"]
    assert again["timing"]["earlier"]["file"] == "compare.json"
    report = (out / "compare.md").read_text()
    said = ("These step times were measured again; the earlier report's (compare.json, 3 rounds) had the step ratio "
            "ddl-dv1 1.34x (now 1.67x).")
    assert said in report
    assert "its step 1.67x the Baseline's (1.60x-1.70x over 3 timing rounds)" in printed
    assert again["rows"][1]["break_even"]  # the break-even table says the ratio then and now
    assert ("The step times were measured again (the earlier report's, in compare.json, 3 rounds): measured " \
            "step ratio ddl-dv1 1.340 then, 1.670 now.") in printed
    # --report-only keeps the timing and what it replaced, and calls its own wall time its own
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    printed = capsys.readouterr().out
    kept = json.loads((out / "compare.json").read_text())
    assert kept["timing"] == again["timing"] and said in (out / "compare.md").read_text()
    trained = sum(x["train_wall_s"] for r in kept["rows"] for x in r["per_seed"])
    assert kept["wall_s"] != trained  # before: the runs' training time, called the wall time of this call
    line = next(line for line in printed.splitlines() if "differences against baseline" in line)
    assert re.search(r"; the runs' training time \d+ s \(their run\.json\); wall time of this call \d+ s$", line), line


def _documented_headers(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| model | variant | params |")]


def test_the_documented_comparison_columns_are_the_tables():
    """docs/training.md described columns the table no longer has (train tok/s, speed): every table it shows and
    its description of the columns are the code's."""
    timed = {"step_time_s": {"baseline": 1.0, "ddl-cc": 1.5}, "repeats": 1, "device": "cpu", "dtype": "float32"}
    headers = set()
    for timing in (timed, None):
        for split in ("val", "test"):
            rows = [variant_row("baseline", [_seed(1.30)]), variant_row("ddl-cc", [_seed(1.29)])]
            for r in rows:
                compare_rows(r, rows[0], timing)
            summary = {"rows": rows, "reference": "baseline", "seeds": [0], "timing": timing, "reported_split": split}
            headers.add(comparison_table(summary).splitlines()[0])
    doc = (ROOT / "docs" / "training.md").read_text()
    shown = _documented_headers(doc)
    assert shown and set(shown) <= headers, set(shown) - headers
    described = doc[doc.index("Table columns:"):].split("\n\n")[0]
    for column in ("step ms (interleaved)", "step vs ref.", "val loss at ref. time", "d at ref. time",
                   "run-avg train tok/s", "run-avg speed vs ref.", "95% CI of d", "lower in"):
        assert f"`{column}`" in described, column
