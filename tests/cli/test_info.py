"""``ddl info``: the configuration and the parameter count of every variant, run in-process."""

from __future__ import annotations

import json
import re

import pytest

from deep_delta.cli.main import main

# the authors' baselines, tied embeddings counted once (SPEC section 2)
PAPER_BASELINE = {"small": 123_590_400, "medium": 353_508_352}


def info(capsys, *argv: str) -> str:
    assert main(["info", *argv]) == 0
    return capsys.readouterr().out


def parameters(out: str) -> int:
    m = re.search(r"^parameters ([\d,]+) ", out, flags=re.M)
    assert m, out
    return int(m.group(1).replace(",", ""))


def field(out: str, name: str) -> str:
    m = re.search(rf"^\s+{name}\s+(\S+)$", out, flags=re.M)
    assert m, f"{name} not printed:\n{out}"
    return m.group(1)


@pytest.mark.parametrize("preset,nominal", [("small", 124e6), ("medium", 353e6)])
def test_baseline_parameter_counts_match_the_paper(capsys, preset, nominal):
    out = info(capsys, "--variant", "baseline", "--preset", preset)
    n = parameters(out)
    assert n == PAPER_BASELINE[preset]
    assert abs(n - nominal) / nominal < 0.01
    assert "+0 = +0.000% vs baseline" in out
    assert out.startswith("variant   baseline (Baseline)\npreset    " + preset)


def test_prints_the_configuration(capsys):
    out = info(capsys, "--variant", "ddl-cc", "--preset", "small")
    expected = {"hidden_size": "768", "num_hidden_layers": "12", "num_attention_heads": "6", "head_dim": "128",
                "intermediate_size": "2048", "vocab_size": "50304", "residual": "delta", "value_channels": "4",
                "compressor": "channel", "compressor_kernel_size": "4", "state_init": "conv", "beta_init": "1.0"}
    for name, value in expected.items():
        assert field(out, name) == value, name
    assert "DDL-CC" in out.splitlines()[0]


@pytest.mark.parametrize(
    "variant,low,high",
    [("ddl-dv1", 0.025, 0.035), ("ddl-cc", 0.05, 0.2), ("ddl-cc-noec", 0.05, 0.2), ("ddl-tc", 0.15, 0.25),
     ("ddl-tc-noec", 0.15, 0.25)],
)
def test_ddl_overhead_at_small(capsys, variant, low, high):
    # SPEC: DDL adds 0.03% (d_v = 1) to ~0.2% (TC) parameters at small
    out = info(capsys, "--variant", variant, "--preset", "small")
    n = parameters(out)
    extra = 100 * (n - PAPER_BASELINE["small"]) / PAPER_BASELINE["small"]
    assert low <= extra <= high, extra
    assert f"{extra:+.3f}% vs baseline" in out


@pytest.mark.parametrize("variant,kind,dynamic", [("hc", "hc", "True"), ("mhc-static", "mhc", "False")])
def test_hyper_variants_print_their_fields(capsys, variant, kind, dynamic):
    out = info(capsys, "--variant", variant, "--preset", "small")
    assert (field(out, "residual"), field(out, "hc_kind"), field(out, "hc_dynamic")) == ("hyper", kind, dynamic)
    assert (field(out, "hc_streams"), field(out, "hc_sinkhorn_iters")) == ("4", "20")
    assert not re.search(r"^\s+value_channels ", out, flags=re.M)  # DDL's fields are not theirs
    assert parameters(out) > PAPER_BASELINE["small"]


def test_json_output(capsys):
    cfg = json.loads(info(capsys, "--variant", "ddl-tc", "--preset", "tiny", "--json"))
    assert cfg["variant"] == "ddl-tc" and cfg["preset"] == "tiny"
    assert cfg["value_channels"] == 4 and cfg["compressor"] == "token" and cfg["hidden_size"] == 256
    assert isinstance(cfg["parameters"], int) and cfg["parameters"] > 0


def test_json_count_equals_an_instantiated_model(capsys):
    from deep_delta import DDLConfig, DDLForCausalLM

    cfg = json.loads(info(capsys, "--variant", "ddl-cc", "--preset", "tiny", "--json"))
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny"))
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}  # tied embedding once
    assert cfg["parameters"] == sum(unique.values())


@pytest.mark.parametrize("argv,message", [
    (["--preset", "huge"], r"argument --preset: invalid choice: 'huge'"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["info", *argv])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_an_unknown_variant_is_refused_naming_the_variants(capsys):
    """--variant takes a design of the user's own's variants too (its module imported first), so the name is checked
    when the model is built: one line, exit 2, the shipped variants listed."""
    assert main(["info", "--variant", "ddl-x"]) == 2
    err = capsys.readouterr().err
    assert "--variant got 'ddl-x'; allowed: baseline | ddl-dv1" in err and err.count("\n") == 1


@pytest.mark.parametrize("variant", ["ddl-cc", "ddl-tc-write", "ddl-dv1-vmap", "hc", "mhc-static"])
def test_every_field_a_variant_sets_is_listed(capsys, variant):
    """T8: `ddl info --variant ddl-cc-write` and `--variant ddl-cc` differed only in their header line: the update
    rule was not listed. Every field of the variant's row in the table, and any field in which it differs from the
    baseline, is listed with its value."""
    from deep_delta.models import DDLConfig
    from deep_delta.variants import VARIANTS

    out = info(capsys, "--variant", variant)
    cfg, base = DDLConfig.from_variant(variant, "tiny").to_dict(), DDLConfig.from_variant("baseline", "tiny").to_dict()
    for name in {*VARIANTS[variant], *(k for k in cfg if k != "variant" and cfg[k] != base.get(k))}:
        assert field(out, name) == str(cfg[name]), name
    if "write" in variant:
        assert field(out, "update_rule") == "write"
