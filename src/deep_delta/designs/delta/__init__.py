"""The delta design: Deep Delta Learning's residual (arXiv:2601.00417) and its update rules.

    X <- X + beta k (v^T - k^T X)     k = F(c) / |F(c)|,  c = RMSNorm(read(X)),  beta = beta_max sigmoid(w^T c + b)

The state X is (B, T, d) for d_v = 1 and (B, T, d, d_v) otherwise: the embedding expanded to d_v channels
(repeated, or EC: a short convolution along the tokens; :class:`~deep_delta.layers.compressors.StateExpander`),
each block reading it back to (..., d) with its compressor (CC: a mix of the channels; TC: a convolution along the
tokens), shared by its two sublayers, and a final compressor reading the last state.

The update rules (``update_rule``; :data:`deep_delta.ops.delta.UPDATE_RULES`, validated by
:func:`deep_delta.ops.delta.rule_spec`): ``delta`` (the paper's), ``write`` (the write-only control ``x + beta k
v^T``: no read, nothing erased; the ``-write`` variants) and ``untied`` (the erase and the write gated apart, ``x + k
(beta_w v^T - beta_e k^T x)``; the ``-untied`` variants). A sublayer's update can compute what the next one takes
from the new state (the fusion plan, :mod:`deep_delta.designs.delta.fusion`).

Settings (flat fields of :class:`~deep_delta.models.ddl.configuration_ddl.DDLConfig`, listed in
``DeltaDesign.fields``): value_channels (d_v), residual_map, compressor, compressor_kernel_size, state_init,
embed_conv_kernel_size, gate, gate_hidden_size, beta_init, beta_max, value_scale, k_eps, vmap_rank, update_rule,
recompute_states.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from deep_delta.designs.base import ResidualDesign, mask_pads, mup_readout_init_, read_with_history
from deep_delta.designs.delta import fusion
from deep_delta.designs.delta.probe import DeltaProbe
from deep_delta.designs.probes import StateProbe
from deep_delta.designs.registry import register_design
from deep_delta.layers.carry import Carry
from deep_delta.layers.compressors import (
    COMPRESSORS,
    STATE_INITS,
    ChannelCompressor,
    StateExpander,
    TokenConvCompressor,
    make_compressor,
)
from deep_delta.layers.delta_residual import RESIDUAL_MAPS, DeltaResidual
from deep_delta.layers.gate import GATE_KINDS, BetaGate
from deep_delta.ops.delta import rule_spec

_COMPRESSORS = ("none",) + COMPRESSORS


def _bad(field: str, got, allowed: str) -> ValueError:
    return ValueError(f"DDLConfig: `{field}` got {got!r}; allowed: {allowed}")


class DeltaDesign(ResidualDesign):
    name = "delta"
    about = "the delta residual X + beta k (v^T - k^T X) (Deep Delta Learning)"
    fields = ("value_channels", "residual_map", "compressor", "compressor_kernel_size", "state_init",
              "embed_conv_kernel_size", "gate", "gate_hidden_size", "beta_init", "beta_max", "value_scale", "k_eps",
              "vmap_rank", "update_rule")
    probes = (StateProbe, DeltaProbe)

    # ------------------------------------------------------------------------------------------------ settings
    def complete(self, config) -> None:
        """The compressor's kernel: TC 4 taps over the tokens, CC exactly d_v, when not given."""
        if config.compressor == "token" and config.compressor_kernel_size is None:
            config.compressor_kernel_size = 4
        if config.compressor == "channel" and config.compressor_kernel_size is None:
            config.compressor_kernel_size = config.value_channels

    def check(self, config) -> None:
        for name, allowed in (("residual_map", RESIDUAL_MAPS), ("compressor", _COMPRESSORS),
                              ("state_init", STATE_INITS), ("gate", GATE_KINDS)):
            if getattr(config, name) not in allowed:
                raise _bad(name, getattr(config, name), " | ".join(allowed))
        rule_spec(config.update_rule, "DDLConfig", "update_rule")
        dv = config.value_channels
        if dv < 1:
            raise _bad("value_channels", dv, "an integer >= 1 (d_v)")
        if config.update_rule == "write" and config.recompute_states:
            raise _bad("recompute_states", config.recompute_states, "False with update_rule='write' (the state "
                       "rebuild inverts the update of the delta rule's Function, which the write-only control does not "
                       "run)")
        if dv == 1 and config.compressor != "none":
            raise _bad("compressor", config.compressor, "'none' when value_channels=1 (nothing to compress)")
        if dv > 1 and config.compressor == "none":
            raise _bad("compressor", config.compressor, "'token' or 'channel' when value_channels > 1")
        if dv == 1 and config.state_init != "repeat":
            raise _bad("state_init", config.state_init, "'repeat' when value_channels=1 (EC expands d_v > 1)")
        k = config.compressor_kernel_size
        if config.compressor == "channel" and k != dv:
            raise _bad("compressor_kernel_size", k, f"exactly value_channels={dv} for the channel compressor (CC)")
        if config.compressor == "token" and not 1 <= k <= config.max_position_embeddings:
            raise _bad("compressor_kernel_size", k,
                       f"1..max_position_embeddings={config.max_position_embeddings} for the token compressor (TC)")
        if not 1 <= config.embed_conv_kernel_size <= config.max_position_embeddings:
            raise _bad("embed_conv_kernel_size", config.embed_conv_kernel_size,
                       f"1..max_position_embeddings={config.max_position_embeddings}")
        if not 0.0 < config.beta_max <= 2.0:
            raise _bad("beta_max", config.beta_max, "a float in (0, 2] (2: the paper's gate; 1: no reflection)")
        if not 0.0 < config.beta_init < config.beta_max:
            raise _bad("beta_init", config.beta_init, f"a float in the open interval (0, beta_max="
                       f"{config.beta_max:g}); a smaller beta_max needs beta_init set too, e.g. {config.beta_max / 2:g} "
                       "(half the range, as the default 1 of 2)")
        if config.k_eps < 0:
            raise _bad("k_eps", config.k_eps, "a float >= 0")
        if config.gate_hidden_size is not None and config.gate_hidden_size < 1:
            raise _bad("gate_hidden_size", config.gate_hidden_size, "None or an integer >= 1")
        if config.vmap_rank is not None and config.vmap_rank < 1:
            raise _bad("vmap_rank", config.vmap_rank, "None or an integer >= 1")
        if config.parametrization == "mup":
            # muP needs to know which sizes grow with the width: these must be derived from hidden_size
            for name in ("gate_hidden_size", "vmap_rank"):
                if getattr(config, name) is not None:
                    raise _bad(name, getattr(config, name), "None with parametrization='mup' (derived from the width)")
            if config.residual_map == "v" and dv > 1:
                raise _bad("parametrization", config.parametrization,
                           "'sp' for residual_map='v' with value_channels > 1 (its linear value has no muP rule yet)")

    # ------------------------------------------------------------------------------------------------ construction
    def expander(self, config) -> nn.Module | None:
        if config.value_channels == 1:
            return None
        return StateExpander(config.hidden_size, config.value_channels, config.state_init,
                             config.embed_conv_kernel_size, backend=config.delta_backend)

    def residual(self, config, branch: nn.Module, sublayer: int) -> nn.Module:
        # muP: v ~ sqrt(d) (docs/mup.md); norm_output "autocast": the branches' first ops on c are matmuls
        return DeltaResidual(
            config.hidden_size, branch, value_channels=config.value_channels, residual_map=config.residual_map,
            gate=config.gate, gate_hidden_size=config.gate_hidden_size, beta_init=config.beta_init,
            beta_max=config.beta_max, value_scale=config.value_scale * math.sqrt(config.mup_width_mult),
            k_eps=config.k_eps, norm_eps=config.rms_norm_eps, vmap_rank=config.vmap_rank,
            backend=config.delta_backend, norm_output="autocast", update_rule=config.update_rule,
        )

    def _compressor(self, config) -> nn.Module | None:
        if config.value_channels == 1:
            return None
        return make_compressor(config.compressor, config.hidden_size, config.value_channels,
                               config.compressor_kernel_size, backend=config.delta_backend)

    def block_read(self, config) -> nn.Module | None:
        return self._compressor(config)

    def readout(self, config) -> nn.Module | None:
        return self._compressor(config)

    # ------------------------------------------------------------------------------------------------ the forward
    def state_dtype(self, config, embeds: torch.Tensor) -> torch.dtype:
        """"auto": the autocast dtype for a d_v > 1 state under CUDA autocast (half the state's bytes), else the
        embeddings'."""
        device = embeds.device.type
        if (config.state_dtype == "auto" and config.value_channels > 1 and device == "cuda"
                and torch.is_autocast_enabled(device)):
            return torch.get_autocast_dtype(device)
        return super().state_dtype(config, embeds)

    def plan(self, model, x, cache, pad_mask):
        return fusion.plan(model, x, cache, pad_mask)

    def sublayer(self, block, name, state, carry, emit, args, pad_mask, cache):
        """What ``carry`` brings (the sublayer's inputs, its read, or nothing: then with pads the state is masked
        and, with a compressor, read here), then the update, emitting what ``emit`` says."""
        residual = getattr(block, name)
        kwargs = {}
        if carry.inputs is not None:
            kwargs["prepared"] = carry.inputs
        elif block.compressor is not None:
            state, read = mask_pads(pad_mask, state, carry.read)
            if read is None:
                read = read_with_history(block.compressor, state, cache, f"{block.layer_idx}.{name}")
            kwargs["x_in"] = read
        if emit.what == "nothing":
            return residual(state, *args, **kwargs), Carry()
        return residual(state, *args, emit=emit, **kwargs)

    def records_states(self, config) -> bool:
        return True

    # ------------------------------------------------------------------------------------------------ init and muP
    def init_module(self, module: nn.Module, config, std: float) -> bool:
        if isinstance(module, BetaGate):
            module.reset_parameters(std)
            mup_readout_init_(module.proj.weight, config)
        elif isinstance(module, DeltaResidual):
            module.reset_projections(std)  # its gate was met first (a child)
            mup_readout_init_(module.value_proj.weight, config)
        elif isinstance(module, (ChannelCompressor, TokenConvCompressor, StateExpander)):
            module.reset_parameters()
        else:
            return False
        return True

    # ------------------------------------------------------------------------------------------------ tools
    def describe(self, config) -> str:
        rule = {"delta": "the delta rule", "write": "the write-only rule x + beta k v^T",
                "untied": "the untied gates X + k (beta_w v^T - beta_e k^T X)"}[config.update_rule]
        state = (f"d_v = {config.value_channels}, compressor {config.compressor}, state init {config.state_init}"
                 if config.value_channels > 1 else "d_v = 1")
        return f"delta ({rule}; {state}; {config.residual_map}-Map, {config.gate} gate)"

    def state_width(self, config) -> int:
        return config.hidden_size * config.value_channels

    def info_fields(self, config) -> list[str]:
        return ["update_rule", "value_channels", "residual_map", "compressor", "compressor_kernel_size", "state_init",
                "embed_conv_kernel_size", "gate", "beta_init", "beta_max", "value_scale", "k_eps"]

    def fused_kernels(self, config) -> bool:
        return True


DESIGN = register_design(DeltaDesign())
