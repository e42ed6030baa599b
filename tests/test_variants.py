"""The variant table's names for tables: one function, paper_name, used by every table and figure."""

from deep_delta.variants import PAPER_NAMES, VARIANTS, paper_name


def test_every_variant_has_its_paper_name_and_others_read_as_given():
    assert set(PAPER_NAMES) == set(VARIANTS)
    assert paper_name("ddl-cc") == "DDL-CC" and paper_name("baseline") == "Baseline"
    assert paper_name("my-variant") == "my-variant"
