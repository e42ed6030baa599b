"""DDLConfig: the variant table, the presets, and errors that name the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from deep_delta import DDLConfig
from deep_delta.variants import DEFAULT_VARIANTS, PAPER_NAMES, PRESETS, VARIANTS

# SPEC section 2: name -> (d_v, compressor, EC)
TABLE = {
    "baseline": (1, "none", False),
    "ddl-dv1": (1, "none", False),
    "ddl-dv1-vmap": (1, "none", False),
    "ddl-tc": (4, "token", True),
    "ddl-cc": (4, "channel", True),
    "ddl-tc-noec": (4, "token", False),
    "ddl-cc-noec": (4, "channel", False),
    # the write-only controls (issue 48): their DDL variant's shape, update_rule="write"
    "ddl-dv1-write": (1, "none", False),
    "ddl-tc-write": (4, "token", True),
    "ddl-cc-write": (4, "channel", True),
    # the untied gates (issue 56): their DDL variant's shape, update_rule="untied"
    "ddl-dv1-untied": (1, "none", False),
    "ddl-tc-untied": (4, "token", True),
    "ddl-cc-untied": (4, "channel", True),
}


# the rivals (issue 12, docs/rivals.md): name -> (hc_kind, hc_dynamic)
HYPER = {"hc": ("hc", True), "hc-static": ("hc", False), "mhc": ("mhc", True), "mhc-static": ("mhc", False)}
# the rivals of issue 56: Peri-LN (the baseline with an output norm) and Attention Residuals (name -> blocks)
PERI = {"peri-ln"}
ATTNRES = {"attnres": None, "attnres-block": 8}


def test_variant_table_matches_the_spec():
    assert set(VARIANTS) == set(TABLE) | set(HYPER) | PERI | set(ATTNRES) == set(PAPER_NAMES)
    assert set(PRESETS) == {"tiny", "small", "medium"}
    for name, (dv, compressor, ec) in TABLE.items():
        cfg = DDLConfig.from_variant(name)
        assert (cfg.value_channels, cfg.compressor, cfg.state_init == "conv") == (dv, compressor, ec), name
        assert cfg.residual == ("additive" if name == "baseline" else "delta")
        assert cfg.residual_map == ("v" if name == "ddl-dv1-vmap" else "k")
        assert cfg.variant == name and cfg.preset == "tiny"
        assert cfg.update_rule == (name.rsplit("-", 1)[1] if name.endswith(("-write", "-untied")) else "delta")
        assert not cfg.output_norm and cfg.attnres_blocks is None
        # authors' defaults
        assert (cfg.k_eps, cfg.value_scale, cfg.beta_init, cfg.gate) == (1e-5, 4.0, 1.0, "linear")
        if compressor == "token":
            assert cfg.compressor_kernel_size == 4
        if compressor == "channel":
            assert cfg.compressor_kernel_size == dv
        if ec:
            assert cfg.embed_conv_kernel_size == 4
    for name, (kind, dynamic) in HYPER.items():
        cfg = DDLConfig.from_variant(name)
        assert (cfg.residual, cfg.hc_kind, cfg.hc_dynamic, cfg.hc_streams, cfg.hc_sinkhorn_iters) == (
            "hyper", kind, dynamic, 4, 20)
        assert (cfg.value_channels, cfg.compressor, cfg.state_init) == (1, "none", "repeat")
    peri, base = DDLConfig.from_variant("peri-ln").to_dict(), DDLConfig.from_variant("baseline").to_dict()
    assert {k for k in peri if peri[k] != base[k]} == {"variant", "output_norm", "embed_norm"}  # nothing else differs
    for name, blocks in ATTNRES.items():
        cfg = DDLConfig.from_variant(name)
        assert (cfg.residual, cfg.attnres_blocks, cfg.value_channels, cfg.update_rule) == ("attnres", blocks, 1, "delta")


def test_default_variants_are_the_main_four_in_table_order():
    assert DEFAULT_VARIANTS == ("baseline", "ddl-dv1", "ddl-tc", "ddl-cc")
    assert [v for v in VARIANTS if v in DEFAULT_VARIANTS] == list(DEFAULT_VARIANTS)


@pytest.mark.parametrize(
    "preset,d,layers,heads,ffn",
    [("tiny", 256, 4, 4, 682), ("small", 768, 12, 6, 2048), ("medium", 1024, 24, 8, 2730)],
)
def test_presets(preset, d, layers, heads, ffn):
    cfg = DDLConfig.from_variant("ddl-cc", preset)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (
        d, layers, heads, ffn)
    if preset != "tiny":
        assert cfg.head_dim == 128 and cfg.vocab_size == 50304 and cfg.max_position_embeddings == 1024
    assert cfg.rope_theta == 10000.0 and cfg.rms_norm_eps == 1e-5 and cfg.tie_word_embeddings


def test_overrides_and_round_trip(tmp_path):
    cfg = DDLConfig.from_variant("ddl-tc", "tiny", value_channels=3, compressor_kernel_size=2, beta_init=0.5)
    assert (cfg.value_channels, cfg.compressor_kernel_size, cfg.beta_init) == (3, 2, 0.5)
    cfg.save_pretrained(tmp_path)
    back = DDLConfig.from_pretrained(tmp_path)
    assert back.to_dict() == cfg.to_dict()
    # CC kernel follows a changed d_v
    assert DDLConfig.from_variant("ddl-cc", value_channels=2).compressor_kernel_size == 2
    # an int is a fine float
    assert DDLConfig.from_variant("ddl-dv1", rope_theta=500000).rope_theta == 500000


BAD = [
    # (builder kwargs, regex the message must match)
    (dict(name="ddl-cc", value_channels=0), r"`value_channels` got 0; allowed: an integer >= 1"),
    (dict(name="ddl-tc", value_channels=-2), r"`value_channels` got -2; allowed: an integer >= 1"),
    (dict(name="ddl-xx"), r"`variant` got 'ddl-xx'; allowed: baseline \| ddl-dv1 \|"),
    (dict(name="ddl-cc", preset="large"), r"`preset` got 'large'; allowed: tiny \| small \| medium"),
    (dict(name="ddl-cc", compressor_kernel_size=3),
     r"`compressor_kernel_size` got 3; allowed: exactly value_channels=4 for the channel compressor"),
    (dict(name="ddl-cc", compressor_kernel_size=5), r"`compressor_kernel_size` got 5; allowed: exactly value_channels=4"),
    (dict(name="ddl-tc", compressor_kernel_size=0),
     r"`compressor_kernel_size` got 0; allowed: 1\.\.max_position_embeddings=256 for the token compressor"),
    (dict(name="ddl-tc", compressor_kernel_size=300), r"`compressor_kernel_size` got 300; allowed: 1\.\.max_position"),
    (dict(name="baseline", num_attention_heads=3), r"`num_attention_heads` got 3; allowed: a divisor of hidden_size=256"),
    (dict(name="ddl-cc", hidden_size=100, num_attention_heads=8),
     r"`num_attention_heads` got 8; allowed: a divisor of hidden_size=100"),
    (dict(name="baseline", hidden_size=96, num_attention_heads=32), r"`num_attention_heads` got 32; allowed: .*even head_dim"),
    (dict(name="baseline", hiden_size=3), r"unknown field\(s\) \['hiden_size'\]; allowed: \[.*'hidden_size'"),
    (dict(name="baseline", hidden_size="big"), r"`hidden_size` got 'big'; allowed: an integer$"),
    (dict(name="ddl-cc", value_channels=2.5), r"`value_channels` got 2\.5; allowed: an integer$"),
    (dict(name="ddl-cc", value_channels=True), r"`value_channels` got True; allowed: an integer$"),
    (dict(name="ddl-dv1", beta_init="one"), r"`beta_init` got 'one'; allowed: a number$"),
    (dict(name="ddl-dv1", gate=None), r"`gate` got None; allowed: a string$"),
    (dict(name="ddl-dv1", beta_init=2.0), r"`beta_init` got 2\.0; allowed: a float in the open interval \(0, beta_max=2\)"),
    (dict(name="ddl-dv1", beta_init=0.0), r"`beta_init` got 0\.0"),
    (dict(name="ddl-dv1", k_eps=-1e-5), r"`k_eps` got -1e-05; allowed: a float >= 0"),
    (dict(name="ddl-dv1", gate="relu"), r"`gate` got 'relu'; allowed: linear \| mlp"),
    (dict(name="ddl-dv1", residual_map="q"), r"`residual_map` got 'q'; allowed: k \| v"),
    (dict(name="ddl-dv1", delta_backend="cuda"), r"`delta_backend` got 'cuda'; allowed: auto \| torch \| triton"),
    (dict(name="ddl-cc", compressor="mean"), r"`compressor` got 'mean'; allowed: none \| token \| channel"),
    (dict(name="ddl-cc", state_init="zeros"), r"`state_init` got 'zeros'; allowed: repeat \| conv"),
    (dict(name="ddl-cc", compressor="none"), r"`compressor` got 'none'; allowed: 'token' or 'channel' when value_channels > 1"),
    (dict(name="ddl-dv1", compressor="channel"), r"`compressor` got 'channel'; allowed: 'none' when value_channels=1"),
    (dict(name="ddl-dv1", state_init="conv"), r"`state_init` got 'conv'; allowed: 'repeat' when value_channels=1"),
    (dict(name="baseline", value_channels=4, compressor="channel"),
     r"`value_channels` got 4; allowed: its default \(1\) with residual='additive': it is a setting of the design "
     r"'delta', which this model does not have"),
    (dict(name="ddl-tc", embed_conv_kernel_size=0), r"`embed_conv_kernel_size` got 0; allowed: an integer >= 1"),
    (dict(name="baseline", vocab_size=0), r"`vocab_size` got 0; allowed: an integer >= 1"),
    (dict(name="ddl-dv1", vmap_rank=0), r"`vmap_rank` got 0; allowed: None or an integer >= 1"),
    (dict(name="ddl-dv1", gate_hidden_size=0), r"`gate_hidden_size` got 0; allowed: None or an integer >= 1"),
    (dict(name="hc", hc_kind="dhc"), r"`hc_kind` got 'dhc'; allowed: hc \| mhc"),
    (dict(name="hc", hc_streams=0), r"`hc_streams` got 0; allowed: an integer >= 1 for hc_kind='hc'"),
    (dict(name="mhc", hc_streams=1), r"`hc_streams` got 1; allowed: an integer >= 2 for hc_kind='mhc'"),
    (dict(name="mhc", hc_sinkhorn_iters=0), r"`hc_sinkhorn_iters` got 0; allowed: an integer >= 1"),
    (dict(name="hc", hc_dynamic=1), r"`hc_dynamic` got 1; allowed: true or false$"),
    (dict(name="hc", value_channels=4, compressor="channel"),
     r"`value_channels` got 4; allowed: its default \(1\) with residual='hyper'"),
    # B5: a setting the model does not have is refused, naming it (issue 66)
    (dict(name="baseline", attnres_blocks=4), r"`attnres_blocks` got 4; allowed: its default \(None\) with "
     r"residual='additive': it is a setting of the design 'attnres'"),
    (dict(name="peri-ln", beta_init=0.5), r"`beta_init` got 0.5; allowed: its default \(1.0\) with residual='additive'"),
    (dict(name="ddl-cc", hc_streams=2), r"`hc_streams` got 2; allowed: its default \(4\) with residual='delta'"),
    (dict(name="baseline", residual="nope"), r"`residual` got 'nope'; allowed: additive \| delta \| hyper \| attnres, or "
     r"a design of your own"),
]


@pytest.mark.parametrize("kwargs,match", BAD, ids=[m.split(";")[0][:40] for _, m in BAD])
def test_from_variant_errors_name_field_value_and_allowed(kwargs, match):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=match):
        DDLConfig.from_variant(kwargs.pop("name"), kwargs.pop("preset", "tiny"), **kwargs)


def test_direct_constructor_errors():
    with pytest.raises(ValueError, match=r"`value_channels` got 0; allowed: an integer >= 1"):
        DDLConfig(residual="delta", value_channels=0, compressor="channel")
    with pytest.raises(ValueError, match=r"`compressor_kernel_size` got 2; allowed: exactly value_channels=4"):
        DDLConfig(residual="delta", value_channels=4, compressor="channel", compressor_kernel_size=2)
    with pytest.raises(ValueError, match=r"`compressor_kernel_size` got 0; allowed: 1\.\.max_position_embeddings=1024"):
        DDLConfig(residual="delta", value_channels=4, compressor="token", compressor_kernel_size=0)
    with pytest.raises(ValueError, match=r"`num_attention_heads` got 5; allowed: a divisor of hidden_size=768"):
        DDLConfig(num_attention_heads=5)
    with pytest.raises(ValueError, match=r"`variant` got 'ddl'; allowed: baseline"):
        DDLConfig(variant="ddl")
    with pytest.raises(ValueError, match=r"`preset` got 'xl'; allowed: tiny \| small \| medium"):
        DDLConfig(preset="xl")
    with pytest.raises(ValueError, match=r"`num_hidden_layers` got 'twelve'; allowed: an integer$"):
        DDLConfig(num_hidden_layers="twelve")
    with pytest.raises(ValueError, match=r"`eos_token_id` got 'x'; allowed: an integer or a list of integers or null"):
        DDLConfig(eos_token_id="x")


def test_field_types_are_read_as_every_settings_class_reads_them():
    """deep_delta.settings.check_fields: a number written as text (YAML 1.1 reads 1e-5 as a string) is a number,
    an int where a float is annotated a float; transformers' token ids may be lists."""
    cfg = DDLConfig.from_variant("ddl-dv1", "tiny", k_eps="1e-5", hidden_size="256", beta_init=1, eos_token_id=[1, 2])
    assert (cfg.k_eps, cfg.hidden_size, cfg.eos_token_id) == (1e-5, 256, [1, 2])
    assert isinstance(cfg.beta_init, float)
