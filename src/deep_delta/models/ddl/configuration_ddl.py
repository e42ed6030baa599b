"""DDLConfig: one configuration for the additive baseline and every DDL variant of the paper."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from deep_delta.designs.registry import BUILTIN, design_module_of, get_design
from deep_delta.models.ddl.cache import CACHE_NAMES
from deep_delta.ops import BACKENDS
from deep_delta.settings import check_fields
from deep_delta.variants import PRESETS, VARIANTS, check_variant

PARAMETRIZATIONS = ("sp", "mup")
STATE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _bad(field: str, got: Any, allowed: str) -> ValueError:
    return ValueError(f"DDLConfig: `{field}` got {got!r}; allowed: {allowed}")


@strict(accept_kwargs=True)
@dataclass(repr=False)
class DDLConfig(PreTrainedConfig):
    """Configuration of :class:`deep_delta.DDLForCausalLM`.

    Backbone fields (shared by every variant): vocab_size, hidden_size, num_hidden_layers,
    num_attention_heads (head_dim = hidden_size / num_attention_heads), intermediate_size
    (default floor(8/3 d)), max_position_embeddings, rope_theta, rms_norm_eps, initializer_range
    (embedding std), hidden_init_scale (hidden weights ~ N(0, (scale / sqrt(d))^2)).

    The residual design (``residual``: a name of :mod:`deep_delta.designs`' registry; docs/designs.md) owns its
    settings and their validation: the built-in designs' settings are the flat fields below (each design lists its
    own in ``fields``), and a setting of another design than the model's must keep its default (refused otherwise,
    naming it). A design of a user's own is found by ``design_module`` (the import path or .py file that registers
    it; saved with the model, so loading imports it again) and keeps its settings in the mapping ``design_settings``.

    Residual fields (what a variant changes): residual ("additive" | "delta" | "hyper" | "attnres", or a registered
    design's name), value_channels (d_v),
    residual_map ("k" | "v"), compressor ("none" | "token" | "channel"), compressor_kernel_size
    (TC: taps over tokens, default 4; CC: must equal d_v), state_init ("repeat" | "conv" = EC),
    embed_conv_kernel_size, gate ("linear" | "mlp"), gate_hidden_size, beta_init, beta_max (beta =
    beta_max * sigmoid(.): 2 is the paper's range, up to a reflection; 1 removes reflection), value_scale,
    k_eps, vmap_rank, delta_backend ("auto" | "torch" | "triton"), update_rule ("delta": the paper's
    update | "write": the write-only control ``x + beta k v^T``, no read and nothing erased, everything else the
    same; the ``-write`` variants, issue 48 | "untied": the erase and write gates apart, below), output_norm,
    attnres_blocks.

    The untied gates (update_rule="untied", the ``-untied`` variants, issue 56): ``X + k (beta_w v^T - beta_e k^T X)``,
    the erase and the write gates from projections of their own, starting equal (the model starts as its DDL
    variant at the same seed).

    Peri-LN (output_norm=True, residual="additive"): a learned RMSNorm on each sublayer's output before the add,
    ``x + RMSNorm(F(RMSNorm(x)))``; the variant ``peri-ln`` also norms the embedding (embed_norm=True), as the
    Peri-LN paper defines it; nothing else of the baseline changes.

    The embedding norm (embed_norm=True; a recipe option for every variant, and part of Peri-LN's definition): a
    learned RMSNorm on the embedding output before the first sublayer (before the state expansion of a d_v > 1
    state and before HC's streams or AttnRes's first source are formed), ``x_0 = RMSNorm(embed(ids))``. With it the
    embedding enters the stream at norm ~sqrt(d) instead of ~initializer_range * sqrt(d) (0.16 at width 64), on the
    scale of the sublayers' writes; modded-nanogpt's baseline and the Peri-LN paper (Kim et al. 2025) norm the
    embedding so. Off by default, so that every earlier record reproduces.

    Attention Residuals (residual="attnres", docs/rivals.md): each sublayer reads a softmax over depth of the
    embedding and the earlier sublayers' outputs (attnres_blocks=None: Full AttnRes) or of the embedding and the
    sums of the finished blocks and of the current one (attnres_blocks=N: Block AttnRes, the 2 x
    num_hidden_layers sublayers split into min(N, 2 x num_hidden_layers) contiguous blocks of near-equal size; the
    paper's N is 8), weighted by the sublayer's learned pseudo-query against the RMSNorm'd sources; a last depth
    attention reads the state out before the final norm.

    Hyper-connections (residual="hyper", docs/rivals.md): hc_streams (n, default 4), hc_kind ("hc":
    Hyper-Connections | "mhc": manifold-constrained, n >= 2), hc_dynamic (token-dependent coefficients, the
    papers' default), hc_sinkhorn_iters (mHC's Sinkhorn-Knopp rounds, 20 in the paper). The state is
    (B, T, d, n): the embedding copied to n streams, read out as their mean before the final norm.
    delta_backend also chooses the implementation of their stream read, write and Sinkhorn-Knopp.

    Memory: recompute_states=True keeps only the last DDL state for backward and rebuilds the earlier
    ones from it (less activation memory; gradients differ by the rebuild's rounding). state_dtype ("auto" |
    "float32" | "bfloat16" | "float16") is the dtype in which the residual state (the DDL state, the
    baseline's residual stream) is stored between sublayers; every read of it is computed in the model's own
    dtype and every kernel does its math in fp32. "auto": the autocast dtype for a d_v > 1 state under CUDA
    autocast (half the state's bytes), else the embeddings' dtype (fp32 in mixed precision, as before).
    Hyper-connections keep their streams in the embeddings' dtype ("auto" only).

    Debugging: validate_inputs=True checks that token ids lie in [0, vocab_size) and raises a ValueError
    naming the range found. It reads two values on the host (a device synchronisation per forward), so it
    is off by default; an id out of range then fails in the embedding (an IndexError on CPU).

    Parametrization (docs/mup.md): parametrization="sp" is the standard one (every number as before);
    "mup" is muP (Tensor Programs V) with width multiplier m = hidden_size / mup_base_width: logits times
    1/m, Adam learning rate of every matrix in the blocks times 1/m (``deep_delta.train.optim.param_groups``
    asks the model), the DDL value v and the init of the scalar readouts (value and gate projections)
    rescaled. At hidden_size == mup_base_width "mup" equals "sp".
    """

    model_type = "deep_delta"
    keys_to_ignore_at_inference = list(CACHE_NAMES)  # the cache, under each of its names

    vocab_size: int = 50304
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 6
    intermediate_size: int | None = None
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    hidden_init_scale: float = 0.5
    tie_word_embeddings: bool = True
    use_cache: bool = True
    bos_token_id: int | list[int] | None = None  # transformers allows several ids here
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | list[int] | None = None

    variant: str | None = None
    preset: str | None = None
    residual: str = "additive"
    value_channels: int = 1
    residual_map: str = "k"
    compressor: str = "none"
    compressor_kernel_size: int | None = None
    state_init: str = "repeat"
    embed_conv_kernel_size: int = 4
    gate: str = "linear"
    gate_hidden_size: int | None = None
    beta_init: float = 1.0
    beta_max: float = 2.0
    value_scale: float = 4.0
    k_eps: float = 1e-5
    vmap_rank: int | None = None
    delta_backend: str = "auto"
    update_rule: str = "delta"
    recompute_states: bool = False
    state_dtype: str = "auto"
    hc_streams: int = 4
    hc_kind: str = "hc"
    hc_dynamic: bool = True
    hc_sinkhorn_iters: int = 20
    output_norm: bool = False
    embed_norm: bool = False
    design_module: str | None = None
    design_settings: dict | None = None
    attnres_blocks: int | None = None
    validate_inputs: bool = False
    parametrization: str = "sp"
    mup_base_width: int = 256

    def __post_init__(self, **kwargs):
        # the types, from the annotations of DDLConfig's own fields (e.g. hidden_size="big", value_channels=2.5)
        check_fields(self, declared_in=DDLConfig)
        if self.intermediate_size is None:
            self.intermediate_size = (8 * self.hidden_size) // 3
        if self.design_module is None and isinstance(self.residual, str):
            self.design_module = design_module_of(self.residual)  # a user's design registered before: name its module
        design = self.design
        design.complete(self)
        self.check()
        super().__post_init__(**kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def check(self) -> None:
        """Raise ValueError naming the field, the value and what is allowed."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "embed_conv_kernel_size"):
            if getattr(self, name) < 1:
                raise _bad(name, getattr(self, name), "an integer >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise _bad("num_attention_heads", self.num_attention_heads,
                       f"a divisor of hidden_size={self.hidden_size}")
        if self.head_dim % 2:
            raise _bad("num_attention_heads", self.num_attention_heads,
                       f"a value giving an even head_dim for RoPE (hidden_size / heads = {self.head_dim})")
        self._check_residual()
        self._check_parametrization()
        if self.preset is not None and self.preset not in PRESETS:
            raise _bad("preset", self.preset, " | ".join(PRESETS))
        if self.variant is not None and self.variant not in VARIANTS:
            raise _bad("variant", self.variant, " | ".join(VARIANTS))

    def _check_residual(self) -> None:
        """The backbone's residual fields, then the design's: its own settings (``design.check``), and every other
        design's settings at their defaults (a setting the model does not have is refused, naming it)."""
        if self.delta_backend not in BACKENDS:
            raise _bad("delta_backend", self.delta_backend, " | ".join(BACKENDS))
        if self.state_dtype not in STATE_DTYPES:
            raise _bad("state_dtype", self.state_dtype, " | ".join(STATE_DTYPES))
        design = self.design
        defaults = {f.name: f.default for f in dataclasses.fields(DDLConfig)}
        for name in BUILTIN:
            other = get_design(name)
            if other is design:
                continue
            for field in other.fields:
                value = getattr(self, field)
                default = None if field == "compressor_kernel_size" else defaults[field]
                if value != default:
                    raise _bad(field, value, f"its default ({default!r}) with residual={self.residual!r}: it is a "
                               f"setting of the design {name!r}, which this model does not have")
        if design.settings is None and self.design_settings is not None:
            raise _bad("design_settings", self.design_settings, f"None with residual={self.residual!r} (its settings "
                       "are fields of the config)")
        design.design_settings(self)  # a user's design: its settings, typed and named
        design.check(self)

    def _check_parametrization(self) -> None:
        """sp or muP, and what muP needs derived from the width."""
        if self.parametrization not in PARAMETRIZATIONS:
            raise _bad("parametrization", self.parametrization, " | ".join(PARAMETRIZATIONS))
        if self.mup_base_width < 1:
            raise _bad("mup_base_width", self.mup_base_width, "an integer >= 1 (the width muP is tuned at)")

    @property
    def mup_width_mult(self) -> float:
        """m = hidden_size / mup_base_width under muP; 1.0 under "sp" (every muP factor is then 1)."""
        return self.hidden_size / self.mup_base_width if self.parametrization == "mup" else 1.0

    @property
    def design(self):
        """The residual design this config names (:func:`deep_delta.designs.get_design`: built-in, registered by
        ``design_module``, or an installed entry point); an unknown name is an error naming the known ones."""
        if not isinstance(self.residual, str):
            raise _bad("residual", self.residual, "the name of a residual design")
        return get_design(self.residual, self.design_module)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_variant(cls, name: str, preset: str = "tiny", **overrides: Any) -> DDLConfig:
        """The config of variant ``name`` (see ``VARIANTS``) at ``preset`` ("tiny" | "small" | "medium").

        ``overrides`` set any other field; unknown names are refused. A ``design_module`` among them is imported
        first, so that the variants its design registers are known.
        """
        if overrides.get("design_module"):
            from deep_delta.designs.registry import load_design_module

            load_design_module(overrides["design_module"])
        if name not in VARIANTS:
            raise _bad("variant", name, " | ".join(VARIANTS))
        if preset not in PRESETS:
            raise _bad("preset", preset, " | ".join(PRESETS))
        known = cls.field_names()
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"DDLConfig: unknown field(s) {unknown}; allowed: {sorted(known)}")
        fields = {**PRESETS[preset], **VARIANTS[name], **overrides, "variant": name, "preset": preset}
        config = cls(**fields)  # each field checked first, then whether the model is still the variant it names
        check_variant(name, overrides, owner="DDLConfig.from_variant")
        return config
