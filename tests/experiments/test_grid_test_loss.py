"""benchmarks/tools/grid_test_loss.py: every grid run of a held-out study measured on the evaluation runs' test
windows; an lr planted to win on val alone shows its worse test loss there; a second call measures nothing again."""

from __future__ import annotations

import json

import pytest
from tests.experiments.test_compare_held_out import PLANTED, held_out, plant, split_data  # noqa: F401 (fixture)

from deep_delta.cli.main import main
from helpers import load_tool, tool_refusal


def test_the_grid_on_test_shows_the_planted_lr(tmp_path, split_data, capsys, monkeypatch):  # noqa: F811
    plant(monkeypatch, PLANTED)
    out = tmp_path / "held"
    assert main(held_out(out, split_data, steps=6, eval_every=6)) == 0
    monkeypatch.undo()
    capsys.readouterr()
    tool = load_tool("grid_test_loss")
    assert tool.main([str(out), "--data", str(split_data)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "test_vs_lr.json").read_text())
    assert result["chosen_on_val"] == {"baseline": PLANTED, "ddl-dv1": PLANTED}
    assert len(result["points"]) == 8 and not result["left_out"]  # 2 variants x 2 lrs x 2 seeds
    assert {p["tokens"] for p in result["points"] + result["evaluation"]} == {1024}
    for v in ("baseline", "ddl-dv1"):
        def mean(lr, v=v):
            values = [p["test_loss"] for p in result["points"] if p["variant"] == v and p["lr"] == lr]
            assert len(values) == 2
            return sum(values) / 2
        assert mean(PLANTED) > mean(3e-3) + 0.05  # chosen on val, worse on test
        row = next(line for line in printed.splitlines() if line.startswith(f"| {v} |"))
        assert f"**{mean(PLANTED):.4f}**" in row and "(n 2)" in row  # the chosen lr in bold; 2 evaluation seeds
        # the evaluation seeds at the planted lr are measured as the grid's runs at that lr are
        ev = [e["test_loss"] for e in result["evaluation"] if e["variant"] == v]
        assert len(ev) == 2 and min(ev) > mean(3e-3)
    assert (out / "test_vs_lr.png").stat().st_size > 10_000
    kept = {p: p.stat().st_mtime_ns for p in out.glob("lr_*/seed_*/*/test.json")}
    assert len(kept) == 8
    assert tool.main([str(out), "--data", str(split_data)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("lr_*/seed_*/*/test.json")} == kept  # reused, not remeasured


def test_a_folder_without_a_selection_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="selection.json is missing"):
        load_tool("grid_test_loss").main([str(tmp_path), "--data", str(tmp_path)])
    with pytest.raises(SystemExit) as e:  # argparse: the count type of every `ddl` token option
        load_tool("grid_test_loss").main([str(tmp_path), "--data", str(tmp_path), "--test-tokens", "lots"])
    assert e.value.code == 2


# Bad input, one line each (the probe of round 6: GT0, GT2, GT3, GT4, GT11) ----------------------------------------

@pytest.fixture(scope="module")
def study(tmp_path_factory, split_data):  # noqa: F811
    """A held-out study (2 variants x 2 lrs x 2 selection seeds, 2 evaluation seeds), made once; each test copies it."""
    out = tmp_path_factory.mktemp("grid") / "held"
    assert main(held_out(out, split_data)) == 0
    return out


def copy(study, tmp_path):
    import shutil

    shutil.copytree(study, tmp_path / "held")
    return tmp_path / "held"


def refused(*argv) -> str:
    """The one line grid_test_loss.py exits with (SystemExit: printed on stderr, exit 1)."""
    return tool_refusal("grid_test_loss", *argv)


def measured(out):
    """The grid runs' test.json records (none before a first call: only the evaluation runs have theirs)."""
    return {p: p.read_bytes() for p in out.glob("lr_*/**/test.json")}


def test_gt2_damaged_selection_test_and_run_records_are_refused_in_one_line(tmp_path, study, split_data):  # noqa: F811
    """GT2: selection.json ``garbage{`` / ``{"x": 1}``, an evaluation test.json ``garbage``, an evaluation run.json
    deleted: raw tracebacks (JSONDecodeError, KeyError 'lr_selection', FileNotFoundError). Now one line naming the
    file and what it should be, and nothing measured."""
    out = copy(study, tmp_path)
    selection = out / "selection.json"
    kept = selection.read_text()
    selection.write_text("garbage{")
    assert f"{selection} is not valid JSON" in refused(out, "--data", split_data)
    selection.write_text('{"x": 1}')
    assert f"{selection} is not a selection record" in refused(out, "--data", split_data)
    selection.write_text('{"lr_selection": {"chosen": {"baseline": 3}}}')
    assert f"{selection} is not a selection record" in refused(out, "--data", split_data)
    selection.write_text(kept)
    test = out / "evaluation" / "seed_100" / "baseline" / "test.json"
    test_kept = test.read_text()
    test.write_text("garbage")
    said = refused(out, "--data", split_data)
    assert f"{test} is not valid JSON" in said and "a test loss record" in said
    said = refused(out, "--data", split_data, "--test-tokens", "1024")  # read as a star too, not only for its size
    assert f"{test} is not valid JSON" in said
    test.write_text(test_kept)
    run = out / "evaluation" / "seed_101" / "ddl-dv1" / "run.json"
    run.unlink()
    assert refused(out, "--data", split_data).startswith(f"grid_test_loss.py: {run} is missing, but ")
    assert measured(out) == {} and not (out / "test_vs_lr.json").exists()


def test_gt3_missing_data_or_data_without_a_test_split_is_refused(tmp_path, study, data_dir):  # noqa: F811
    """GT3: ``--data dp/nonexist``; ``--data`` of data without a test split: tracebacks ending in FileNotFoundError /
    ValueError. Now one line each, before anything is measured."""
    out = copy(study, tmp_path)
    said = refused(out, "--data", tmp_path / "nonexist")
    assert f"data directory {tmp_path / 'nonexist'} does not exist" in said
    said = refused(out, "--data", data_dir)
    assert "has no test split" in said and str(data_dir) in said
    assert measured(out) == {}


@pytest.mark.parametrize("name", ["compare.md", "test_vs_lr.json", "no_suffix", "missing_folder/test.png"])
def test_gt4_a_figure_matplotlib_cannot_write_is_refused_before_measuring(tmp_path, study, split_data,  # noqa: F811
                                                                          name):
    """GT4: ``--figure OUT/compare.md``: a traceback (Format 'md' is not supported) after measuring every run and
    writing test_vs_lr.json. Now refused first, in one line naming the path and the formats (or the missing
    folder); nothing measured, nothing written."""
    out = copy(study, tmp_path)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    said = refused(out, "--data", split_data, "--figure", out / name)
    assert f"--figure got '{out / name}'" in said
    assert ("does not exist" in said) if "/" in name else ("allowed: a path ending in one of .png, .pdf" in said)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_gt11_other_data_than_the_runs_record_is_refused(tmp_path, study, split_data):  # noqa: F811
    """GT11: ``GT OUT --data dp/dM`` (other data than the study's): the grid measured on dM's test split (each run's
    record replaced), the stars read from the study's data, one table, exit 0. Now refused before anything is
    measured, naming both fingerprints and both directories (the runs' run.json record theirs; the given data's
    computed as the library does, TrainData.resolve)."""
    import shutil

    import numpy as np

    from deep_delta.data.shards import open_shard, write_shard_record
    from deep_delta.train.data import TrainData

    out = copy(study, tmp_path)
    other = tmp_path / "other"
    shutil.copytree(split_data, other)
    tokens = np.asarray(open_shard(other / "train_000000.bin"))[:4000]  # another test split
    record = write_shard_record(other / "test_000000.bin", tokens)
    meta = json.loads((other / "meta.json").read_text())
    meta["splits"]["test"] = {"num_tokens": record["num_tokens"], "shards": [record]}
    (other / "meta.json").write_text(json.dumps(meta))
    theirs, mine = TrainData.resolve(str(split_data)).fingerprint, TrainData.resolve(str(other)).fingerprint
    assert theirs != mine
    said = refused(out, "--data", other)
    assert f"was made from other data than {other.resolve()}" in said
    assert f"data fingerprint {theirs[:12]}, now {mine[:12]}" in said and str(split_data.resolve()) in said
    assert measured(out) == {} and not (out / "test_vs_lr.json").exists()
    # the study's own data: measured as before
    assert load_tool("grid_test_loss").main([str(out), "--data", str(split_data)]) == 0
    assert len(measured(out)) == 8


def test_gt0_one_selection_seed_is_read_too(tmp_path, split_data, capsys):  # noqa: F811
    """GT0: a study of one selection seed (``lr_*/VARIANT/``, no seed folders): ``holds no grid runs`` though it
    held 4. Now its runs are read (their seed from their run.json) and measured, beside the evaluation seeds."""
    out = tmp_path / "one"
    argv = held_out(out, split_data)
    argv[argv.index("--seeds") + 1] = "1"
    assert main(argv) == 0
    assert not list(out.glob("lr_*/seed_*")) and len(list(out.glob("lr_*/*/run.json"))) == 4
    capsys.readouterr()
    assert load_tool("grid_test_loss").main([str(out), "--data", str(split_data)]) == 0
    result = json.loads((out / "test_vs_lr.json").read_text())
    assert len(result["points"]) == 4 and {p["seed"] for p in result["points"]} == {0}
    assert len(result["evaluation"]) == 4 and not result["left_out"]
    assert "| baseline |" in capsys.readouterr().out
