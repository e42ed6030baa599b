"""The sublayer's input stage of a k-Map DDL residual with the linear gate, from one read of its source row.

``norm_gate_value(src, ...)`` returns ``(c, beta, v)``: the normed sublayer input ``c = RMSNorm(src)``, the gate
``beta = beta_max sigmoid(c . w_g + b_g)`` and the value ``v = value_scale sigmoid(W_v src + b_v)``, which
:class:`deep_delta.layers.DeltaResidual` used to compute as three modules (a norm and two GEMVs, each reading
src or c again). ``backend`` follows :func:`deep_delta.ops.backend.resolve_backend`: ``"torch"`` is the lean path
(:mod:`.lean`: the module's own ops, bit for bit), ``"triton"`` the fused kernels (:mod:`.triton`; CPU tensors
only under the Triton interpreter), ``"auto"`` the custom op (:mod:`.library`, one node under ``torch.compile``)
where it resolves to Triton (CUDA) while compiling, the kernels' Function in eager there, and the lean path
elsewhere. ``"triton"`` goes through the custom op while compiling too, which it tells to run the kernels
(:func:`deep_delta.ops.backend.through_registered_op`). The plain reference is :mod:`.naive`.
"""

from __future__ import annotations

import math

import torch

from deep_delta.ops.backend import resolve_backend, through_registered_op
from deep_delta.ops.norm.lean import norm_gate_value_lean
from deep_delta.ops.norm.naive import (
    norm_gate_value_reference,
    update_and_norm_reference,
)

Tensor = torch.Tensor


def _check(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
           value_bias: Tensor, eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None) -> None:
    if c_dtype is not None and (not isinstance(c_dtype, torch.dtype) or not c_dtype.is_floating_point):
        raise TypeError(f"norm_gate_value: `c_dtype` must be None or a floating-point torch.dtype, got {c_dtype!r}")
    if src.dim() < 1:
        raise ValueError(f"norm_gate_value: `src` must have shape (..., d), got {tuple(src.shape)}")
    d = src.shape[-1]
    if value_weight.dim() != 2 or value_weight.shape[1] != d or value_weight.shape[0] < 1:
        raise ValueError(f"norm_gate_value: `value_weight` must have shape (d_v, {d}) with d_v >= 1 (src is "
                         f"{tuple(src.shape)}), got {tuple(value_weight.shape)}")
    dv = value_weight.shape[0]
    expected = {"norm_weight": (norm_weight, (d,)), "gate_weight": (gate_weight, (1, d)),
                "gate_bias": (gate_bias, (1,)), "value_bias": (value_bias, (dv,))}
    for name, (t, shape) in expected.items():
        if tuple(t.shape) != shape:
            hint = f"d_v = {dv} from `value_weight`" if name == "value_bias" else f"d = {d} from `src`"
            raise ValueError(f"norm_gate_value: `{name}` must have shape {shape} ({hint}), got {tuple(t.shape)}")
    for name, t in (("src", src), ("norm_weight", norm_weight), ("gate_weight", gate_weight),
                    ("gate_bias", gate_bias), ("value_weight", value_weight), ("value_bias", value_bias)):
        if not t.is_floating_point():
            raise TypeError(f"norm_gate_value: `{name}` must be a floating-point tensor, got {t.dtype}")
    for name, value, ok, allowed in (("eps", eps, eps >= 0, ">= 0"), ("beta_max", beta_max, beta_max > 0, "> 0"),
                                     ("value_scale", value_scale, True, "any finite number")):
        if not (math.isfinite(value) and ok):
            raise ValueError(f"norm_gate_value: `{name}` got {value}; allowed: {allowed}")


def norm_gate_value(
    src: Tensor,
    norm_weight: Tensor,
    gate_weight: Tensor,
    gate_bias: Tensor,
    value_weight: Tensor,
    value_bias: Tensor,
    *,
    eps: float,
    beta_max: float,
    value_scale: float,
    c_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """The RMSNorm, the linear gate and the k-Map value of one source row, read once.

    Args:
        src: (..., d), the sublayer's source row (the residual x for d_v = 1, the compressed read x_in for
            d_v > 1); read in ``norm_weight``'s dtype (a state stored in lower precision is cast, as the
            module does).
        norm_weight: (d,), the RMSNorm's g; eps: its eps, added to the mean of squares (``nn.RMSNorm``).
        gate_weight: (1, d) and gate_bias: (1,), the linear gate ``beta = beta_max sigmoid(c . w_g + b_g)``.
        value_weight: (d_v, d) and value_bias: (d_v,), the value ``v = value_scale sigmoid(W_v src + b_v)``.
        c_dtype: the dtype c is returned in; None: norm_weight's. The gate reads c before this rounding, so
            only c itself changes: :class:`deep_delta.layers.DeltaResidual` passes the autocast dtype under
            autocast (``norm_output="autocast"``), the dtype its branch's matmuls read c in anyway, which spares
            the casts before them and halves c's bytes and its gradient's.
        backend: "auto", "torch" or "triton" (module docstring).
    Returns:
        c (..., d) in c_dtype (default norm_weight's dtype); beta (..., 1) and v (..., d_v) in fp32 (fp64 for fp64 weights).
        The gate's logits are fp32 under autocast too; the lean path's value projection runs in the autocast
        dtype, as ``nn.Linear`` does, and the kernels' in fp32.
    """
    _check(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype)
    args = (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias)
    impl = resolve_backend(backend, src.device)
    if impl == "triton" and through_registered_op(backend, impl, src.dtype):  # the registered op: one node under compile
        from deep_delta.ops.norm.library import norm_gate_value_with_op

        return norm_gate_value_with_op(*args, eps, beta_max, value_scale, c_dtype, backend)
    if impl == "triton":
        from deep_delta.ops.norm.triton import norm_gate_value_triton

        return norm_gate_value_triton(*args, eps=eps, beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype)
    return norm_gate_value_lean(*args, eps=eps, beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype)


def _flatten(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor | None) -> tuple[Tensor, ...]:
    """(x, k, v, beta) with one leading dimension, contiguous: x (N, d) or (N, d, d_v) with ``read``."""
    d, dv = x.shape[-1] if read is None else x.shape[-2], v.shape[-1]
    n = k.numel() // d
    state = (n, d) if read is None else (n, d, dv)
    return (x.reshape(state).contiguous(), k.reshape(n, d).contiguous(), v.reshape(n, dv).contiguous(),
            beta.reshape(n, 1).contiguous())


def _unflatten(outs: tuple[Tensor, ...], x: Tensor, dv_next: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A fused op's flat outputs (x', c, beta', v') back at x's leading shape."""
    out, c, beta2, v2 = outs
    lead, d = c.shape[:-1], c.shape[-1]
    lead = x.shape[: x.dim() - (out.dim() - 1)]
    return out.view(x.shape), c.view(*lead, d), beta2.view(*lead, 1), v2.view(*lead, dv_next)


def update_and_norm(
    x: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    norm_weight: Tensor,
    gate_weight: Tensor,
    gate_bias: Tensor,
    value_weight: Tensor,
    value_bias: Tensor,
    *,
    read: Tensor | None = None,
    k_eps: float,
    eps: float,
    beta_max: float,
    value_scale: float,
    c_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A delta update fused with the next sublayer's input stage: ``(x', c, beta', v')``.

    Without ``read`` (a d_v = 1 state): ``x' = delta_update(x[..., None], k, v, beta)[..., 0]`` followed by
    ``norm_gate_value(x', norm_weight, ...)``. With ``read`` (d_v > 1, the next sublayer's channel compressor
    weight (d, d_v)): ``x' = delta_update(x, k, v, beta)``, ``x_in = channel_compress(x', read)`` and
    ``(c, beta', v') = norm_gate_value(x_in, norm_weight, ...)``. The Triton kernels (:mod:`.triton_update`)
    compute the next sublayer's inputs from the tile they have just written (the read without storing it), and the
    backward runs the input stage's (and the read's) backward in registers before the update's: each state row
    read once per direction.

    Args:
        x: (..., d) without ``read``, (..., d, d_v) with it; k: (..., d), the raw direction; v: (..., 1) or
            (..., d_v); beta: (..., 1).
        norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype: the
            next sublayer's, as :func:`norm_gate_value` takes them (value_weight (d_v', d): the next sublayer's
            value width).
        read: the next sublayer's channel compressor weight (d, d_v) for a d_v > 1 state, else None.
        k_eps: this update's direction normalisation guard.
        backend: "auto", "torch" or "triton" (:func:`norm_gate_value`'s rules).
    """
    if read is None:
        if x.dim() < 1 or tuple(k.shape) != tuple(x.shape):
            raise ValueError(f"update_and_norm: `x` and `k` must have the same shape (..., d) without `read`, got "
                             f"{tuple(x.shape)} and {tuple(k.shape)}")
        shapes = (("v", v, tuple(x.shape[:-1]) + (1,)), ("beta", beta, tuple(x.shape[:-1]) + (1,)))
        src = x
    else:
        if x.dim() < 2 or tuple(k.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"update_and_norm: with `read`, `x` must have shape (..., d, d_v) and `k` (..., d), got "
                             f"{tuple(x.shape)} and {tuple(k.shape)}")
        lead, dv = tuple(x.shape[:-2]), x.shape[-1]
        shapes = (("v", v, lead + (dv,)), ("beta", beta, lead + (1,)), ("read", read, tuple(x.shape[-2:])))
        src = x[..., 0]
    for name, t, shape in shapes:
        if tuple(t.shape) != shape:
            raise ValueError(f"update_and_norm: `{name}` must have shape {shape} (x is {tuple(x.shape)}), got "
                             f"{tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"update_and_norm: `{name}` must be a floating-point tensor, got {t.dtype}")
    if not (math.isfinite(k_eps) and k_eps >= 0):
        raise ValueError(f"update_and_norm: `k_eps` got {k_eps}; allowed: a finite number >= 0")
    _check(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype)
    weights = (norm_weight, gate_weight, gate_bias, value_weight, value_bias)
    consts = dict(k_eps=k_eps, eps=eps, beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype)
    impl = resolve_backend(backend, x.device)
    if impl == "triton":  # the kernels, on flattened tensors: through the custom op while compiling (one node)
        flat = _flatten(x, k, v, beta, read)
        if through_registered_op(backend, impl, x.dtype):
            from deep_delta.ops.norm.library import update_norm_with_op

            outs = update_norm_with_op(*flat, read, *weights, backend=backend, **consts)
        else:
            from deep_delta.ops.norm.triton_update import update_and_norm_triton

            outs = update_and_norm_triton(*flat, read, *weights, **consts)
        return _unflatten(outs, x, value_weight.shape[0])
    from deep_delta.ops.delta import delta_update, update_and_channel_read

    if read is None:
        out = delta_update(x.unsqueeze(-1), k, v, beta, k_eps=k_eps, backend=backend).squeeze(-1)
        x_in = out
    else:
        out, x_in = update_and_channel_read(x, k, v, beta, read, k_eps=k_eps, backend=backend)
    return (out, *norm_gate_value(x_in, *weights, eps=eps, beta_max=beta_max, value_scale=value_scale,
                                  c_dtype=c_dtype, backend=backend))


__all__ = ["norm_gate_value", "norm_gate_value_lean", "norm_gate_value_reference", "update_and_norm",
           "update_and_norm_reference"]
