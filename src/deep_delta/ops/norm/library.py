"""The sublayer's input stage (RMSNorm, linear gate, k-Map value) as ``torch.library`` custom ops (namespace
``deep_delta``), in the style of :mod:`deep_delta.ops.delta.library`:

| op | CUDA kernel | every other device |
| --- | --- | --- |
| ``deep_delta::norm_gate_value(src, g, w_g, b_g, W_v, b_v, eps, beta_max, value_scale, c_dtype, backend) -> (c, beta, v)`` | Triton (:mod:`.triton`) | lean math (:mod:`.lean`) |
| ``deep_delta::norm_gate_value_backward(gc, gbeta, gv, src, g, w_g, b_g, W_v, b_v, eps, beta_max, value_scale, backend)`` | Triton | the closed-form lean backward |

``backend`` is the caller's, ``"auto"`` (the table) or ``"triton"``: the kernels on every device (CPU tensors
under the Triton interpreter), as in :mod:`deep_delta.ops.delta.library`. The backward op is what
``register_autograd`` calls, with the forward's ``backend`` (no double backward). Shapes are the flattened ones:
src (N, d), g (d,), w_g (G, d), b_g (G,) (G = 1, or the untied rule's 2 gates), W_v (d_v, d), b_v (d_v,), all
contiguous. One opaque node under
``torch.compile``, so a whole model compiles with ``fullgraph=True``. :func:`deep_delta.ops.norm.norm_gate_value`
calls it for ``backend="auto"`` on CUDA while compiling and for fp64, and for ``backend="triton"`` while
compiling; on other devices ``"auto"`` runs the lean ops directly (their autograd is bit for bit the module's
gradients, which the closed-form backward is not). tests/ops/test_custom_ops.py runs ``torch.library.opcheck`` on
both ops, with either backend. The updates fused with this input stage are :mod:`deep_delta.ops.delta.library`'s;
each op is registered by :func:`deep_delta.ops.backend.register_op`.
"""

from __future__ import annotations

import torch

from deep_delta.ops.backend import register_op
from deep_delta.ops.launch import check_device
from deep_delta.ops.norm.lean import (
    missing_grads_as_zeros,
    norm_gate_value_backward_lean,
    norm_gate_value_lean,
    out_dtype,
)

Tensor = torch.Tensor


def _forward_lean(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
                  value_bias: Tensor, eps: float, beta_max: float, value_scale: float,
                  c_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, Tensor]:
    """(c, beta, v) of a flattened src (N, d); c in c_dtype (None: the norm weight's). Lean math."""
    c, beta, v = norm_gate_value_lean(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps=eps,
                                      beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype)
    return c.contiguous(), beta.contiguous(), v.contiguous()


def _forward_triton(*args) -> tuple[Tensor, Tensor, Tensor]:
    from deep_delta.ops.norm.triton import triton_forward

    return triton_forward(*args)


def _forward(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
             value_bias: Tensor, eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None,
             backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]: ...


def _forward_fake(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale,
                  c_dtype, backend="auto"):
    n, d = src.shape
    return (src.new_empty(n, d, dtype=c_dtype or norm_weight.dtype),
            src.new_empty(n, gate_weight.shape[0], dtype=out_dtype(norm_weight)),
            src.new_empty(n, value_weight.shape[0], dtype=out_dtype(norm_weight)))


norm_gate_value_op = register_op("norm_gate_value", _forward, _forward_lean, _forward_triton, _forward_fake)


def _backward_triton(*args) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from deep_delta.ops.norm.triton import triton_backward

    return triton_backward(*args)


def _backward(gc: Tensor, gbeta: Tensor, gv: Tensor, src: Tensor, norm_weight: Tensor, gate_weight: Tensor,
              gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, eps: float, beta_max: float,
              value_scale: float, backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]: ...


norm_gate_value_backward_op = register_op(
    "norm_gate_value_backward", _backward, norm_gate_value_backward_lean, _backward_triton,
    lambda gc, gbeta, gv, *tensors_and_consts: tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                                                     for t in tensors_and_consts[:6]))


def _save_inputs(ctx, inputs, output) -> None:
    *tensors, eps, beta_max, value_scale, _, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.consts = (eps, beta_max, value_scale, backend)


def _norm_gate_value_grad(ctx, gc, gbeta, gv):
    src, norm_weight, gate_weight, gate_bias, value_weight, value_bias = ctx.saved_tensors
    gc, gbeta, gv = missing_grads_as_zeros(gc, gbeta, gv, src, norm_weight, value_weight, gate_weight.shape[0])
    grads = norm_gate_value_backward_op(gc, gbeta, gv, *ctx.saved_tensors, *ctx.consts)
    return (*grads, None, None, None, None, None)


norm_gate_value_op.register_autograd(_norm_gate_value_grad, setup_context=_save_inputs)

OPS = (norm_gate_value_op, norm_gate_value_backward_op)


def norm_gate_value_with_op(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
                            value_weight: Tensor, value_bias: Tensor, eps: float, beta_max: float,
                            value_scale: float, c_dtype: torch.dtype | None = None,
                            backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """The custom op at any leading shape: src (..., d) -> c (..., d), beta (..., G), v (..., d_v); ``backend``:
    "auto" or "triton" (module docstring)."""
    if backend == "triton":
        check_device("norm_gate_value", src)
    lead, d = src.shape[:-1], src.shape[-1]
    c, beta, v = norm_gate_value_op(
        src.reshape(-1, d).contiguous(), norm_weight.contiguous(), gate_weight.contiguous(), gate_bias.contiguous(),
        value_weight.contiguous(), value_bias.contiguous(), float(eps), float(beta_max), float(value_scale), c_dtype,
        backend)
    return c.view(*lead, d), beta.view(*lead, gate_weight.shape[0]), v.view(*lead, value_weight.shape[0])
