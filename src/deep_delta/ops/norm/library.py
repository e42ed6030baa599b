"""The sublayer's input stage (RMSNorm, linear gate, k-Map value) as ``torch.library`` custom ops (namespace
``deep_delta``), in the style of :mod:`deep_delta.ops.delta.library`:

| op | CUDA kernel | every other device |
| --- | --- | --- |
| ``deep_delta::norm_gate_value(src, g, w_g, b_g, W_v, b_v, eps, beta_max, value_scale, c_dtype, backend) -> (c, beta, v)`` | Triton (:mod:`.triton`) | lean math (:mod:`.lean`) |
| ``deep_delta::norm_gate_value_backward(gc, gbeta, gv, src, g, w_g, b_g, W_v, b_v, eps, beta_max, value_scale, backend)`` | Triton | the closed-form lean backward |
| ``deep_delta::update_norm(x, k, v, beta, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, c_dtype, backend) -> (x', c, beta', v')`` | Triton (:mod:`.triton_update`) | the lean update, then the lean input stage |
| ``deep_delta::update_norm_backward(g, gc, gbeta', gv', x, k, v, beta, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, backend)`` | Triton | the lean backwards, one after the other |
| ``deep_delta::update_read_norm(x, k, v, beta, c_read, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, c_dtype, backend) -> (x', c, beta', v')`` | Triton (:mod:`.triton_update`) | the lean update, CC read and input stage |
| ``deep_delta::update_read_norm_backward(g, gc, gbeta', gv', x, k, v, beta, c_read, g, w_g, b_g, W_v, b_v, k_eps, eps, beta_max, value_scale, backend)`` | Triton | the lean backwards, one after the other |

``backend`` is the caller's, ``"auto"`` (the table) or ``"triton"``: the kernels on every device (CPU tensors
under the Triton interpreter), as in :mod:`deep_delta.ops.delta.library`. The backward op is what
``register_autograd`` calls, with the forward's ``backend`` (no double backward). Shapes are the flattened ones:
src (N, d), g (d,), w_g (1, d), b_g (1,), W_v (d_v, d), b_v (d_v,), all contiguous. One opaque node under
``torch.compile``, so a whole model compiles with ``fullgraph=True``. :func:`deep_delta.ops.norm.norm_gate_value`
calls it for ``backend="auto"`` on CUDA while compiling and for fp64, and for ``backend="triton"`` while
compiling; on other devices ``"auto"`` runs the lean ops directly (their autograd is bit for bit the module's
gradients, which the closed-form backward is not). tests/ops/test_custom_ops.py runs ``torch.library.opcheck`` on
both ops, with either backend.
"""

from __future__ import annotations

import torch

from deep_delta.ops.norm.lean import (
    missing_grads_as_zeros,
    missing_update_grads,
    norm_gate_value_backward_lean,
    norm_gate_value_lean,
    out_dtype,
    update_norm_backward_lean,
    update_norm_forward_lean,
    update_read_norm_backward_lean,
    update_read_norm_forward_lean,
)

Tensor = torch.Tensor


def _use_triton(src: Tensor) -> bool:
    """``backend="auto"``'s choice on src's device."""
    from deep_delta.ops.backend import resolve_backend

    # The kernels do their math in fp32: fp64 (a precision check, not a speed run) keeps the lean fp64 math.
    return resolve_backend("auto", src.device) == "triton" and src.dtype != torch.float64


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
             backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """Every device but CUDA: the lean math, or the kernels when asked for by name."""
    return (_forward_triton if backend == "triton" else _forward_lean)(
        src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype)


norm_gate_value_op = torch.library.custom_op("deep_delta::norm_gate_value", _forward, mutates_args=())


@norm_gate_value_op.register_kernel("cuda")
def _norm_gate_value_cuda(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max,
                          value_scale, c_dtype, backend="auto"):
    return (_forward_triton if backend == "triton" or _use_triton(src) else _forward_lean)(
        src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype)


@norm_gate_value_op.register_fake
def _(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype,
      backend="auto"):
    n, d = src.shape
    return (src.new_empty(n, d, dtype=c_dtype or norm_weight.dtype), src.new_empty(n, 1, dtype=out_dtype(norm_weight)),
            src.new_empty(n, value_weight.shape[0], dtype=out_dtype(norm_weight)))


def _backward_lean(gc: Tensor, gbeta: Tensor, gv: Tensor, src: Tensor, norm_weight: Tensor, gate_weight: Tensor,
                   gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, eps: float, beta_max: float,
                   value_scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias). Lean math."""
    return norm_gate_value_backward_lean(gc, gbeta, gv, src, norm_weight, gate_weight, gate_bias, value_weight,
                                         value_bias, eps, beta_max, value_scale)


def _backward_triton(*args) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from deep_delta.ops.norm.triton import triton_backward

    return triton_backward(*args)


def _backward(gc: Tensor, gbeta: Tensor, gv: Tensor, src: Tensor, norm_weight: Tensor, gate_weight: Tensor,
              gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, eps: float, beta_max: float,
              value_scale: float, backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every device but CUDA: the lean backward, or the kernels when asked for by name."""
    return (_backward_triton if backend == "triton" else _backward_lean)(
        gc, gbeta, gv, src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale)


norm_gate_value_backward_op = torch.library.custom_op(
    "deep_delta::norm_gate_value_backward", _backward, mutates_args=()
)


@norm_gate_value_backward_op.register_kernel("cuda")
def _norm_gate_value_backward_cuda(gc, gbeta, gv, src, norm_weight, gate_weight, gate_bias, value_weight,
                                   value_bias, eps, beta_max, value_scale, backend="auto"):
    return (_backward_triton if backend == "triton" or _use_triton(src) else _backward_lean)(
        gc, gbeta, gv, src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale)


@norm_gate_value_backward_op.register_fake
def _(gc, gbeta, gv, src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max,
      value_scale, backend="auto"):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias))


def _save_inputs(ctx, inputs, output) -> None:
    *tensors, eps, beta_max, value_scale, _, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.consts = (eps, beta_max, value_scale, backend)


def _norm_gate_value_grad(ctx, gc, gbeta, gv):
    src, norm_weight, gate_weight, gate_bias, value_weight, value_bias = ctx.saved_tensors
    gc, gbeta, gv = missing_grads_as_zeros(gc, gbeta, gv, src, norm_weight, value_weight)
    grads = norm_gate_value_backward_op(gc, gbeta, gv, *ctx.saved_tensors, *ctx.consts)
    return (*grads, None, None, None, None, None)


norm_gate_value_op.register_autograd(_norm_gate_value_grad, setup_context=_save_inputs)



# ----------------------------------------------------------------------------- the update fused with the input stage


def _update_norm_triton(*args):
    from deep_delta.ops.norm.triton_update import triton_forward

    return triton_forward(*args)


def _update_norm(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, norm_weight: Tensor, gate_weight: Tensor,
                 gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float,
                 beta_max: float, value_scale: float, c_dtype: torch.dtype | None,
                 backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every device but CUDA: the lean math, or the kernels when asked for by name. Flattened shapes: x, k
    (N, d), v, beta (N, 1)."""
    return (_update_norm_triton if backend == "triton" else update_norm_forward_lean)(
        x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps, beta_max,
        value_scale, c_dtype)


update_norm_op = torch.library.custom_op("deep_delta::update_norm", _update_norm, mutates_args=())


@update_norm_op.register_kernel("cuda")
def _update_norm_cuda(x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps,
                      beta_max, value_scale, c_dtype, backend="auto"):
    return (_update_norm_triton if backend == "triton" or _use_triton(x) else update_norm_forward_lean)(
        x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps, beta_max,
        value_scale, c_dtype)


@update_norm_op.register_fake
def _(x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps, beta_max,
      value_scale, c_dtype, backend="auto"):
    n, d = x.shape
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(n, d, dtype=c_dtype or norm_weight.dtype), x.new_empty(n, 1, dtype=out_dtype(norm_weight)),
            x.new_empty(n, value_weight.shape[0], dtype=out_dtype(norm_weight)))


def _update_norm_backward_triton(*args):
    from deep_delta.ops.norm.triton_update import triton_backward

    return triton_backward(*args)


def _update_norm_backward(g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor,
                          beta: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
                          value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float, beta_max: float,
                          value_scale: float, backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every device but CUDA: the lean backward, or the kernels when asked for by name."""
    return (_update_norm_backward_triton if backend == "triton" else update_norm_backward_lean)(
        g, gc, gbeta2, gv2, x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps,
        eps, beta_max, value_scale)


update_norm_backward_op = torch.library.custom_op(
    "deep_delta::update_norm_backward", _update_norm_backward, mutates_args=()
)


@update_norm_backward_op.register_kernel("cuda")
def _update_norm_backward_cuda(g, gc, gbeta2, gv2, x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight,
                               value_bias, k_eps, eps, beta_max, value_scale, backend="auto"):
    kernel = _update_norm_backward_triton if backend == "triton" or _use_triton(x) else update_norm_backward_lean
    return kernel(g, gc, gbeta2, gv2, x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias,
                  k_eps, eps, beta_max, value_scale)


@update_norm_backward_op.register_fake
def _(g, gc, gbeta2, gv2, x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps,
      beta_max, value_scale, backend="auto"):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias))


def _save_update_norm_inputs(ctx, inputs, output) -> None:
    *tensors, k_eps, eps, beta_max, value_scale, _, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.consts = (k_eps, eps, beta_max, value_scale, backend)


def _update_norm_grad(ctx, g, gc, gbeta2, gv2):
    saved = ctx.saved_tensors
    ups = missing_update_grads(g, gc, gbeta2, gv2, saved[0], saved[4], saved[7])
    return (*update_norm_backward_op(*ups, *saved, *ctx.consts), None, None, None, None, None, None)


update_norm_op.register_autograd(_update_norm_grad, setup_context=_save_update_norm_inputs)



# ----------------------------------------------------------------------------- the update, the CC read and the input stage


def _update_read_norm_triton(*args):
    from deep_delta.ops.norm.triton_update import read_triton_forward

    return read_triton_forward(*args)


def _update_read_norm(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor, norm_weight: Tensor,
                      gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float,
                      eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None,
                      backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every device but CUDA: the lean math, or the kernels when asked for by name. Flattened shapes: x
    (N, d, d_v), k (N, d), v (N, d_v), beta (N, 1), read (d, d_v)."""
    return (_update_read_norm_triton if backend == "triton" else update_read_norm_forward_lean)(
        x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps, beta_max,
        value_scale, c_dtype)


update_read_norm_op = torch.library.custom_op("deep_delta::update_read_norm", _update_read_norm, mutates_args=())


@update_read_norm_op.register_kernel("cuda")
def _update_read_norm_cuda(x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps,
                           eps, beta_max, value_scale, c_dtype, backend="auto"):
    return (_update_read_norm_triton if backend == "triton" or _use_triton(x) else update_read_norm_forward_lean)(
        x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps, beta_max,
        value_scale, c_dtype)


@update_read_norm_op.register_fake
def _(x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps, beta_max,
      value_scale, c_dtype, backend="auto"):
    n, d, dv = x.shape
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(n, d, dtype=c_dtype or norm_weight.dtype), x.new_empty(n, 1, dtype=out_dtype(norm_weight)),
            x.new_empty(n, value_weight.shape[0], dtype=out_dtype(norm_weight)))


def _update_read_norm_backward_triton(*args):
    from deep_delta.ops.norm.triton_update import read_triton_backward

    return read_triton_backward(*args)


def _update_read_norm_backward(g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor,
                               beta: Tensor, read: Tensor, norm_weight: Tensor, gate_weight: Tensor,
                               gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float,
                               beta_max: float, value_scale: float, backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every device but CUDA: the lean backward, or the kernels when asked for by name."""
    return (_update_read_norm_backward_triton if backend == "triton" else update_read_norm_backward_lean)(
        g, gc, gbeta2, gv2, x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias,
        k_eps, eps, beta_max, value_scale)


update_read_norm_backward_op = torch.library.custom_op(
    "deep_delta::update_read_norm_backward", _update_read_norm_backward, mutates_args=()
)


@update_read_norm_backward_op.register_kernel("cuda")
def _update_read_norm_backward_cuda(g, gc, gbeta2, gv2, x, k, v, beta, read, norm_weight, gate_weight, gate_bias,
                                    value_weight, value_bias, k_eps, eps, beta_max, value_scale, backend="auto"):
    kernel = (_update_read_norm_backward_triton if backend == "triton" or _use_triton(x)
              else update_read_norm_backward_lean)
    return kernel(g, gc, gbeta2, gv2, x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight,
                  value_bias, k_eps, eps, beta_max, value_scale)


@update_read_norm_backward_op.register_fake
def _(g, gc, gbeta2, gv2, x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps,
      eps, beta_max, value_scale, backend="auto"):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias))


def _update_read_norm_grad(ctx, g, gc, gbeta2, gv2):
    saved = ctx.saved_tensors
    ups = missing_update_grads(g, gc, gbeta2, gv2, saved[0], saved[5], saved[8])
    return (*update_read_norm_backward_op(*ups, *saved, *ctx.consts), None, None, None, None, None, None)


update_read_norm_op.register_autograd(_update_read_norm_grad, setup_context=_save_update_norm_inputs)

OPS = (norm_gate_value_op, norm_gate_value_backward_op, update_norm_op, update_norm_backward_op, update_read_norm_op,
       update_read_norm_backward_op)


def norm_gate_value_with_op(src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
                            value_weight: Tensor, value_bias: Tensor, eps: float, beta_max: float,
                            value_scale: float, c_dtype: torch.dtype | None = None,
                            backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """The custom op at any leading shape: src (..., d) -> c (..., d), beta (..., 1), v (..., d_v); ``backend``:
    "auto" or "triton" (module docstring)."""
    if backend == "triton":
        from deep_delta.ops.delta.triton import check_device

        check_device("norm_gate_value", src)
    lead, d = src.shape[:-1], src.shape[-1]
    c, beta, v = norm_gate_value_op(
        src.reshape(-1, d).contiguous(), norm_weight.contiguous(), gate_weight.contiguous(), gate_bias.contiguous(),
        value_weight.contiguous(), value_bias.contiguous(), float(eps), float(beta_max), float(value_scale), c_dtype,
        backend)
    return c.view(*lead, d), beta.view(*lead, 1), v.view(*lead, value_weight.shape[0])


def update_norm_with_op(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor | None, norm_weight: Tensor,
                        gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, *,
                        k_eps: float, eps: float, beta_max: float, value_scale: float,
                        c_dtype: torch.dtype | None = None,
                        backend: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``deep_delta::update_norm`` (``read`` None: x (N, d), v (N, 1)) or ``deep_delta::update_read_norm``
    (x (N, d, d_v), v (N, d_v), read (d, d_v)) on flattened contiguous tensors (k (N, d), beta (N, 1)) ->
    (x', c (N, d), beta' (N, 1), v' (N, d_v'))."""
    if backend == "triton":
        from deep_delta.ops.delta.triton import check_device

        check_device("update_and_norm", x)
    weights = (norm_weight.contiguous(), gate_weight.contiguous(), gate_bias.contiguous(), value_weight.contiguous(),
               value_bias.contiguous())
    consts = (float(k_eps), float(eps), float(beta_max), float(value_scale), c_dtype, backend)
    if read is None:
        return update_norm_op(x, k, v, beta, *weights, *consts)
    return update_read_norm_op(x, k, v, beta, read.contiguous(), *weights, *consts)
