"""Every command's setting flags come from its settings dataclass through one generator (`options.add_settings`):
a flag for each field, with the help written beside the field, and the flags given read back as the settings.

A field added to a settings class gets its flag here without another line; a flag written by hand beside one
(its help a second copy) fails `test_every_field_has_its_generated_flag`.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from deep_delta.cli import compare as compare_cli
from deep_delta.cli import options
from deep_delta.cli import tasks as tasks_cli
from deep_delta.cli.main import build_parser, command_parser, main
from deep_delta.data.settings import PrepareSettings
from deep_delta.eval.settings import BenchSettings, KernelBenchSettings
from deep_delta.experiments.settings import CoordCheckSettings, HeldOutSettings, TaskSettings
from deep_delta.train.config import TrainConfig
from deep_delta.train.recipes import compare, tasks

PARSER = build_parser()
# (command, its settings class, the fields it sets itself: no flag)
COMMANDS = [
    (("train",), TrainConfig, ()),
    (("compare",), TrainConfig, compare_cli.PER_RUN),
    (("compare",), HeldOutSettings, ()),
    (("bench",), BenchSettings, ()),
    (("bench-kernels",), KernelBenchSettings, ()),
    (("tasks", "run"), TaskSettings, ()),
    (("tasks", "run"), TrainConfig, tasks_cli._not_taken(TrainConfig)),  # the training fields a task run takes
    (("coord-check",), CoordCheckSettings, ()),
    (("data", "prepare"), PrepareSettings, ()),
]
IDS = [" ".join(path) for path, _, _ in COMMANDS]
# what each shared option says whatever the field (cli/options.py), before the field's note
SHARED_TEXT = {"device": options.DEVICE_HELP, "dtype": "compute dtype: autocast over float32 weights",
               "variants": "variants, space-separated, in table order"}


def is_mapping(cls, name: str) -> bool:
    kind = typing.get_type_hints(cls)[name]
    return (typing.get_origin(kind) or kind) is dict


def flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return parser._get_formatter()._expand_help(action)


@pytest.mark.parametrize("cls", sorted({c for _, c, _ in COMMANDS}, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_every_field_states_its_help(cls):
    """Made by `settings.setting`: the help sits beside the field (a mapping's says which --set fills it)."""
    for f in dataclasses.fields(cls):
        assert "help" in f.metadata, f"{cls.__name__}.{f.name}: no help (use deep_delta.settings.setting)"
        if f.name not in options.SHARED_SETTINGS:  # a shared option's text is the option's own; the field's a note
            assert f.metadata["help"], f"{cls.__name__}.{f.name}: empty help"
        if is_mapping(cls, f.name):
            # --set GROUP.NAME=VALUE, or --set NAME=VALUE for a mapping of settings by name (TaskSettings.train)
            assert f"--set {f.name}." in f.metadata["help"] or "--set NAME=VALUE" in f.metadata["help"], f.name


@pytest.mark.parametrize(("path", "cls", "skip"), COMMANDS, ids=IDS)
def test_every_field_has_its_generated_flag(path, cls, skip):
    parser = command_parser(PARSER, list(path))
    actions, shown = flag_actions(parser), parser.format_help()
    names = options.setting_names(cls, skip)
    assert names == [f.name for f in dataclasses.fields(cls) if f.name not in skip and not is_mapping(cls, f.name)]
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.name not in names:
            if f.name in skip:  # none, or the command's own (compare's --out: the comparison's directory)
                assert flag not in actions or actions[flag].help != f.metadata["help"], f"ddl {' '.join(path)} {flag}"
            else:
                assert flag not in actions, f"ddl {' '.join(path)} {flag}: a mapping is set with --set"
            continue
        assert flag in actions and flag in shown, f"ddl {' '.join(path)} has no {flag}"
        action = actions[flag]
        assert action.dest == f.name and action.default is argparse.SUPPRESS, (path, flag)
        text, note = expanded_help(parser, action), f.metadata["help"]
        if f.name in SHARED_TEXT:
            assert text.startswith(SHARED_TEXT[f.name]) and note in text, (path, flag, text)
        else:  # the field's help, then the default the command shows
            assert text == note or text.startswith(note + " (default "), (path, flag, text, note)
        choices = f.metadata.get("choices")
        if choices:
            assert action.choices == list(choices), (path, flag)
        if "metavar" in f.metadata:
            assert action.metavar == f.metadata["metavar"], (path, flag)


def test_compare_shows_the_defaults_of_its_recipe():
    parser = command_parser(PARSER, ["compare"])
    actions = flag_actions(parser)
    for name, value in compare().items():
        if name in options.setting_names(TrainConfig, compare_cli.PER_RUN):
            assert expanded_help(parser, actions["--" + name.replace("_", "-")]).endswith(f"(default {value})")
    assert actions["--out"].dest == "out" and actions["--out"].default == "runs/compare"  # the comparison's own


def given(argv: list[str], cls, skip=()) -> dict:
    return options.given_settings(PARSER.parse_args(argv), options.setting_names(cls, skip))


# what a command needs besides its optional flags, and the settings that gives
REQUIRED = {("tasks", "run"): (["recall"], {}), ("data", "prepare"): (["--out", "d"], {"out": "d"})}


@pytest.mark.parametrize(("path", "cls", "skip"), COMMANDS, ids=IDS)
def test_no_flag_given_leaves_every_setting_to_its_source(path, cls, skip):
    argv, needed = REQUIRED.get(path, ([], {}))
    assert given([*path, *argv], cls, skip) == needed


def test_train_flags_round_trip():
    from deep_delta.cli.train import config_from_args

    args = PARSER.parse_args(["train", "--steps", "7", "--betas", "0.8", "0.9", "--compile", "--peak-flops", "1e12",
                              "--dtype", "float32", "--data", "d", "--no-tensorboard", "--global-batch-size", "16"])
    assert config_from_args(args) == TrainConfig(steps=7, betas=(0.8, 0.9), compile=True, peak_flops=1e12,
                                                 dtype="float32", data="d", tensorboard=False, global_batch_size=16)


def test_compare_flags_round_trip_over_its_recipe():
    from deep_delta.train.config import load_config

    values = given(["compare", "--steps", "7", "--lr", "1e-3", "--keep", "3", "--weight-decay", "0"], TrainConfig,
                   compare_cli.PER_RUN)
    assert values == {"steps": 7, "lr": 1e-3, "keep": 3, "weight_decay": 0.0}
    assert load_config("compare", values) == TrainConfig(**{**compare(), **values})
    with pytest.raises(SystemExit):  # compare names each run itself
        PARSER.parse_args(["compare", "--wandb-run-name", "x"])


def test_bench_flags_round_trip():
    values = given(["bench", "--preset", "small", "--variants", "ddl-cc", "baseline", "ddl-cc", "--seed", "3",
                    "--compile", "--batch-size", "2", "--dtype", "bfloat16", "--decode-tokens", "0"], BenchSettings)
    assert BenchSettings(**values) == BenchSettings(preset="small", variants=["ddl-cc", "baseline"], seed=3,
                                                    compile=True, batch_size=2, dtype="bfloat16", decode_tokens=0)


def test_bench_kernels_flags_round_trip():
    values = given(["bench-kernels", "--skip-ops", "--no-compile", "--repeats", "3", "--seq-len", "8"],
                   KernelBenchSettings)
    assert KernelBenchSettings(**values) == KernelBenchSettings(skip_ops=True, compile=False, repeats=3, seq_len=8)
    assert KernelBenchSettings(**given(["bench-kernels"], KernelBenchSettings)).compile is None  # on CUDA only


def test_tasks_run_flags_round_trip():
    args = PARSER.parse_args(["tasks", "run", "recall", "--lr", "1e-3", "--betas", "0.8", "0.95", "--test-seed", "7",
                              "--batch-size", "4"])
    values = options.given_settings(args, tasks_cli.setting_names())
    assert values == {"lr": 1e-3, "betas": [0.8, 0.95], "test_seed": 7, "batch_size": 4}
    settings = TaskSettings().with_values(**values)
    assert settings == TaskSettings(test_seed=7, train={"lr": 1e-3, "betas": [0.8, 0.95], "batch_size": 4})
    assert settings.train["steps"] == 1000 and settings.train["model"]["hidden_size"] == 64  # the recipe tasks'


def test_tasks_run_shows_the_defaults_of_its_recipe():
    parser = command_parser(PARSER, ["tasks", "run"])
    actions = flag_actions(parser)
    for name, value in tasks().items():
        if name != "model":
            shown = " ".join(map(str, value)) if isinstance(value, tuple) else value
            assert expanded_help(parser, actions["--" + name.replace("_", "-")]).endswith(f"(default {shown})")
    for name in ("seed", "seq_len", "dtype", "save_every", "compile", "on_divergence"):  # what a task run sets
        assert options.setting_names(TrainConfig, tasks_cli._not_taken(TrainConfig)).count(name) == 0
        assert "--" + name.replace("_", "-") not in actions


def test_data_prepare_flags_round_trip():
    values = given(["data", "prepare", "--out", "d", "--shard-tokens", "10k", "--max-tokens", "1B", "--num-proc", "4",
                    "--val-fraction", "0.05", "--text-suffixes", ".py", ".md", "--no-progress", "--overwrite",
                    "--tokenizer", "gpt2", "--bpe-file", "v.bpe"], PrepareSettings)
    assert PrepareSettings(**values) == PrepareSettings(
        out="d", shard_tokens=10_000, max_tokens=10**9, num_proc=4, val_fraction=0.05, text_suffixes=(".py", ".md"),
        progress=False, overwrite=True, tokenizer="gpt2", bpe_file="v.bpe")


def test_coord_check_flags_round_trip():
    values = given(["coord-check", "--seeds", "2", "--widths", "32", "64", "--parametrizations", "mup", "--device",
                    "cpu", "--head-dim", "16"], CoordCheckSettings)
    assert values["seeds"] == [0, 1]  # --seeds N: seeds 0..N-1, as everywhere
    assert CoordCheckSettings(**values) == CoordCheckSettings(widths=[32, 64], parametrizations=["mup"],
                                                              seeds=[0, 1], device="cpu", head_dim=16)


@pytest.mark.parametrize("argv, said", [
    (["compare", "--report-only", "--weight-decay", "0.2", "--no-compile"],
     "--report-only trains nothing, but got --weight-decay, --compile"),
    (["compare", "--wandb-project", "p", "--wandb-group", "g"],
     "--wandb-project, --wandb-group given, but W&B logging is off; add --wandb"),
    (["tasks", "run", "recall", "--lr", "1e-3", "--lrs", "1e-3", "2e-3"],
     "--lrs got 0.001 0.002 together with one learning rate (--lr 0.001)"),
])
def test_generated_flags_keep_the_commands_refusals(argv, said, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
