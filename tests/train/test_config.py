from __future__ import annotations

import pytest

from deep_delta.train import TrainConfig, available_configs, load_config, resolve_config
from deep_delta.train.config import config_root


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

    for preset in ("tiny", "small", "medium"):
        for v in VARIANTS:
            assert f"{preset}/{v}" in names
    for n in names:
        c = load_config(n)
        assert c.preset == n.split("/")[0] and c.variant == n.split("/")[1]
        assert c.out == f"runs/{n}"
    assert len(names) == 3 * len(VARIANTS)
    assert resolve_config("small/ddl-cc") == config_root() / "small.yaml"
    assert resolve_config("small/ddl-cc.yaml") == resolve_config("small/ddl-cc")
    assert load_config("small").variant == "baseline"  # a recipe alone: the variant is the default or a flag
    for bad in ("large/ddl-cc", "small/ddl-xx"):
        with pytest.raises(FileNotFoundError, match="not a shipped config name; shipped: RECIPE or RECIPE/VARIANT"):
            resolve_config(bad)


def test_recipes_are_the_one_source_of_the_shipped_settings():
    """A shipped name differs from its recipe in variant and out only."""
    import yaml

    for n in available_configs():
        recipe, variant = n.split("/")
        plain = TrainConfig.from_yaml(config_root() / f"{recipe}.yaml").to_dict()
        named = load_config(n).to_dict()
        assert {k for k in named if named[k] != plain[k]} <= {"variant", "out"}
        assert "variant" not in yaml.safe_load((config_root() / f"{recipe}.yaml").read_text())


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
