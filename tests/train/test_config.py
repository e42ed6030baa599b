from __future__ import annotations

import pytest

from deep_delta.train import TrainConfig, available_configs, load_config
from deep_delta.train.recipes import RECIPES

# TrainConfig's defaults, and what each shipped recipe changes, as the YAML recipes (deep_delta/configs/*.yaml)
# and COMPARE_DEFAULTS gave them before the recipes became Python functions; a recipe or a default that moves
# fails here.
DEFAULTS = {
    "variant": "baseline", "preset": "tiny", "model": {}, "data": None, "out": "runs/train", "steps": 1000,
    "batch_size": 8, "grad_accum": 1, "global_batch_size": None, "seq_len": 256, "lr": 0.001, "min_lr_ratio": 0.1,
    "warmup_steps": 100, "optimizer": "adamw", "adamw_lr_ratio": 1.0, "weight_decay": 0.1, "betas": [0.9, 0.95],
    "grad_clip": 1.0, "on_divergence": "raise", "eval_every": 250,
    "eval_batches": 20, "eval_windows": "spread", "save_every": 1000, "keep": 2, "log_every": 10, "seed": 0,
    "device": "auto",
    "dtype": "auto", "compile": False, "cuda_graphs": "off", "activation_checkpointing": False, "distributed": "auto",
    "tensorboard": False, "peak_flops": None, "wandb": False, "wandb_project": None, "wandb_run_name": None,
    "wandb_group": None,
}
PAPER = {"model": {"parametrization": "mup", "mup_base_width": 256}, "data": "data/fineweb-edu-gpt2",
         "steps": 100000, "global_batch_size": 480, "seq_len": 1024, "warmup_steps": 2000, "eval_every": 1000,
         "eval_batches": 100, "save_every": 5000}
PINNED = {
    "tiny": {"steps": 600, "batch_size": 16, "seq_len": 128, "warmup_steps": 50, "eval_every": 100,
             "save_every": 200},
    "small": {**PAPER, "preset": "small", "batch_size": 20},
    "medium": {**PAPER, "preset": "medium", "batch_size": 10},
    "compare": {"steps": 600, "batch_size": 16, "seq_len": 64, "lr": 0.002, "warmup_steps": 60, "eval_every": 100,
                "eval_batches": 16, "save_every": 100, "keep": 1, "log_every": 5},
    # TaskSettings' own fields before ddl tasks run took TrainConfig's flags (width 64, embeddings at std 0.3)
    "tasks": {"model": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "initializer_range": 0.3},
              "batch_size": 32, "lr": 0.002, "warmup_steps": 50, "betas": [0.9, 0.98], "log_every": 25,
              "eval_every": 200},
    "deep12": {"model": {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 2,
                         "max_position_embeddings": 256, "vocab_size": 257, "embed_norm": True},
               "steps": 300, "batch_size": 16, "warmup_steps": 30, "eval_every": 50,
               "eval_batches": 16, "save_every": 50, "keep": 1, "compile": True},
    "debug": {"model": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                        "max_position_embeddings": 64},
              "steps": 6, "batch_size": 4, "seq_len": 32, "warmup_steps": 2, "eval_every": 3, "eval_batches": 2,
              "save_every": 3},
}


def test_defaults_match_the_brief():
    c = TrainConfig()
    assert (c.lr, c.weight_decay, c.betas, c.grad_clip) == (1e-3, 0.1, (0.9, 0.95), 1.0)
    assert (c.device, c.dtype, c.distributed, c.compile, c.tensorboard) == ("auto", "auto", "auto", False, False)


def test_yaml_then_overrides_then_set(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("variant: ddl-tc\nsteps: 50\nlr: 3e-4\nmodel:\n  hidden_size: 64\n")
    c = load_config(f, {"steps": 70}, ["model.num_hidden_layers=2", "betas=[0.8, 0.9]", "compile=true"])
    assert c.variant == "ddl-tc" and c.steps == 70 and c.lr == 3e-4  # "3e-4" (YAML 1.1 string) read as float
    assert c.model == {"hidden_size": 64, "num_hidden_layers": 2}
    assert c.betas == (0.8, 0.9) and c.compile is True


@pytest.mark.parametrize(
    "text, match",
    [
        ("lerning_rate: 0.1\n", r"unknown key\(s\) \['lerning_rate'\].*allowed keys: variant"),
        ("model:\n  hiden_size: 3\n", r"unknown model field\(s\) \['hiden_size'\]"),
        ("steps: ten\n", r"`steps` got 'ten'; allowed: an integer"),
        ("steps: 0\n", r"`steps` got 0; allowed: an integer >= 1"),
        ("compile: 1\n", r"`compile` got 1; allowed: true or false"),
        ("variant: ddl-xx\n", r"`variant` got 'ddl-xx'; allowed: baseline \| ddl-dv1"),
        ("betas: [0.9]\n", r"`betas` got \[0.9\]"),
        ("dtype: fp16\n", r"`dtype` got 'fp16'; allowed: auto \| float32 \| bfloat16"),
        ("- a\n- b\n", r"expected a mapping"),
    ],
)
def test_bad_yaml_is_refused_with_the_key_named(tmp_path, text, match):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_yaml(f)


def test_unknown_override_refused():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['stepz'\]"):
        TrainConfig().with_overrides(["stepz=3"])
    with pytest.raises(ValueError, match="^`assignments` got 'steps'; allowed: KEY=VALUE"):
        TrainConfig().with_overrides(["steps"])


def test_global_batch_size_derives_accumulation():
    c = TrainConfig(batch_size=20, global_batch_size=480)
    assert [c.accumulation(w) for w in (1, 2, 4, 8)] == [24, 12, 6, 3]
    with pytest.raises(ValueError, match=r"`global_batch_size` got 480.*batch_size \(20\) x processes \(5\)"):
        c.accumulation(5)
    assert TrainConfig(grad_accum=3).accumulation(4) == 3


def test_every_shipped_config_loads_and_names_resolve():
    names = available_configs()
    from deep_delta.variants import VARIANTS

    for recipe in ("debug", "tiny", "compare", "tasks", "small", "medium"):
        for v in VARIANTS:
            assert f"{recipe}/{v}" in names
    for n in names:
        c = load_config(n)
        assert c.variant == n.split("/")[1] and c.out == f"runs/{n}"
    assert len(names) == len(RECIPES) * len(VARIANTS)
    assert load_config("small").variant == "baseline"  # a recipe alone: the variant is the default or a flag
    for bad in ("large/ddl-cc", "small/ddl-xx", "small/ddl-cc.yaml", "configs/small.yaml"):
        with pytest.raises(FileNotFoundError, match="not a shipped config name; shipped: RECIPE or RECIPE/VARIANT "
                           "with RECIPE one of compare, debug, deep12, medium, small, tasks, tiny and VARIANT one of attnres, attnres-block, "
                           "baseline"):
            load_config(bad)


def test_recipes_give_the_settings_the_yaml_recipes_gave():
    """Every RECIPE/VARIANT is the pinned recipe with its variant and run directory; a recipe states only what
    differs from the defaults."""
    assert TrainConfig.defaults() == DEFAULTS == TrainConfig().to_dict()
    assert set(RECIPES) == set(PINNED)
    for n in available_configs():
        recipe, variant = n.split("/")
        assert load_config(n).to_dict() == {**DEFAULTS, **PINNED[recipe], "variant": variant, "out": f"runs/{n}"}
    for name, make in RECIPES.items():
        assert load_config(name).to_dict() == {**DEFAULTS, **PINNED[name]}
        stated = make()
        assert "variant" not in stated and "out" not in stated
        assert all(value != DEFAULTS[key] for key, value in stated.items()), name


def test_a_users_yaml_file_is_read_and_checked(tmp_path):
    f = tmp_path / "small"  # a file wins over the recipe of the same name
    f.write_text("preset: medium\nsteps: 7\n")
    c = load_config(f)
    assert (c.preset, c.steps, c.seq_len) == ("medium", 7, 256)
    f.write_text("stepz: 7\n")
    with pytest.raises(ValueError, match=rf"TrainConfig \(from {f}\): unknown key\(s\) \['stepz'\]"):
        load_config(f)


@pytest.mark.parametrize("preset", ["small", "medium"])
def test_paper_configs_follow_section_5_1(preset):
    for v in ("baseline", "ddl-dv1", "ddl-tc", "ddl-cc", "ddl-tc-noec", "ddl-cc-noec", "ddl-dv1-vmap"):
        c = load_config(f"{preset}/{v}")
        assert c.steps == 100_000 and c.seq_len == 1024 and c.global_batch_size == 480
        assert c.accumulation(4) * c.batch_size * 4 == 480  # the paper's 4 GPUs
        assert (c.lr, c.warmup_steps, c.weight_decay, c.betas, c.grad_clip) == (1e-3, 2000, 0.1, (0.9, 0.95), 1.0)
        assert c.dtype == "auto"  # bf16 autocast on CUDA
        # 100,000 x 480 x 1,024 = 49.15B tokens
        assert c.steps * c.global_batch_size * c.seq_len == 49_152_000_000


def test_a_named_variants_update_rule_is_not_overridden(tmp_path, capsys):
    """T11: `--set model.update_rule=write` trained write-only twins under the DDL variants' names (the run's
    banner, the comparison's rows, the export's title said DDL-CC). Refused before anything is written, naming the
    variant with that rule; a variant's own rule is accepted."""
    from deep_delta.cli.main import main

    assert TrainConfig(variant="ddl-cc-write", model={"update_rule": "write"}).model == {"update_rule": "write"}
    with pytest.raises(ValueError, match=r"`update_rule` got 'delta', but 'ddl-cc-write' \(DDL-CC write-only\) has "
                                         r"'write'.*the variant 'ddl-cc' by name"):
        TrainConfig(variant="ddl-cc-write", model={"update_rule": "delta"})
    for argv in (["train", "--config", "debug/ddl-dv1", "--out", str(tmp_path / "t")],
                 ["compare", "--config", "debug", "--variants", "ddl-cc", "ddl-cc-write", "--out", str(tmp_path / "c")]):
        assert main([*argv, "--set", "model.update_rule=write"]) == 2
        err = capsys.readouterr().err
        assert "`update_rule` got 'write'" in err and "-write" in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("variant, sets, names", [
    ("baseline", ["model.output_norm=true"], "'peri-ln' by name"),                       # V1
    ("baseline", ["model.residual=delta"], "'ddl-dv1' by name"),                         # V3
    ("attnres", ["model.attnres_blocks=1"], "'attnres-block' by name"),                # B4
    ("attnres-block", ["model.attnres_blocks=null"], "'attnres' by name"),               # B4
])
def test_a_design_under_another_name_is_refused_by_ddl_train(tmp_path, capsys, variant, sets, names):
    """Round 6's V1, V3, B4: a residual setting of another design or variant under the first's name trained and was
    recorded as the named variant. `ddl train` refuses it before anything is written, in one line naming the
    setting and the variant that has it."""
    from deep_delta.cli.main import main

    args = ["train", "--config", f"debug/{variant}", "--steps", "2", "--threads", "1", "--no-progress",
            "--out", str(tmp_path / "t")]
    assert main([*args, *[x for s in sets for x in ("--set", s)]]) == 2
    err = capsys.readouterr().err
    assert "a run is the design its variant names" in err and names in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists()


def test_two_variants_made_the_same_model_are_refused_by_ddl_compare(tmp_path, capsys):
    """Round 6's V5: `ddl compare --variants baseline peri-ln --set model.output_norm=true` reported two Peri-LN models,
    one labelled Baseline, "the same". Refused before anything trains: the baseline's run is not the baseline."""
    from deep_delta.cli.main import main

    argv = ["compare", "--config", "debug/baseline", "--variants", "baseline", "peri-ln", "--set",
            "model.output_norm=true", "--steps", "3", "--threads", "1", "--no-progress", "--time-repeats", "0",
            "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "`output_norm` got True, but 'baseline' (Baseline) has False" in err and "'peri-ln' by name" in err
    assert not (tmp_path / "c").exists()


def test_a_setting_the_model_does_not_have_is_refused_by_ddl_train(tmp_path, capsys):
    """Round 6's B5: `--set model.attnres_blocks=4` on the baseline, `--set model.beta_init=0.5` on Peri-LN were
    ignored and recorded. Refused in one line naming the setting and the design it belongs to."""
    from deep_delta.cli.main import main

    for variant, setting, design in (("baseline", "model.hc_streams=2", "hyper"),
                                     ("peri-ln", "model.beta_init=0.5", "delta")):
        argv = ["train", "--config", f"debug/{variant}", "--set", setting, "--steps", "2", "--threads", "1",
                "--no-progress", "--out", str(tmp_path / variant)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"it is a setting of the design {design!r}, which this model does not have" in err, err
        assert err.count("\n") == 1 and not (tmp_path / variant).exists()
