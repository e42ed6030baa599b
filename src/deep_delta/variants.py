"""The variants and model sizes by name: what each variant changes, the default list, the paper's names, the
presets. Plain data with no import of PyTorch or transformers, so that the command line's parser can list
them; :class:`deep_delta.models.ddl.configuration_ddl.DDLConfig` builds configs from them.
"""

from __future__ import annotations

from typing import Any

# A variant is data: the residual fields that differ from the baseline.
VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": dict(residual="additive", value_channels=1, compressor="none", state_init="repeat"),
    "ddl-dv1": dict(residual="delta", value_channels=1, residual_map="k", compressor="none", state_init="repeat"),
    "ddl-dv1-vmap": dict(residual="delta", value_channels=1, residual_map="v", compressor="none", state_init="repeat"),
    "ddl-tc": dict(residual="delta", value_channels=4, compressor="token", state_init="conv"),
    "ddl-cc": dict(residual="delta", value_channels=4, compressor="channel", state_init="conv"),
    "ddl-tc-noec": dict(residual="delta", value_channels=4, compressor="token", state_init="repeat"),
    "ddl-cc-noec": dict(residual="delta", value_channels=4, compressor="channel", state_init="repeat"),
    # the write-only controls (issue 48): each DDL variant with the update x + beta k v^T (no read, nothing
    # erased), everything else the same (parameters, initialisation, data order)
    "ddl-dv1-write": dict(residual="delta", value_channels=1, residual_map="k", compressor="none", state_init="repeat",
                          update_rule="write"),
    "ddl-tc-write": dict(residual="delta", value_channels=4, compressor="token", state_init="conv", update_rule="write"),
    "ddl-cc-write": dict(residual="delta", value_channels=4, compressor="channel", state_init="conv",
                         update_rule="write"),
    # the untied gates (issue 56): each DDL variant with X + k (beta_w v^T - beta_e k^T X), the erase and the write
    # gates from projections of their own, starting equal (so each starts as its DDL variant at the same seed)
    "ddl-dv1-untied": dict(residual="delta", value_channels=1, residual_map="k", compressor="none",
                           state_init="repeat", update_rule="untied"),
    "ddl-tc-untied": dict(residual="delta", value_channels=4, compressor="token", state_init="conv",
                          update_rule="untied"),
    "ddl-cc-untied": dict(residual="delta", value_channels=4, compressor="channel", state_init="conv",
                          update_rule="untied"),
    # the rivals (docs/rivals.md): n = hc_streams residual streams instead of a d x d_v state
    "hc": dict(residual="hyper", hc_kind="hc", hc_dynamic=True),
    "hc-static": dict(residual="hyper", hc_kind="hc", hc_dynamic=False),
    "mhc": dict(residual="hyper", hc_kind="mhc", hc_dynamic=True),
    "mhc-static": dict(residual="hyper", hc_kind="mhc", hc_dynamic=False),
    # the baseline with a bounded branch: a learned RMSNorm on each sublayer's output before the add, and one on the
    # embedding (Peri-LN as its paper defines it; runs recorded before 2026-12-02 under this name had no embedding
    # norm: their run.json's model_config has no embed_norm, and they load and report as they were trained)
    "peri-ln": dict(residual="additive", value_channels=1, compressor="none", state_init="repeat", output_norm=True,
                    embed_norm=True),
    # Attention Residuals: each sublayer reads a softmax over depth of the earlier outputs (Full) or of the block
    # sums (Block: the sublayers in attnres_blocks blocks, the paper's 8)
    "attnres": dict(residual="attnres", attnres_blocks=None),
    "attnres-block": dict(residual="attnres", attnres_blocks=8),
}

# The variants a comparison or a benchmark runs when none are named: the baseline and the three main DDL
# models, in the order of the table above (TC before CC, like the README's variant table and the documented
# defaults of `ddl compare` and `ddl bench`). The one list: compare and both benchmarks import it.
DEFAULT_VARIANTS: tuple[str, ...] = ("baseline", "ddl-dv1", "ddl-tc", "ddl-cc")

# Paper names (latest revision) for tables.
PAPER_NAMES = {
    "baseline": "Baseline",
    "ddl-dv1": "DDL (d_v=1)",
    "ddl-dv1-vmap": "DDL (d_v=1, v-Map)",
    "ddl-tc": "DDL-TC",
    "ddl-cc": "DDL-CC",
    "ddl-tc-noec": "DDL-TC w/o EC",
    "ddl-cc-noec": "DDL-CC w/o EC",
    "ddl-dv1-write": "DDL (d_v=1) write-only",
    "ddl-tc-write": "DDL-TC write-only",
    "ddl-cc-write": "DDL-CC write-only",
    "hc": "HC (dynamic)",
    "hc-static": "HC (static)",
    "mhc": "mHC",
    "mhc-static": "mHC (static)",
    "ddl-dv1-untied": "DDL (d_v=1) untied gates",
    "ddl-tc-untied": "DDL-TC untied gates",
    "ddl-cc-untied": "DDL-CC untied gates",
    "peri-ln": "Peri-LN",
    "attnres": "Full AttnRes",
    "attnres-block": "Block AttnRes",
}

PRESETS: dict[str, dict[str, Any]] = {
    # CI and CPU smoke runs: a training step of 4 x 256 tokens well under a second on 2 cores
    "tiny": dict(vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=256),
    # the paper's 124M shape (appendix C)
    "small": dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=6, max_position_embeddings=1024),
    # the paper's 353M shape
    "medium": dict(vocab_size=50304, hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, max_position_embeddings=1024),
}


# Settings of a training recipe rather than of a design: every variant takes them, and they do not change which
# variant a run is (docs/training.md, "Recipe options"); a variant's row may still name the value it is defined with
# (peri-ln: embed_norm, as the Peri-LN paper defines it).
RECIPE_FIELDS = ("embed_norm",)
# DDLConfig's default of every field a variant's row names (what a row that does not name a field has; a test checks
# these against DDLConfig): the baseline's design
ROW_DEFAULTS: dict[str, Any] = {
    "residual": "additive", "value_channels": 1, "residual_map": "k", "compressor": "none", "state_init": "repeat",
    "update_rule": "delta", "hc_kind": "hc", "hc_dynamic": True, "output_norm": False, "attnres_blocks": None,
    "embed_norm": False,
}


def defining_fields() -> list[str]:
    """The settings that say which variant a model is: every field a variant's row names, but the recipe fields."""
    names = {k for row in VARIANTS.values() for k in row} | set(ROW_DEFAULTS)
    return sorted(names - set(RECIPE_FIELDS))


# Fields whose value says which variant a model is only through its kind: a d_v > 1 state (any d_v), Block AttnRes
# (any number of blocks) against Full (None); another value of the same kind is the same variant at another size.
_KIND = {"value_channels": lambda v: isinstance(v, int) and v > 1, "attnres_blocks": lambda v: v is not None}


def _same(name: str, a: Any, b: Any) -> bool:
    kind = _KIND.get(name)
    return kind(a) == kind(b) if kind else a == b


def variant_differences(variant: str, fields: dict[str, Any]) -> list[str]:
    """How the model settings ``fields`` (a config's fields, or a run's overrides over its variant's row) differ from
    what ``variant`` is defined with, one ``field got X, but VARIANT has Y`` each; [] when the model is the variant.
    A defining field not in ``fields`` counts as the variant's own; d_v and the number of AttnRes blocks count by
    their kind (a d_v > 1 state, Block AttnRes), so that the same variant at another size stays itself. The one check that a run is the design its name
    says (``ddl train``, ``ddl compare`` live and ``--report-only``, export)."""
    row = {**ROW_DEFAULTS, **VARIANTS.get(variant, {})}
    out = []
    for name in defining_fields():
        if name in fields and not _same(name, fields[name], row.get(name)):
            out.append(f"`{name}` got {fields[name]!r}, but {variant!r} ({paper_name(variant)}) has {row.get(name)!r}")
    return out


def variant_of(fields: dict[str, Any]) -> str | None:
    """The variant whose defining settings ``fields`` has (a config's fields), or None."""
    return next((v for v in VARIANTS if not variant_differences(v, {**ROW_DEFAULTS, **fields})), None)


def check_variant(variant: str, fields: dict[str, Any], owner: str = "TrainConfig") -> None:
    """A ``ValueError`` when the model settings ``fields`` make another model than ``variant`` (a run carries its
    variant's name into its banner, a comparison's row and an export's title), naming each setting, the variant's
    value and the variant that has those settings where one does."""
    diff = variant_differences(variant, fields)
    if not diff:
        return
    other = variant_of({**{k: v for k, v in {**ROW_DEFAULTS, **VARIANTS.get(variant, {})}.items()}, **fields})
    instead = (f"the variant {other!r} by name ({paper_name(other)})" if other else
               "no variant has these settings: a model of its own is a design of your own (docs/designs.md) or a "
               "config without a variant name")
    raise ValueError(f"{owner}: {'; '.join(diff)}, and a run is the design its variant names; allowed: the variant's "
                     f"own settings (recipe settings such as {', '.join(RECIPE_FIELDS)} excepted), or {instead}")


def paper_name(variant: str) -> str:
    """The paper's name of ``variant`` for tables ("ddl-cc" -> "DDL-CC"); a name not in the table as given."""
    return PAPER_NAMES.get(variant, variant)


def twin_of(variant: str) -> str | None:
    """The write-only control of a DDL variant ("ddl-cc" -> "ddl-cc-write"), or None where it has none."""
    twin = f"{variant}-write"
    return twin if twin in VARIANTS else None

