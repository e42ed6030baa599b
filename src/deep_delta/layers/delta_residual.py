"""The DDL residual: a pre-norm residual around any sublayer whose update is the delta rewrite.

    c = RMSNorm(read(x));  h = branch(c)
    k-Map:  k~ = h,         v = s * sigmoid(W_v src + b_v)
            (with the linear gate on the Triton backend, c, beta and v come from one kernel,
            :func:`deep_delta.ops.norm.norm_gate_value`: one read of src; elsewhere from the modules)
    v-Map:  k~ = phi_k(c),  v = s * sigmoid(w_p^T h)  (d_v = 1)  /  v = W_v h  (d_v > 1)
    beta = gate(c);  x <- x + beta k (v^T - k^T x)

:class:`~deep_delta.layers.additive.AdditiveResidual` is the plain additive residual ``x + branch(RMSNorm(x))`` with
the same call, so an A/B comparison swaps one class for the other. ``update_rule="write"`` swaps in the write-only control
``x + beta k v^T`` (no read ``k^T x``, nothing erased) with everything else identical: the same modules,
parameters and initialisation (issue 48; :func:`deep_delta.ops.delta.write_update`).

``update_rule="untied"`` gives the erase and the write gates of their own, ``x + k (beta_w v^T - beta_e k^T x)``: the
gate has two outputs (:class:`BetaGate` ``outputs=2``, erase then write) that start equal, so the module starts as
its delta rule (:func:`deep_delta.ops.delta.untied_update`). With the ``fused_rules`` switch on (issue 59) the two
other rules run the delta rule's kernels in a mode of their own and fuse exactly where the delta rule does; off,
their lean update, never fused with the next sublayer.

``forward(x, ..., emit=Emit(...))`` also computes what the next sublayer takes from the new state, from the same
fused op, and returns ``(x_new, Carry)``: its compressed read (``emit.what == "read"``: a channel or token
compressor; the Triton kernel reads the new state from the tile it has just written instead of making another
pass over it) or its norm, gate and value (``"inputs"``: d_v = 1, or d_v > 1 through a channel compressor). The
delta design decides which sublayer emits what once per forward (:mod:`deep_delta.designs.delta.fusion`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from deep_delta.layers.additive import NORM_OUTPUTS, branch_dtype
from deep_delta.layers.carry import EMITS, Carry, Emit
from deep_delta.layers.compressors import ChannelCompressor, TokenConvCompressor
from deep_delta.layers.gate import BetaGate
from deep_delta.ops import resolve_backend, switches
from deep_delta.ops.delta import (
    apply_update,
    on_kernels,
    rule_spec,
    update_and_channel_read,
    update_and_norm,
    update_and_token_read,
)
from deep_delta.ops.delta.recompute import active_tape
from deep_delta.ops.norm import norm_gate_value

RESIDUAL_MAPS = ("k", "v")


class DeltaResidual(nn.Module):
    """Wrap ``branch`` (a module from R^d to R^d) with the Deep Delta residual update.

    Args:
        dim: model width d.
        branch: the sublayer F (attention, MLP, ...). It receives the normed input and any extra
            positional/keyword arguments given to ``forward``.
        value_channels: d_v. With d_v = 1 the state is (..., d); with d_v > 1 it is (..., d, d_v) and
            ``forward`` needs the compressed read ``x_in`` (..., d) (the mean over value channels if None).
        residual_map: "k" (k-Map, the paper's primary choice) or "v" (v-Map).
        gate: "linear" or "mlp"; gate_hidden_size: width of the tanh MLP gate.
        beta_init: beta at initialisation (the gate bias is logit(beta_init / beta_max)).
        beta_max: the gate's upper end, beta = beta_max * sigmoid(.); 2 (the paper) allows a reflection, 1 not.
        value_scale: s in ``v = s * sigmoid(.)``.
        k_eps: eps guard of the direction normalisation.
        vmap_rank: rank of the low-rank phi_k branch of the v-Map.
        update_rule: "delta" (the paper's update), "write" (the write-only control ``x + beta k v^T``: the same
            residual without the read, for the ablation the authors name) or "untied" (the erase and the write
            each with its own gate); the last two fused with the next sublayer's read or norm only with
            the ``fused_rules`` switch on (:mod:`deep_delta.ops.switches`; :meth:`fuses_inputs`, :meth:`fuses_norm_of`).
        backend: delta-update backend, "auto", "torch" or "triton".
        norm_output: the dtype the branch gets c in. "module": the norm weight's (``nn.RMSNorm``'s output);
            "autocast": under autocast, the autocast dtype (bf16, say), rounded once after the norm. Right for a
            branch whose first ops on c are matmuls, which autocast would feed that rounding anyway (once per
            matmul: three casts for q, k, v): the forward's values are the same, the casts before the matmuls go,
            and the gradient of c arrives summed in the autocast dtype (as a compiled graph sums it) instead of in
            fp32. The gate reads the unrounded c either way. The library's models use "autocast".
    """

    def __init__(self, dim: int, branch: nn.Module, *, value_channels: int = 1, residual_map: str = "k",
                 gate: str = "linear", gate_hidden_size: int | None = None, beta_init: float = 1.0,
                 beta_max: float = 2.0, value_scale: float = 4.0, k_eps: float = 1e-5, norm_eps: float = 1e-5,
                 vmap_rank: int | None = None, backend: str = "auto",
                 norm_output: str = "module", update_rule: str = "delta"):
        super().__init__()
        gates = rule_spec(update_rule, "DeltaResidual", "update_rule").gates
        self.update_rule = update_rule
        if norm_output not in NORM_OUTPUTS:
            raise ValueError(f"DeltaResidual: `norm_output` must be one of {NORM_OUTPUTS}, got {norm_output!r}")
        if value_channels < 1:
            raise ValueError(f"DeltaResidual: `value_channels` must be >= 1, got {value_channels}")
        if residual_map not in RESIDUAL_MAPS:
            raise ValueError(f"DeltaResidual: `residual_map` must be one of {RESIDUAL_MAPS}, got {residual_map!r}")
        resolve_backend(backend, torch.device("cpu"))  # validates the name
        self.dim, self.value_channels, self.residual_map = dim, value_channels, residual_map
        self.value_scale, self.k_eps, self.backend = value_scale, k_eps, backend
        self.norm_output = norm_output
        self.norm = nn.RMSNorm(dim, eps=norm_eps)
        self.branch = branch
        self.gate = BetaGate(dim, gate, gate_hidden_size, beta_init, beta_max, outputs=len(gates))
        # k-Map with the linear gate: on the Triton backend c, beta and v come from one op
        # (deep_delta.ops.norm.norm_gate_value; a gate of two outputs with the fused_rules switch on: fuses_inputs);
        # False runs the modules (``ddl analyze`` hooks them)
        self.fuse_inputs = residual_map == "k" and gate == "linear"
        if residual_map == "k":
            # v from the raw residual (d_v = 1) or the compressed read (d_v > 1)
            self.value_proj = nn.Linear(dim, value_channels, bias=True)
        else:
            rank = vmap_rank or max(8, dim // 16)
            self.key_down = nn.Linear(dim, rank, bias=False)
            self.key_up = nn.Linear(rank, dim, bias=False)
            self.value_proj = nn.Linear(dim, value_channels, bias=value_channels == 1)
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        """The projections (:meth:`reset_projections`), then the gate (:meth:`BetaGate.reset_parameters`).

        std: weight std, default ``0.5 / sqrt(dim)``. The branch and the norm keep their own init.
        """
        std = std if std is not None else 0.5 / math.sqrt(self.dim)
        self.reset_projections(std)
        self.gate.reset_parameters(std)

    def reset_projections(self, std: float | None = None) -> None:
        """The residual's own projections, in module order (phi_k of the v-Map, then the value projection):
        weights ~ N(0, std^2), biases 0.

        ``DDLPreTrainedModel._init_weights`` calls the gate's ``reset_parameters`` and then this, the order
        in which it meets the modules, so the model's init and this one are the same code.
        """
        std = std if std is not None else 0.5 / math.sqrt(self.dim)
        for lin in (getattr(self, "key_down", None), getattr(self, "key_up", None), self.value_proj):
            if lin is not None:
                nn.init.normal_(lin.weight, std=std)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def extra_repr(self) -> str:
        rule = "" if rule_spec(self.update_rule).paper else f", update_rule={self.update_rule}"
        return f"dim={self.dim}, value_channels={self.value_channels}, map={self.residual_map}{rule}"

    def _check(self, x: torch.Tensor, x_in: torch.Tensor | None) -> None:
        want = (self.dim,) if self.value_channels == 1 else (self.dim, self.value_channels)
        if tuple(x.shape[-len(want):]) != want or x.dim() < len(want) + 1:
            raise ValueError(
                f"DeltaResidual: expected a state of shape (..., {', '.join(map(str, want))}), got {tuple(x.shape)}"
            )
        if x_in is not None and tuple(x_in.shape) != tuple(x.shape[: x.dim() - len(want)]) + (self.dim,):
            raise ValueError(
                f"DeltaResidual: `x_in` must have shape {tuple(x.shape[: x.dim() - len(want)]) + (self.dim,)}, "
                f"got {tuple(x_in.shape)}"
            )

    def forward(self, x: torch.Tensor, *branch_args, x_in: torch.Tensor | None = None,
                prepared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, emit: Emit | None = None,
                **branch_kwargs) -> torch.Tensor | tuple[torch.Tensor, Carry]:
        """x: (..., d) [d_v = 1] or (..., d, d_v); x_in: (..., d) compressed read. Returns the new state, x's shape.

        prepared: this sublayer's ``(c, beta, v)``, computed by the previous sublayer's update (a :class:`Carry`'s
        ``inputs``), or None. emit: what the update also computes for the next sublayer (:class:`Emit`); given,
        the result is ``(x_new, Carry)``, the same values as the next sublayer computing them itself
        (:meth:`_emit`).
        """
        self._check(x, x_in)
        if emit is not None:
            self._check_emit(x, emit)
        k, v, beta = self._update_inputs(x, x_in, branch_args, branch_kwargs, prepared)
        if emit is not None:
            return self._emit(x, k, v, beta, emit)
        if self.value_channels == 1:
            return self._update(x.unsqueeze(-1), k, v, beta).squeeze(-1)
        return self._update(x, k, v, beta)

    def _update(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """The update of state x (..., d, d_v) by this residual's rule."""
        return apply_update(self.update_rule, x, k, v, beta, k_eps=self.k_eps, backend=self.backend)

    def fuses_inputs(self) -> bool:
        """Whether this sublayer's norm, gate and value can come from one op (``fuse_inputs``: the k-Map with the
        linear gate): a gate of one output, or the untied rule's two with the ``fused_rules`` switch on."""
        return self.fuse_inputs and (self.gate.outputs == 1 or switches.get().fused_rules)

    def _fused_rule(self) -> bool:
        """Whether this residual's rule fuses with the next sublayer: the delta rule always, the write-only and untied
        rules with the ``fused_rules`` switch on (before it, they ran their lean update, then the next read)."""
        return on_kernels(self.update_rule)

    def fuses_norm_of(self, nxt: nn.Module, x: torch.Tensor, read: nn.Module | None = None) -> bool:
        """Whether this sublayer's update of state x can compute ``nxt``'s norm, gate and value in the same pass
        (``emit="inputs"``): two delta residuals of one width and d_v, ``nxt`` with the k-Map and the linear
        gate, both on the Triton backend, no state rebuild recording (``recompute_states``); for d_v = 1 without a
        read, for d_v > 1 through ``read``, ``nxt``'s ChannelCompressor; both with the delta rule, or any rules with
        the ``fused_rules`` switch on (:meth:`fuses_inputs`); and the fusion switched on
        (the ``fuse_next_norm`` switch of :mod:`deep_delta.ops.switches`, off until it has passed on a GPU)."""
        if read is None:
            shape_ok = self.value_channels == 1
        else:
            shape_ok = (self.value_channels > 1 and isinstance(read, ChannelCompressor)
                        and (read.dim, read.value_channels) == (self.dim, self.value_channels))
        return (switches.get().fuse_next_norm and shape_ok and isinstance(nxt, DeltaResidual)
                and self._fused_rule() and nxt._fused_rule()
                and nxt.value_channels == self.value_channels and nxt.fuses_inputs() and nxt.dim == self.dim
                and resolve_backend(self.backend, x.device) == "triton"
                and resolve_backend(nxt.backend, x.device) == "triton" and active_tape() is None)

    def _check_emit(self, x: torch.Tensor, emit: Emit) -> None:
        """``emit`` is something this residual can compute with its update of state x (:class:`Emit`)."""
        if emit.what not in EMITS:
            raise ValueError(f"DeltaResidual: `emit.what` got {emit.what!r}; allowed: {' | '.join(EMITS)}")
        if emit.what == "read":
            self._check_read(emit.read, x)
        elif emit.what == "inputs" and not self.fuses_norm_of(emit.nxt, x, emit.read):
            nxt, read = emit.nxt, emit.read
            got = nxt.extra_repr() if isinstance(nxt, DeltaResidual) else type(nxt).__name__
            raise ValueError(
                "DeltaResidual: emit='inputs' needs two delta residuals of one width and d_v on the Triton backend "
                "(d_v = 1, or d_v > 1 with a ChannelCompressor `read` of that state), the second with the k-Map and "
                "the linear gate, both with the delta rule (or DDL_FUSED_RULES on), no state rebuild recording and the "
                "fusion switched on "
                f"(`fuses_norm_of`); got {self.extra_repr()!r} -> {got!r} with "
                f"read={type(read).__name__ if read is not None else None}"
            )

    def _emit(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
              emit: Emit) -> tuple[torch.Tensor, Carry]:
        """The update of state x by (k, v, beta) and what ``emit`` asks for, from one fused op where there is one:
        ``"read"``: the read of the new state by ``emit.read`` (:func:`deep_delta.ops.delta.update_and_channel_read`,
        :func:`~deep_delta.ops.delta.update_and_token_read`, which run the update, then the read, where they do not
        fuse them: the write-only and untied rules with the ``fused_rules`` switch off);
        ``"inputs"``: ``emit.nxt``'s norm, gate and value of the new state (:func:`deep_delta.ops.delta.update_and_norm`,
        through ``emit.read`` for d_v > 1; :meth:`fuses_norm_of` must hold)."""
        if emit.what == "nothing":
            new = self._update(x.unsqueeze(-1), k, v, beta).squeeze(-1) if self.value_channels == 1 else \
                self._update(x, k, v, beta)
            return new, Carry()
        if emit.what == "read":
            read = emit.read
            rule = self.update_rule
            if isinstance(read, ChannelCompressor):
                new, x_in = update_and_channel_read(x, k, v, beta, read.weight, k_eps=self.k_eps, backend=self.backend,
                                                    rule=rule)
            else:
                new, x_in = update_and_token_read(x, k, v, beta, read.folded_weight(), k_eps=self.k_eps,
                                                  backend=self.backend, rule=rule)
            return new, Carry(read=x_in)
        nxt, read = emit.nxt, emit.read
        weights, consts = nxt._input_stage(x)
        out, c, beta2, v2 = update_and_norm(x, k, v, beta, *weights, read=None if read is None else read.weight,
                                            k_eps=self.k_eps, rule=self.update_rule, **consts)
        return out, Carry(inputs=(c, beta2, v2))

    def _input_stage(self, src: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], dict]:
        """This sublayer's RMSNorm, linear gate and k-Map value as :func:`deep_delta.ops.norm.norm_gate_value` (and
        the fused updates that compute them) take them: ``(weights, constants)``, c in the branch's dtype for src."""
        weights = (self.norm.weight, self.gate.proj.weight, self.gate.proj.bias, self.value_proj.weight,
                   self.value_proj.bias)
        return weights, dict(eps=self.norm.eps, beta_max=self.gate.beta_max, value_scale=self.value_scale,
                             c_dtype=self._branch_dtype(src), backend=self.backend)

    def _update_inputs(self, x: torch.Tensor, x_in: torch.Tensor | None, branch_args: tuple, branch_kwargs: dict,
                       prepared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None):
        """The update's (k, v, beta) for state x; from ``prepared``
        (c, beta, v) when the previous update computed them."""
        if prepared is not None:
            if not self.fuses_inputs():
                raise ValueError("DeltaResidual: `prepared` (c, beta, v) needs the k-Map and the linear gate (of two "
                                 "outputs: DDL_FUSED_RULES on)")
            c, beta, v = prepared
            return self.branch(c, *branch_args, **branch_kwargs), v, beta
        if self.value_channels == 1:
            src = x
        else:
            src = x.mean(-1) if x_in is None else x_in
        c_dtype = self._branch_dtype(src)
        if self.fuses_inputs() and resolve_backend(self.backend, src.device) == "triton":  # one read of src
            # src as stored (a bf16 state stays bf16): the op reads it in the norm weight's dtype in registers and
            # writes its gradient in src's dtype, the same values as a cast before it, without the cast's two
            # passes over src (forward) and its gradient (backward)
            weights, consts = self._input_stage(src)
            c, beta, v = norm_gate_value(src, *weights, **consts)
            return self.branch(c, *branch_args, **branch_kwargs), v, beta
        # elsewhere the modules themselves (the lean op, deep_delta.ops.norm.lean, is their ops bit for bit;
        # the modules keep the gradient of c summed in today's order and their forward hooks firing)
        src = src.to(self.norm.weight.dtype)  # a state stored in lower precision is read in the module's dtype
        c = self.norm(src)
        c_low = c if c_dtype is None else c.to(c_dtype)  # what the branch's (and phi_k's) matmuls read
        h = self.branch(c_low, *branch_args, **branch_kwargs)
        beta = self.gate(c)
        if self.residual_map == "k":
            k = h
            v = self.value_scale * torch.sigmoid(self.value_proj(src).to(torch.promote_types(src.dtype, torch.float32)))
        else:
            k = self.key_up(self.key_down(c_low))
            if self.value_channels == 1:
                v = self.value_scale * torch.sigmoid(self.value_proj(h).to(torch.promote_types(h.dtype, torch.float32)))
            else:
                v = self.value_proj(h)
        return k, v, beta

    def _branch_dtype(self, src: torch.Tensor) -> torch.dtype | None:
        """The dtype the branch gets c in when it is not the norm weight's (``norm_output``), else None."""
        return branch_dtype(self.norm_output, self.norm, src)

    def _check_read(self, read: nn.Module, x: torch.Tensor) -> None:
        if self.value_channels == 1:
            raise ValueError(
                "DeltaResidual: `read` (a fused next-sublayer read) needs a delta residual with value_channels > 1, "
                f"got value_channels={self.value_channels}"
            )
        if not isinstance(read, (ChannelCompressor, TokenConvCompressor)):
            raise ValueError(
                f"DeltaResidual: `read` must be a ChannelCompressor or a TokenConvCompressor (the reads that can be "
                f"fused with the update), got {type(read).__name__}"
            )
        if (read.dim, read.value_channels) != (self.dim, self.value_channels):
            raise ValueError(
                f"DeltaResidual: `read` must read a ({self.dim}, {self.value_channels}) state, got a "
                f"{type(read).__name__} for ({read.dim}, {read.value_channels})"
            )
        if isinstance(read, TokenConvCompressor) and x.dim() != 4:
            raise ValueError(f"DeltaResidual: a fused TokenConvCompressor read needs a (B, T, d, d_v) state, got "
                             f"{tuple(x.shape)}")
