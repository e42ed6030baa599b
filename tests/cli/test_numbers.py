"""Numbers from the command line are read in one place (deep_delta.settings): finite, typed, scientific notation;
nan and inf are refused by every numeric option of every command, and by --set."""

from __future__ import annotations

import argparse
import math

import pytest

from deep_delta.cli import options
from deep_delta.cli.main import build_parser, main
from deep_delta.settings import parse_assignments, parse_number

PARSER = build_parser()
NUMBER_TYPES = {options.integer, options.real, options.count, options.fraction, options.lr_item}


def numeric_options():
    """(command, flag, action) of every option that takes a number, in every (sub-)subcommand."""
    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, [*path, name])
            elif a.option_strings and (a.type not in (None, str) or isinstance(a.default, (int, float))
                                       and not isinstance(a.default, bool) and a.nargs != 0):
                yield " ".join(path), max(a.option_strings, key=len), a
    return list(walk(PARSER, []))


OPTIONS = numeric_options()


def test_the_walk_finds_the_numeric_options():
    found = {(cmd, flag) for cmd, flag, _ in OPTIONS}
    assert {("coord-check", "--bound"), ("train", "--lr"), ("compare", "--steps"), ("bench", "--repeats"),
            ("data prepare", "--max-tokens"), ("tasks run", "--steps")} <= found


@pytest.mark.parametrize(("cmd", "flag", "action"), OPTIONS, ids=[f"{c} {f}" for c, f, _ in OPTIONS])
def test_every_numeric_option_refuses_nan_and_inf(cmd, flag, action):
    assert action.type in NUMBER_TYPES, f"ddl {cmd} {flag}: type {action.type} (use options.integer / real)"
    for bad in ("nan", "inf", "-inf", "1e999", "abc"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"got '{bad}'"):
            action.type(bad)


def test_coord_check_bound_nan_is_refused_with_the_flag_named(capsys):
    with pytest.raises(SystemExit) as e:
        main(["coord-check", "--bound", "nan"])
    assert e.value.code == 2
    assert "ddl coord-check: error: argument --bound: got 'nan'; allowed: a finite number" in capsys.readouterr().err


def test_scientific_notation_and_integers():
    args = PARSER.parse_args(["train", "--steps", "1e3", "--lr", "3E-4", "--batch-size", "8"])
    assert (args.steps, args.lr, args.batch_size) == (1000, 3e-4, 8) and isinstance(args.steps, int)
    assert parse_number("2.5e+2") == 250.0 and parse_number(".5") == 0.5
    for bad in ("1.5", "1e-3", "nan"):
        with pytest.raises(ValueError, match=f"got '{bad}'; allowed: an integer"):
            parse_number(bad, integer=True)


def test_set_reads_scientific_notation_and_refuses_nan():
    assert parse_assignments(["lr=1e-3", "steps=1e3", "betas=[0.9, 1e-1]", "out=runs/x"]) == {
        "lr": 1e-3, "steps": 1000, "betas": [0.9, 0.1], "out": "runs/x"}
    for item in ("lr=.nan", "lr=.inf", "betas=[0.9, .nan]"):
        with pytest.raises(ValueError, match="allowed: finite numbers"):
            parse_assignments([item])


def test_tasks_run_set_takes_scientific_notation():
    from deep_delta.experiments.settings import TaskSettings

    settings = TaskSettings().with_assignments(["lr=1e-3", "model.beta_init=5e-1"])
    assert settings.train["lr"] == 1e-3 and settings.train["model"]["beta_init"] == 0.5


def test_train_config_refuses_non_finite_numbers():
    from deep_delta.train.config import TrainConfig

    for name in ("weight_decay", "grad_clip", "lr"):
        with pytest.raises(ValueError, match=f"`{name}` got nan; allowed: a finite number"):
            TrainConfig(**{name: math.nan})


@pytest.mark.parametrize(("item", "said"), [
    ("model.vocab_size=abc", "DDLConfig: `vocab_size` got 'abc'; allowed: an integer"),
    ("lr=nan", "--lr got 'nan'"),  # the library's `lr`, shown as the command's flag
])
def test_tasks_run_bad_set_is_one_line_not_a_traceback(item, said, capsys):
    assert main(["tasks", "run", "flip-flop", "--seeds", "1", "--set", item]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddl tasks: error: ") and said in err and "Traceback" not in err


def test_every_integer_option_refuses_numbers_beyond_64_bits():
    integers = [a for _, _, a in OPTIONS if a.type in (options.integer, options.count)]
    assert len(integers) > 20
    for action in integers:
        with pytest.raises(argparse.ArgumentTypeError, match="at most 64 bits"):
            action.type("1e300")


@pytest.mark.parametrize("argv, said", [
    (["compare", "--seeds", "1e9"], "--seeds got a count of 1,000,000,000; allowed: at most 1000 seeds"),
    (["tasks", "run", "flip-flop", "--seeds", "5000"], "--seeds got a count of 5,000; allowed: at most 1000 seeds"),
    (["compare", "--step-costs", "ddl-cc=1e-300"], "--step-costs for 'ddl-cc' got 1e-300; allowed: a number in "
                                                   "[0.01, 100]"),
    (["train", "--steps", "1e10"], "TrainConfig: --steps got 10000000000; allowed: an integer >= 1 and <= 1,000,000,000"),
    (["train", "--set", "warmup_steps=1e300"], "TrainConfig: --warmup-steps got 1e+300; allowed: an integer"),
    (["bench", "--repeats", "1e12"], "--repeats got 1000000000000; allowed: an integer >= 1 and <= 1,000,000,000"),
])
def test_every_count_has_a_bound_that_names_itself(tmp_path, capsys, argv, said):
    """Counts that would run a loop for ever or fill the memory (a seed list of 1e9, 6e300 equal-cost steps) are
    one-line errors naming the option and its bound, before any work."""
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_steps_beyond_64_bits_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--steps", "1e300"])
    assert e.value.code == 2 and "--steps: got '1e300'; allowed: an integer of at most 64 bits" in capsys.readouterr().err


def test_an_option_given_twice_that_does_not_append_is_an_error(capsys):
    """`--lrs 1e-3 --lrs 2e-3` kept only the last grid; now any option that stores its value(s), in every
    command, refuses a second occurrence, and options that collect (`--set`, `--prompt`) still append."""
    from deep_delta.cli.main import _StoreOnce

    def walk(parser):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    yield from walk(sub)
            elif a.option_strings and a.nargs != 0 and not isinstance(a, (argparse._AppendAction,
                                                                           argparse._HelpAction,
                                                                           argparse._VersionAction)):
                yield a
    stores = list(walk(build_parser()))
    assert len(stores) > 100 and all(isinstance(a, _StoreOnce) for a in stores), [
        a.option_strings for a in stores if not isinstance(a, _StoreOnce)]
    for argv in (["compare", "--lrs", "1e-3", "--lrs", "2e-3"], ["train", "--steps", "3", "--steps", "4"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert f"argument {argv[1]}: given twice" in capsys.readouterr().err
    args = build_parser().parse_args(["train", "--set", "lr=1", "--set", "steps=2", "--steps", "3"])
    assert args.assignments == ["lr=1", "steps=2"] and args.steps == 3  # appends, and each parse starts afresh


@pytest.mark.parametrize("argv", [["train", "--set", "cuda_graphs="], ["bench", "--set", "cuda_graphs="],
                                  ["compare", "--set", "cuda_graphs=7"]])
def test_a_setting_with_choices_names_them(tmp_path, capsys, argv):
    """`--set cuda_graphs=` (YAML's null) once said "allowed: a string"; a setting with choices names them."""
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--cuda-graphs got" in err and "allowed: off | blocks | model" in err and err.count("\n") == 1, err
