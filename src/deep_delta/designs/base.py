"""The interface of a residual design: what the backbone asks of the residual around its sublayers.

The backbone (:mod:`deep_delta.models.ddl.modeling_ddl`) is a Llama-style stack of blocks, each an attention and
an MLP sublayer. Between the sublayers it carries a *state*; a design says what that state is and how each
sublayer reads and writes it:

==================  ==============================================================================================
the state           made from the (normed) embedding by :meth:`ResidualDesign.expander` (None: the embedding
                    itself, (B, T, d)); a tensor of any trailing shape, or a tuple of tensors
around a sublayer   :meth:`ResidualDesign.residual` wraps the sublayer (the module the block calls ``attn`` /
                    ``mlp``); :meth:`ResidualDesign.sublayer` runs it on the state (default: ``residual(state,
                    *args)``), and may hand the next sublayer something it computed (a :class:`Carry`)
a block's read      :meth:`ResidualDesign.block_read`: a module the block holds as ``compressor`` (DDL's d_v > 1
                    state is read back to (..., d) by it); None for most designs
the readout         :meth:`ResidualDesign.readout` (held as ``final_compressor``) and :meth:`ResidualDesign.read_out`:
                    the state back to (B, T, d) before the final norm (None: the state is (B, T, d) already)
init and muP        :meth:`ResidualDesign.init_module` initialises the design's own modules;
                    :meth:`ResidualDesign.mup_readouts` names its readouts from the width to a fixed size (they
                    train at lr / m and start at zero under muP, docs/mup.md)
caches              a module that reads other tokens (a token convolution) has ``history`` > 0 and is called as
                    ``module(x, past) -> (out, new_past)``; the backbone keeps its history in the cache
settings            the :class:`~deep_delta.models.ddl.configuration_ddl.DDLConfig` fields in ``fields`` (the
                    built-in designs: flat fields) or, for a design of a user's own, the mapping
                    ``config.design_settings`` checked by ``settings`` (a dataclass); :meth:`check` validates them
tools               ``probes``: what ``ddl analyze`` reports of it; :meth:`describe`: one line for ``ddl info`` and
                    an export's model card; :meth:`state_width`: the state's width per token (the benchmarks)
==================  ==============================================================================================

A design is registered by name (:func:`deep_delta.designs.register_design`); ``DDLConfig.residual`` names the one a
model uses. The backbone never asks which design it holds: it calls these methods. docs/designs.md walks through a
complete small design of a user's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from deep_delta.layers.carry import NOTHING, BlockPlan, Carry, Emit, unfused

# The config (a DDLConfig), the model and the cache (a DDLCache) are the caller's, a layer above: only their attributes
# are read here, so they go unimported and are annotated as Any.
DDLConfig = Any


def read_with_history(module: nn.Module, x: Any, cache, key: str) -> Any:
    """Apply a token-axis module (a compressor, a state expander, any module called ``module(x, past) -> (out,
    new_past)``) with its token history from the cache (a :class:`~deep_delta.models.ddl.cache.DDLCache`, or None),
    and store the new history under ``key``."""
    past = cache.token_history.get(key) if cache is not None else None
    out, history = module(x, past)
    if cache is not None and history is not None:
        cache.store_history(key, history)
    return out


def mask_pads(pad_mask: torch.Tensor | None, *states: Any) -> tuple[Any, ...]:
    """Each state (a (B, T, ...) tensor, or a tuple of them) with its padded positions zeroed; None passes through.
    pad_mask: (B, T), 1 at tokens and 0 at pads (so exact elsewhere)."""
    if pad_mask is None:
        return states
    return tuple(None if t is None else mask_pads(pad_mask, *t) if isinstance(t, tuple)
                 else t * pad_mask.view(*pad_mask.shape, *(1,) * (t.dim() - 2)) for t in states)


def mup_readout_init_(weight: torch.Tensor, config: DDLConfig) -> None:
    """Under muP a readout from the width to a fixed size (DDL's gate and value projections, a hyper-connection's
    dynamic projections, an untied LM head) starts at zero: the limit of muP's variance ~ 1/fan_in^2 and the readout
    init of Tensor Programs V's GPT-3 runs (docs/mup.md). It is drawn first (as under "sp"), so every other weight
    equals the sp model's of the same seed. Nothing under "sp"."""
    if config.parametrization == "mup":
        from transformers import initialization as init

        init.zeros_(weight)  # a tensor loaded from a checkpoint is left alone, as by every init function


class ResidualDesign:
    """A residual design (the module docstring lists what it owns). Subclass it, set ``name`` and ``about``, and
    implement :meth:`residual`; every other method has the plain additive residual's default."""

    name: str = ""
    about: str = ""
    # the DDLConfig fields that are this design's settings (a built-in design's flat fields); a design of a user's
    # own keeps its settings in config.design_settings instead, checked by `settings`
    fields: tuple[str, ...] = ()
    settings: type | None = None
    # what `ddl analyze` reports of this design: Probe classes (deep_delta.designs.probes.Probe)
    probes: tuple[type, ...] = ()

    # -------------------------------------------------------------------------------------------- settings
    def complete(self, config: DDLConfig) -> None:
        """Fill the settings that default to a value derived from others (in place), before :meth:`check`."""

    def check(self, config: DDLConfig) -> None:
        """Raise ``ValueError`` naming the field, what it got and what is allowed for a setting of this design that
        is out of range (the backbone's own fields are checked by the config)."""

    def design_settings(self, config: DDLConfig) -> Any:
        """This design's settings object: ``settings(**config.design_settings)`` for a design with a settings
        class (its fields' types and defaults; an unknown name is an error naming the allowed ones), else None."""
        if self.settings is None:
            return None
        given = dict(config.design_settings or {})
        known = {f.name for f in dataclasses.fields(self.settings)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"DDLConfig: `design_settings` names {unknown} for the design {self.name!r}; allowed: "
                             f"{', '.join(sorted(known)) or 'none'}")
        return self.settings(**given)

    # -------------------------------------------------------------------------------------------- construction
    def expander(self, config: DDLConfig) -> nn.Module | None:
        """The module that makes the first state from the embedding (B, T, d), called ``(e, past) -> (state,
        new_past)``; None: the state is the embedding."""
        return None

    def residual(self, config: DDLConfig, branch: nn.Module, sublayer: int) -> nn.Module:
        """The residual around sublayer number ``sublayer`` (2 * block, + 1 for the MLP) whose sublayer is
        ``branch`` (a module from (..., d) to (..., d), called with the normed read and the block's arguments)."""
        raise NotImplementedError

    def block_read(self, config: DDLConfig) -> nn.Module | None:
        """A module each block holds as ``compressor`` (the read of a state that is not (..., d)); None."""
        return None

    def readout(self, config: DDLConfig) -> nn.Module | None:
        """The module that reads the last state back to (B, T, d), held as ``final_compressor`` and called ``(state,
        past) -> (read, new_past)``; None: the state is (B, T, d) already."""
        return None

    # -------------------------------------------------------------------------------------------- the forward
    def state_dtype(self, config: DDLConfig, embeds: torch.Tensor) -> torch.dtype:
        """The dtype the state is stored in between sublayers (``config.state_dtype``; "auto": the embeddings')."""
        if config.state_dtype != "auto":
            return getattr(torch, config.state_dtype)
        return embeds.dtype

    def embed(self, model: nn.Module, x: torch.Tensor, pad_mask: torch.Tensor | None, cache) -> Any:
        """The first state from the embeddings x (B, T, d): the expander's (pads zeroed first), or x."""
        if model.expander is None:
            return x
        (x,) = mask_pads(pad_mask, x)
        return read_with_history(model.expander, x, cache, "embed")

    def plan(self, model: nn.Module, x: Any, cache, pad_mask: torch.Tensor | None) -> tuple[BlockPlan, ...]:
        """What each sublayer's update computes for the next (a fusion plan; :func:`unfused`: nothing)."""
        return unfused(len(model.layers))

    def sublayer(self, block: nn.Module, name: str, state: Any, carry: Carry, emit: Emit, args: tuple,
                 pad_mask: torch.Tensor | None, cache) -> tuple[Any, Carry]:
        """One sublayer's update of ``state``: ``block.<name>`` (the residual) called on it with the block's
        ``args``; returns the new state and what it hands the next sublayer."""
        return getattr(block, name)(state, *args), Carry()

    def read_out(self, model: nn.Module, x: Any, carry: Carry, pad_mask: torch.Tensor | None, cache) -> torch.Tensor:
        """The last state back to (B, T, d): the readout's (pads zeroed first), or the state itself."""
        if model.final_compressor is None:
            return x
        x, read = mask_pads(pad_mask, x, carry.read)
        return read_with_history(model.final_compressor, x, cache, "final") if read is None else read

    def records_states(self, config: DDLConfig) -> bool:
        """Whether ``config.recompute_states`` applies (a state tape rebuilds the states in backward)."""
        return False

    def graphs_per_block(self, config: DDLConfig) -> int:
        """How many graphs ``torch.compile`` makes of the blocks' shared forward: 1, or one per block for a state
        whose structure changes from block to block (the recompile limit is raised to fit)."""
        return 1

    # -------------------------------------------------------------------------------------------- init and muP
    def init_module(self, module: nn.Module, config: DDLConfig, std: float) -> bool:
        """Initialise ``module`` if it is one of this design's own (``std``: the hidden weights' std); True when it
        was, False to leave it to the backbone."""
        return False

    def mup_readouts(self, module: nn.Module) -> dict[str, nn.Parameter]:
        """The design's readouts from the width to a fixed size among ``module``'s own parameters, by name."""
        return {}

    # -------------------------------------------------------------------------------------------- tools
    def describe(self, config: DDLConfig) -> str:
        """One line saying what the residual of ``config`` is (``ddl info``, an export's model card)."""
        return self.about or self.name

    def caveat(self, config: DDLConfig) -> str | None:
        """What a reader comparing this model with others must know of its settings, in a few words, where they make
        it another design's model in effect (Block AttnRes with as many blocks as sublayers is Full AttnRes); None
        for none. :meth:`describe` says it, and a comparison's report notes it for each compared variant."""
        return None

    def state_width(self, config: DDLConfig) -> int:
        """The state's width per token, in elements (d for a vector state; the benchmarks size their inputs)."""
        return config.hidden_size

    def info_fields(self, config: DDLConfig) -> list[str]:
        """The settings ``ddl info`` lists for this design (its fields by default)."""
        return list(self.fields)

    def fused_kernels(self, config: DDLConfig) -> bool:
        """Whether this design's updates run the fused Triton kernels whose memory traffic ``ddl bench-kernels
        --traffic`` counts."""
        return False


__all__ = ["BlockPlan", "Carry", "Emit", "NOTHING", "ResidualDesign", "mask_pads", "mup_readout_init_",
           "read_with_history", "unfused"]
