"""The sublayer's input stage of a k-Map DDL residual with the linear gate, from one read of its source row.

``norm_gate_value(src, ...)`` returns ``(c, beta, v)``: the normed sublayer input ``c = RMSNorm(src)``, the gate
``beta = beta_max sigmoid(c . w_g + b_g)`` and the value ``v = value_scale sigmoid(W_v src + b_v)``, which
:class:`deep_delta.layers.DeltaResidual` used to compute as three modules (a norm and two GEMVs, each reading
src or c again). ``backend`` follows :func:`deep_delta.ops.backend.resolve_backend`: ``"torch"`` is the lean path
(:mod:`.lean`: the module's own ops, bit for bit), ``"triton"`` the fused kernels (:mod:`.triton`; CPU tensors
only under the Triton interpreter), ``"auto"`` the custom op (:mod:`.library`, one node under ``torch.compile``)
where it resolves to Triton (CUDA) while compiling, the kernels' Function in eager there, and the lean path
elsewhere. ``"triton"`` goes through the custom op while compiling too, which it tells to run the kernels
(:func:`deep_delta.ops.backend.through_registered_op`). The three routes are the op's entries in the table of
:func:`deep_delta.ops.backend.dispatch`. The plain reference is :mod:`.naive`.
"""

from __future__ import annotations

import math

import torch

from deep_delta.ops.backend import dispatch, lazy, register
from deep_delta.ops.norm.lean import norm_gate_value_lean
from deep_delta.ops.norm.naive import norm_gate_value_reference

Tensor = torch.Tensor


def _kernels():
    from deep_delta.ops.norm import triton

    return triton


def _library():
    from deep_delta.ops.norm import library

    return library


register("norm_gate_value", torch=norm_gate_value_lean, triton=lazy(_kernels, "norm_gate_value_triton"),
         library=lazy(_library, "norm_gate_value_with_op"))


def check_norm_inputs(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
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
    if gate_weight.dim() != 2 or tuple(gate_weight.shape) not in ((1, d), (2, d)):
        raise ValueError(f"norm_gate_value: `gate_weight` must have shape (1, {d}) or (2, {d}) (one gate, or the "
                         f"untied rule's two; src is {tuple(src.shape)}), got {tuple(gate_weight.shape)}")
    gates = gate_weight.shape[0]
    expected = {"norm_weight": (norm_weight, (d,)), "gate_bias": (gate_bias, (gates,)), "value_bias": (value_bias, (dv,))}
    for name, (t, shape) in expected.items():
        if tuple(t.shape) != shape:
            hint = {"value_bias": f"d_v = {dv} from `value_weight`", "gate_bias": f"{gates} gates from `gate_weight`"
                    }.get(name, f"d = {d} from `src`")
            raise ValueError(f"norm_gate_value: `{name}` must have shape {shape} ({hint}), got {tuple(t.shape)}")
    for name, t in (("src", src), ("norm_weight", norm_weight), ("gate_weight", gate_weight),
                    ("gate_bias", gate_bias), ("value_weight", value_weight), ("value_bias", value_bias)):
        if not t.is_floating_point():
            raise TypeError(f"norm_gate_value: `{name}` must be a floating-point tensor, got {t.dtype}")
    for name, value, ok, allowed in (("eps", eps, eps >= 0, ">= 0"), ("beta_max", beta_max, beta_max > 0, "> 0"),
                                     ("value_scale", value_scale, True, "any finite number")):
        if not (math.isfinite(value) and ok):
            raise ValueError(f"norm_gate_value: `{name}` got {value}; allowed: {allowed}")


def norm_gate_value(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
                    value_bias: Tensor, *, eps: float, beta_max: float, value_scale: float,
                    c_dtype: torch.dtype | None = None, backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """The RMSNorm, the linear gate and the k-Map value of one source row, read once.

    Args:
        src: (..., d), the sublayer's source row (the residual x for d_v = 1, the compressed read x_in for
            d_v > 1); read in ``norm_weight``'s dtype (a state stored in lower precision is cast, as the
            module does).
        norm_weight: (d,), the RMSNorm's g; eps: its eps, added to the mean of squares (``nn.RMSNorm``).
        gate_weight: (G, d) and gate_bias: (G,), the linear gate ``beta = beta_max sigmoid(c . w_g + b_g)``; G = 1, or
            2 for the untied rule's erase and write gates (each its own row).
        value_weight: (d_v, d) and value_bias: (d_v,), the value ``v = value_scale sigmoid(W_v src + b_v)``.
        c_dtype: the dtype c is returned in; None: norm_weight's. The gate reads c before this rounding, so
            only c itself changes: :class:`deep_delta.layers.DeltaResidual` passes the autocast dtype under
            autocast (``norm_output="autocast"``), the dtype its branch's matmuls read c in anyway, which spares
            the casts before them and halves c's bytes and its gradient's.
        backend: "auto", "torch" or "triton" (module docstring).
    Returns:
        c (..., d) in c_dtype (default norm_weight's dtype); beta (..., G) and v (..., d_v) in fp32 (fp64 for fp64 weights).
        The gate's logits are fp32 under autocast too; the lean path's value projection runs in the autocast
        dtype, as ``nn.Linear`` does, and the kernels' in fp32.
    """
    check_norm_inputs(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype)
    # off the Triton path always the lean ops ("auto" too: their autograd is the module's gradients bit for bit,
    # which the custom op's closed-form backward is not)
    return dispatch("norm_gate_value", backend, src)(src, norm_weight, gate_weight, gate_bias, value_weight,
                                                     value_bias, eps=eps, beta_max=beta_max,
                                                     value_scale=value_scale, c_dtype=c_dtype)


__all__ = ["check_norm_inputs", "norm_gate_value", "norm_gate_value_lean", "norm_gate_value_reference"]
