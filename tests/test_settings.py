"""One type check for every settings dataclass (deep_delta.settings.check_fields): the annotations decide."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest

from deep_delta.eval.settings import BenchSettings, KernelBenchSettings
from deep_delta.experiments.settings import TRAIN_FIELDS, CoordCheckSettings, TaskSettings
from deep_delta.settings import check_fields
from deep_delta.tasks import get_task
from deep_delta.train.config import TrainConfig

SETTINGS = [TrainConfig, BenchSettings, KernelBenchSettings, CoordCheckSettings]  # TaskSettings: its own tests


def fields_of(cls, kind) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] == kind]


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_every_settings_class_checks_its_annotated_types(cls):
    ints, floats = fields_of(cls, int), fields_of(cls, float)
    assert ints and (floats or cls is BenchSettings or cls is KernelBenchSettings)
    for name in ints:
        with pytest.raises(ValueError, match=rf"^{cls.__name__}: `{name}` got 'ten'; allowed: an integer"):
            cls(**{name: "ten"})
        with pytest.raises(ValueError, match=rf"`{name}` got True; allowed: an integer"):
            cls(**{name: True})
    for name in floats:
        with pytest.raises(ValueError, match=rf"^{cls.__name__}: `{name}` got nan; allowed: a finite number"):
            cls(**{name: math.nan})
        needs = {"optimizer": "muon"} if name == "adamw_lr_ratio" else {}  # a setting of the Muon optimizer
        assert getattr(cls(**{name: "1e-1"}, **needs), name) == 0.1  # YAML 1.1 reads 1e-1 as a string
    with pytest.raises(ValueError, match=r"`model` got \[\]; allowed: a mapping"):
        cls(model=[])


def test_values_take_their_canonical_form():
    cfg = TrainConfig(lr=1, betas=[0.8, 0.9], data=Path("d"), peak_flops=2)
    assert (cfg.lr, cfg.betas, cfg.data, cfg.peak_flops) == (1.0, (0.8, 0.9), "d", 2.0)
    assert isinstance(cfg.lr, float) and TaskSettings(train={"betas": (0.9, 0.99)}).train["betas"] == [0.9, 0.99]
    for bad, said in (([0.9], "a list of 2 numbers"), ("x", "a list of 2 numbers"), ([0.9, "a"], "a list of 2")):
        with pytest.raises(ValueError, match=f"`betas` got .*; allowed: {said}"):
            TrainConfig(betas=bad)
    with pytest.raises(ValueError, match="`data` got 3; allowed: a string or null"):
        TrainConfig(data=3)
    with pytest.raises(ValueError, match="`widths` got 'abc'; allowed: a list of integers"):
        CoordCheckSettings(widths="abc")


def test_an_annotation_without_a_check_is_a_bug_not_a_pass():
    @dataclasses.dataclass
    class Odd:
        x: set = dataclasses.field(default_factory=set)

    with pytest.raises(NotImplementedError, match="no check for the annotation"):
        check_fields(Odd())


def test_declared_in_checks_only_the_fields_a_class_declares():
    """DDLConfig's case: a dataclass over a library's class checks its own fields and leaves the inherited ones
    (here an annotation check_fields has no check for) to the library."""

    @dataclasses.dataclass
    class Library:
        tags: set = dataclasses.field(default_factory=set)

    @dataclasses.dataclass
    class Ours(Library):
        width: int = 8
        scale: float = 1

    ours = Ours(scale="1e-1")
    check_fields(ours, declared_in=Ours)
    assert ours.scale == 0.1
    with pytest.raises(ValueError, match=r"^Ours: `width` got 'wide'; allowed: an integer$"):
        check_fields(Ours(width="wide"), declared_in=Ours)


def test_ddl_train_has_one_flag_per_field_with_the_help_kept_beside_the_field():
    import argparse

    from deep_delta.cli.main import build_parser, command_parser

    train = command_parser(build_parser(), ["train"])
    group = next(g for g in train._action_groups if g.title.startswith("settings"))
    flags = {a.option_strings[0]: a for a in group._group_actions}
    fields = [f for f in dataclasses.fields(TrainConfig) if f.name != "model"]
    assert sorted(flags) == sorted("--" + f.name.replace("_", "-") for f in fields)
    for f in fields:
        a = flags["--" + f.name.replace("_", "-")]
        assert f.metadata["help"] in a.help and a.default == argparse.SUPPRESS, f.name
        if "choices" in f.metadata:
            assert list(a.choices) == list(f.metadata["choices"]), f.name
    args = train.parse_args(["--lr", "2e-3", "--betas", "0.8", "0.9", "--no-compile", "--peak-flops", "1e12"])
    assert (args.lr, args.betas, args.compile, args.peak_flops) == (2e-3, [0.8, 0.9], False, 1e12)


def test_set_fills_one_entry_of_a_group_and_refuses_mixing_a_group_with_a_value():
    from deep_delta.settings import parse_assignments

    assert parse_assignments(["model.hidden_size=8", "task.num_cups=3"]) == {
        "model": {"hidden_size": 8}, "task.num_cups": 3}
    assert parse_assignments(["model.hidden_size=8", "task.num_cups=3"], groups=("model", "task")) == {
        "model": {"hidden_size": 8}, "task": {"num_cups": 3}}
    with pytest.raises(ValueError, match=r"got 'model.x=1' after model=5; allowed: one of model=MAPPING"):
        parse_assignments(["model=5", "model.x=1"])  # before: a TypeError


@pytest.mark.parametrize(("item", "said"), [
    ("lr=0", "TrainConfig: `lr` got 0.0; allowed: a float > 0"),  # the training fields: TrainConfig's checks
    ("grad_clip=-1", "`grad_clip` got -1.0; allowed: a float >= 0"),
    ("min_lr_ratio=2", "`min_lr_ratio` got 2.0; allowed: a float in [0, 1]"),
    ("betas=[0.9]", "`betas` got [0.9]; allowed: a list of 2 numbers"),
    ("steps=ten", "`steps` got 'ten'; allowed: an integer"),
    ("test_size=0", "TaskSettings: `test_size` got 0; allowed: an integer >= 1"),
    ("eval_size=ten", "TaskSettings: `eval_size` got 'ten'; allowed: an integer"),
    ("model=5", "got 'model=5': no setting 'model'"),
    ("model={bogus: 1}", "got 'model={bogus: 1}': DDLConfig has no field 'bogus'"),
    ("stepz=3", "got 'stepz=3': no setting 'stepz'; allowed: batch_size, betas, eval_every, eval_size"),
    ("seed=3", "no setting 'seed'"),  # a TrainConfig field a task run sets itself (--seeds: the paired seeds)
    ("compile=true", "no setting 'compile'"),
])
def test_task_settings_name_the_field_in_every_error(item, said):
    with pytest.raises(ValueError) as error:
        TaskSettings().with_assignments([item])
    assert said in str(error.value)


def test_task_settings_take_model_and_task_entries():
    s = TaskSettings().with_assignments(["model.hidden_size=32", "task.num_cups=3", "betas=[0.8, 0.9]"])
    assert s.train["model"] == {**TaskSettings().train["model"], "hidden_size": 32} and s.task == {"num_cups": 3}
    assert s.train["betas"] == [0.8, 0.9]


def test_task_settings_take_the_training_fields_from_the_recipe_tasks_and_train_config():
    from deep_delta.train.recipes import tasks

    s = TaskSettings()
    assert list(s.train) == list(TRAIN_FIELDS)
    for name in TRAIN_FIELDS:  # the recipe's value, else TrainConfig's default
        expected = tasks().get(name, TrainConfig.defaults()[name])
        assert s.train[name] == (list(expected) if isinstance(expected, tuple) else expected), name
    # what a stored result's identity holds: every setting by name, as before TaskSettings took TrainConfig's fields
    assert s.to_dict() == {
        "preset": "tiny", "steps": 1000, "batch_size": 32, "lr": 0.002, "warmup_steps": 50, "min_lr_ratio": 0.1,
        "weight_decay": 0.1, "betas": [0.9, 0.98], "grad_clip": 1.0, "log_every": 25, "eval_every": 200,
        "eval_size": 500, "test_size": 2000, "test_seed": 1234,
        "model": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "initializer_range": 0.3},
        "task": {}}
    run = s.with_values(lr=1e-3).train_config(get_task("recall"), "ddl-cc", 3, "cpu")
    assert (run.variant, run.seed, run.lr, run.seq_len, run.dtype, run.save_every, run.on_divergence) == (
        "ddl-cc", 3, 1e-3, get_task("recall").seq_len, "float32", 0, "stop")
    with pytest.raises(ValueError, match=r"^TaskSettings: `train` got 'compile'; allowed: preset, steps"):
        TaskSettings(train={"compile": True})  # nothing a task run would ignore
    with pytest.raises(ValueError, match=r"^TaskSettings: `model` got 5; allowed: a mapping"):
        TaskSettings(train={"model": 5})
    with pytest.raises(ValueError, match=r"^TaskSettings: no setting 'seed'; allowed: batch_size, betas"):
        s.with_values(seed=3)
