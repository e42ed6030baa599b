"""The delta update and the fused update + CC read as ``torch.library`` custom ops (namespace ``deep_delta``).

A custom op is one node to ``torch.compile`` (Dynamo and AOTAutograd see its fake implementation, never its
kernels), so the whole model compiles with ``fullgraph=True`` and the same kernels run compiled and eager:

| op | CUDA kernel | every other device (CPU) |
| --- | --- | --- |
| ``deep_delta::delta_update(x, k, v, beta, k_eps, rule, backend) -> x'`` | Triton (:mod:`.triton`) | lean math (:mod:`.lean`) |
| ``deep_delta::delta_update_read(x, k, v, beta, c, k_eps, rule, backend) -> (x', x_in)`` | Triton, fused | lean update, then the CC read |
| ``deep_delta::delta_update_backward(g, x, k, v, beta, k_eps, rule, backend)`` | Triton | lean math |
| ``deep_delta::delta_update_read_backward(g, g_in, x, x', k, v, beta, c, k_eps, rule, backend)`` | Triton, fused | lean math |
| ``deep_delta::update_norm(x, k, v, beta, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, c_dtype, rule, backend) -> (x', c, beta', v')`` | Triton (:mod:`.triton_norm`) | the lean update, then the lean input stage (:mod:`.lean_norm`) |
| ``deep_delta::update_norm_backward(g, gc, gbeta', gv', x, k, v, beta, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, rule, backend)`` | Triton | the lean backwards, one after the other |
| ``deep_delta::update_read_norm(x, k, v, beta, c_read, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, c_dtype, rule, backend) -> (x', c, beta', v')`` | Triton (:mod:`.triton_norm`) | the lean update, CC read and input stage |
| ``deep_delta::update_read_norm_backward(g, gc, gbeta', gv', x, k, v, beta, c_read, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, rule, backend)`` | Triton | the lean backwards, one after the other |

``rule`` is the update rule (``DDLConfig.update_rule``): "delta", "write" (the write-only control) or "untied" (beta
(N, 2), the erase then the write gate, and its gradient (N, 2)), a mode of the same kernels (:mod:`.triton`'s
``ERASE``) and of the lean math (:func:`.lean.rule_forward`, :func:`.lean.rule_backward`).

Each op is registered by :func:`deep_delta.ops.backend.register_op` from a prototype (its signature), its lean
and Triton implementations and its fake.

``backend`` is the name the caller was given, ``"auto"`` (the table; fp64 keeps the lean math on CUDA too) or
``"triton"``: the Triton kernels on every device (CPU tensors under the Triton interpreter), so that
``backend="triton"`` runs the same kernels compiled as in eager. The two backward ops are what
``register_autograd`` calls, with the forward's ``backend`` (they have no autograd of their own: no double
backward). Shapes are the flattened ones: x (N, d, d_v), k (N, d), v (N, d_v), beta (N, 1) (or (N, 2)), c (d, d_v),
all contiguous; :func:`deep_delta.ops.delta.delta_update` and :func:`deep_delta.ops.delta.update_and_channel_read`
reshape to them (``backend="auto"``). The plain reference stays :mod:`.naive`; tests/ops/test_custom_ops.py
runs ``torch.library.opcheck`` on every op here and compares values and gradients with the reference.

The state rebuild (:class:`.recompute.StateTape`) works in eager: the kernels record the update on the active
tape as the autograd Functions do. Under ``torch.compile`` the kernels are not run while tracing, so there is
nothing to record; the model refuses ``recompute_states`` there (``DDLModel._use_tape``).
"""

from __future__ import annotations

import math

import torch

from deep_delta.ops.backend import register_op
from deep_delta.ops.delta.lean import rule_backward, rule_forward, update_read_backward_lean
from deep_delta.ops.delta.lean_norm import (
    missing_update_grads,
    update_norm_backward_lean,
    update_norm_forward_lean,
    update_read_norm_backward_lean,
    update_read_norm_forward_lean,
)
from deep_delta.ops.delta.recompute import active_tape, delta_rebuild
from deep_delta.ops.launch import check_device
from deep_delta.ops.norm.lean import out_dtype

Tensor = torch.Tensor
Grads4 = tuple[Tensor, Tensor, Tensor, Tensor]


def _record(x: Tensor, out: Tensor, k: Tensor, delta: Tensor | None, k_eps: float) -> None:
    """Tell the active :class:`StateTape` (eager only) how to rebuild x from out."""
    tape = active_tape()
    if tape is not None and delta is not None:
        tape.record(x, out, delta_rebuild(k, delta, k_eps))


def _fresh(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Empty contiguous tensors shaped as ``tensors`` (a fake's gradients)."""
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors)


# ----------------------------------------------------------------------------- the update


def _update_lean(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, rule: str) -> Tensor:
    """``x + beta u (v^T - u^T x)``, u = k normalised (or the rule's); flattened shapes (module docstring). Lean
    math."""
    out, delta = rule_forward(rule, x, k, v, beta, k_eps)
    _record(x, out, k, delta, k_eps)
    return out


def _update_triton(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, rule: str) -> Tensor:
    from deep_delta.ops.delta.triton import triton_forward

    out, _, delta = triton_forward(x, k, v, beta, None, k_eps, want_delta=active_tape() is not None, rule=rule)
    _record(x, out, k, delta, k_eps)
    return out


def _update(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, rule: str = "delta",
            backend: str = "auto") -> Tensor: ...


delta_update_op = register_op("delta_update", _update, _update_lean, _update_triton,
                              lambda x, *rest: torch.empty_like(x, memory_format=torch.contiguous_format))


def _update_read_lean(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float,
                      rule: str) -> tuple[Tensor, Tensor]:
    """(x', x_in): the update and the CC read ``x_in_i = sum_j c_ij x'_ij`` of the new state. Lean math."""
    from deep_delta.ops.compress.lean import channel_read

    out, delta = rule_forward(rule, x, k, v, beta, k_eps)
    _record(x, out, k, delta, k_eps)
    return out, channel_read(out, c)


def _update_read_triton(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float,
                        rule: str) -> tuple[Tensor, Tensor]:
    from deep_delta.ops.delta.triton import triton_forward

    out, xin, delta = triton_forward(x, k, v, beta, c, k_eps, want_delta=active_tape() is not None, rule=rule)
    _record(x, out, k, delta, k_eps)
    return out, xin


def _update_read(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float, rule: str = "delta",
                 backend: str = "auto") -> tuple[Tensor, Tensor]: ...


delta_update_read_op = register_op(
    "delta_update_read", _update_read, _update_read_lean, _update_read_triton,
    lambda x, *rest: (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[:-1])))


def _update_backward_lean(g: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float,
                          rule: str) -> Grads4:
    return rule_backward(rule, g, x, k, v, beta, k_eps)


def _update_backward_triton(g: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float,
                            rule: str) -> Grads4:
    from deep_delta.ops.delta.triton import triton_backward

    return triton_backward(g, None, x, k, v, beta, None, k_eps, rule)[:4]


def _update_backward(g: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, rule: str = "delta",
                     backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


delta_update_backward_op = register_op("delta_update_backward", _update_backward, _update_backward_lean,
                                       _update_backward_triton, lambda g, x, k, v, beta, *rest: _fresh(x, k, v, beta))


def _update_read_backward_triton(g: Tensor, gin: Tensor, x: Tensor, out: Tensor, k: Tensor, v: Tensor, beta: Tensor,
                                 c: Tensor, k_eps: float, rule: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The kernel recomputes x' in registers: ``out`` is the lean path's."""
    from deep_delta.ops.delta.triton import triton_backward

    return triton_backward(g, gin, x, k, v, beta, c, k_eps, rule)


def _update_read_backward(g: Tensor, gin: Tensor, x: Tensor, out: Tensor, k: Tensor, v: Tensor, beta: Tensor,
                          c: Tensor, k_eps: float, rule: str = "delta",
                          backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]: ...


delta_update_read_backward_op = register_op(
    "delta_update_read_backward", _update_read_backward, update_read_backward_lean, _update_read_backward_triton,
    lambda g, gin, x, out, k, v, beta, c, *rest: _fresh(x, k, v, beta, c))


def _save_inputs(ctx, inputs, output) -> None:
    *tensors, k_eps, rule, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.k_eps, ctx.rule, ctx.backend = k_eps, rule, backend


def _save_inputs_and_state(ctx, inputs, output) -> None:
    """The fused op also saves its new state x' for grad_c (the next update's input, kept anyway; the extra
    memory is the model's last state only)."""
    x, k, v, beta, c, k_eps, rule, backend = inputs
    ctx.save_for_backward(x, output[0], k, v, beta, c)
    ctx.k_eps, ctx.rule, ctx.backend = k_eps, rule, backend


def _delta_update_grad(ctx, g):
    return (*delta_update_backward_op(g.contiguous(), *ctx.saved_tensors, ctx.k_eps, ctx.rule, ctx.backend), None,
            None, None)


def _delta_update_read_grad(ctx, g, gin):
    x, out, k, v, beta, c = ctx.saved_tensors
    # an unused output's gradient may arrive as None
    g = torch.zeros_like(x) if g is None else g.contiguous()
    gin = x.new_zeros(x.shape[:-1]) if gin is None else gin.contiguous()
    return (*delta_update_read_backward_op(g, gin, x, out, k, v, beta, c, ctx.k_eps, ctx.rule, ctx.backend), None,
            None, None)


delta_update_op.register_autograd(_delta_update_grad, setup_context=_save_inputs)
delta_update_read_op.register_autograd(_delta_update_read_grad, setup_context=_save_inputs_and_state)


def update_with_op(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor | None = None, k_eps: float = 1e-5,
    backend: str = "auto", rule: str = "delta",
) -> Tensor | tuple[Tensor, Tensor]:
    """The update through the custom ops, at any leading shape: x (..., d, d_v), k (..., d), v (..., d_v),
    beta (..., 1) ((..., 2) for the untied ``rule``); returns x' (..., d, d_v), or (x', x_in (..., d)) with c (d, d_v)
    the fused CC read. ``backend``: "auto" or "triton" (module docstring)."""
    if backend == "triton":
        check_device("update_and_channel_read" if c is not None else "delta_update", x)
    *lead, d, dv = x.shape
    n = math.prod(lead)
    flat = (x.reshape(n, d, dv).contiguous(), k.reshape(n, d).contiguous(), v.reshape(n, dv).contiguous(),
            beta.reshape(n, beta.shape[-1]).contiguous())
    if c is None:
        return delta_update_op(*flat, float(k_eps), rule, backend).view(x.shape)
    out, xin = delta_update_read_op(*flat, c.contiguous(), float(k_eps), rule, backend)
    return out.view(x.shape), xin.view(*x.shape[:-1])


# ----------------------------------------------------------------------------- the update fused with the next input stage


def _inputs_fake(x: Tensor, norm_weight: Tensor, gate_weight: Tensor, value_weight: Tensor,
                 c_dtype: torch.dtype | None):
    """The fake outputs (x', c (N, d), beta' (N, G'), v' (N, d_v')) of an update fused with the next input stage."""
    n, d = x.shape[0], x.shape[1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(n, d, dtype=c_dtype or norm_weight.dtype),
            x.new_empty(n, gate_weight.shape[0], dtype=out_dtype(norm_weight)),
            x.new_empty(n, value_weight.shape[0], dtype=out_dtype(norm_weight)))


def _update_norm_triton(*args):
    from deep_delta.ops.delta.triton_norm import triton_forward

    return triton_forward(*args)


def _update_norm(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, norm_weight: Tensor, gate_weight: Tensor,
                 gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float,
                 beta_max: float, value_scale: float, c_dtype: torch.dtype | None, rule: str = "delta",
                 backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


update_norm_op = register_op(
    "update_norm", _update_norm, update_norm_forward_lean, _update_norm_triton,
    lambda x, k, v, beta, g, wg, bg, wv, bv, k_eps, eps, bmax, vs, c_dtype, *rest: _inputs_fake(x, g, wg, wv, c_dtype))


def _update_norm_backward_triton(*args):
    from deep_delta.ops.delta.triton_norm import triton_backward

    return triton_backward(*args)


def _update_norm_backward(g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor,
                          beta: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
                          value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float, beta_max: float,
                          value_scale: float, rule: str = "delta", backend: str = "auto",
                          ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]: ...


update_norm_backward_op = register_op(
    "update_norm_backward", _update_norm_backward, update_norm_backward_lean, _update_norm_backward_triton,
    lambda g, gc, gb, gv, *tensors_and_consts: _fresh(*tensors_and_consts[:9]))


def _update_read_norm_triton(*args):
    from deep_delta.ops.delta.triton_norm import read_triton_forward

    return read_triton_forward(*args)


def _update_read_norm(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor, norm_weight: Tensor,
                      gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float,
                      eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None,
                      rule: str = "delta", backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


update_read_norm_op = register_op(
    "update_read_norm", _update_read_norm, update_read_norm_forward_lean, _update_read_norm_triton,
    lambda x, k, v, beta, read, g, wg, bg, wv, bv, k_eps, eps, bmax, vs, c_dtype, *rest:
    _inputs_fake(x, g, wg, wv, c_dtype))


def _update_read_norm_backward_triton(*args):
    from deep_delta.ops.delta.triton_norm import read_triton_backward

    return read_triton_backward(*args)


def _update_read_norm_backward(g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor,
                               beta: Tensor, read: Tensor, norm_weight: Tensor, gate_weight: Tensor,
                               gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float,
                               beta_max: float, value_scale: float, rule: str = "delta", backend: str = "auto",
                               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                          Tensor]: ...


update_read_norm_backward_op = register_op(
    "update_read_norm_backward", _update_read_norm_backward, update_read_norm_backward_lean,
    _update_read_norm_backward_triton, lambda g, gc, gb, gv, *tensors_and_consts: _fresh(*tensors_and_consts[:10]))


def _save_update_norm_inputs(ctx, inputs, output) -> None:
    *tensors, k_eps, eps, beta_max, value_scale, _, rule, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.consts = (k_eps, eps, beta_max, value_scale, rule, backend)


def _update_norm_grad(ctx, g, gc, gbeta2, gv2):
    saved = ctx.saved_tensors
    ups = missing_update_grads(g, gc, gbeta2, gv2, saved[0], saved[4], saved[7], saved[5].shape[0])
    return (*update_norm_backward_op(*ups, *saved, *ctx.consts), None, None, None, None, None, None, None)


def _update_read_norm_grad(ctx, g, gc, gbeta2, gv2):
    saved = ctx.saved_tensors
    ups = missing_update_grads(g, gc, gbeta2, gv2, saved[0], saved[5], saved[8], saved[6].shape[0])
    return (*update_read_norm_backward_op(*ups, *saved, *ctx.consts), None, None, None, None, None, None, None)


update_norm_op.register_autograd(_update_norm_grad, setup_context=_save_update_norm_inputs)
update_read_norm_op.register_autograd(_update_read_norm_grad, setup_context=_save_update_norm_inputs)

OPS = (delta_update_op, delta_update_read_op, delta_update_backward_op, delta_update_read_backward_op,
       update_norm_op, update_norm_backward_op, update_read_norm_op, update_read_norm_backward_op)


def update_norm_with_op(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor | None, norm_weight: Tensor,
                        gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, *,
                        k_eps: float, eps: float, beta_max: float, value_scale: float,
                        c_dtype: torch.dtype | None = None, backend: str = "auto",
                        rule: str = "delta") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``deep_delta::update_norm`` (``read`` None: x (N, d), v (N, 1)) or ``deep_delta::update_read_norm``
    (x (N, d, d_v), v (N, d_v), read (d, d_v)) on flattened contiguous tensors (k (N, d), beta (N, 1), or (N, 2) for
    the untied ``rule``) -> (x', c (N, d), beta' (N, G'), v' (N, d_v'))."""
    if backend == "triton":
        check_device("update_and_norm", x)
    weights = (norm_weight.contiguous(), gate_weight.contiguous(), gate_bias.contiguous(), value_weight.contiguous(),
               value_bias.contiguous())
    consts = (float(k_eps), float(eps), float(beta_max), float(value_scale), c_dtype, rule, backend)
    if read is None:
        return update_norm_op(x, k, v, beta, *weights, *consts)
    return update_read_norm_op(x, k, v, beta, read.contiguous(), *weights, *consts)
