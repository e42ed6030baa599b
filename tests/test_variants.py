"""The variant table: its names for tables (one function, paper_name, used by every table and figure), and the one
check that a run is the design its variant's name says (check_variant)."""

import pytest

from deep_delta.variants import (
    PAPER_NAMES,
    RECIPE_FIELDS,
    ROW_DEFAULTS,
    VARIANTS,
    check_variant,
    defining_fields,
    paper_name,
    variant_differences,
    variant_of,
)


def test_every_variant_has_its_paper_name_and_others_read_as_given():
    assert set(PAPER_NAMES) == set(VARIANTS)
    assert paper_name("ddl-cc") == "DDL-CC" and paper_name("baseline") == "Baseline"
    assert paper_name("my-variant") == "my-variant"


def test_the_rows_defaults_are_the_configs():
    """variants.ROW_DEFAULTS (what a row that does not name a field has, read by the check that a run is its
    variant) are DDLConfig's defaults."""
    import dataclasses

    from deep_delta import DDLConfig

    defaults = {f.name: f.default for f in dataclasses.fields(DDLConfig)}
    assert ROW_DEFAULTS == {k: defaults[k] for k in ROW_DEFAULTS}
    assert set(defining_fields()) | set(RECIPE_FIELDS) == {k for row in VARIANTS.values() for k in row} | set(
        ROW_DEFAULTS)


@pytest.mark.parametrize("variant, fields, other", [
    ("baseline", {"output_norm": True, "embed_norm": True}, "peri-ln"),     # V1 (with the recipe's embed norm)
    ("baseline", {"residual": "delta"}, "ddl-dv1"),                          # V3
    ("ddl-cc", {"update_rule": "write"}, "ddl-cc-write"),                    # T11
    ("attnres", {"attnres_blocks": 8}, "attnres-block"),                     # B4
    ("attnres-block", {"attnres_blocks": None}, "attnres"),                  # B4
    ("ddl-dv1", {"value_channels": 4}, None),
])
def test_a_run_is_the_design_its_name_says(variant, fields, other):
    """Issue 66 item 1 (round 6's V1, V3, B4 and T11's siblings): a defining setting against the named variant's is
    refused, naming the setting and the variant that has it where one does."""
    with pytest.raises(ValueError, match="a run is the design its variant names") as e:
        check_variant(variant, fields)
    assert f"`{next(iter(k for k in fields if k != 'embed_norm'))}` got" in str(e.value)
    if other:
        assert f"the variant {other!r} by name" in str(e.value)
    else:
        assert "no variant has these settings" in str(e.value)


def test_recipe_settings_and_the_variants_own_values_pass():
    check_variant("baseline", {"embed_norm": True, "hidden_size": 64})  # a recipe setting: the strong baseline
    check_variant("peri-ln", {"embed_norm": False})  # Peri-LN as recorded before its embedding norm
    check_variant("ddl-cc", {"value_channels": 4, "compressor": "channel", "beta_init": 0.5})
    check_variant("ddl-tc", {"value_channels": 8})  # the same variant with a wider state (README's example)
    check_variant("attnres-block", {"attnres_blocks": 2})  # Block AttnRes of 2 blocks
    assert variant_of({**ROW_DEFAULTS, "output_norm": True}) == "peri-ln"
    assert variant_differences("ddl-cc-write", {"update_rule": "write"}) == []
