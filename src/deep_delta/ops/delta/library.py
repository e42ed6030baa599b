"""The delta update and the fused update + CC read as ``torch.library`` custom ops (namespace ``deep_delta``).

A custom op is one node to ``torch.compile`` (Dynamo and AOTAutograd see its fake implementation, never its
kernels), so the whole model compiles with ``fullgraph=True`` and the same kernels run compiled and eager:

| op | CUDA kernel | every other device (CPU) |
| --- | --- | --- |
| ``deep_delta::delta_update(x, k, v, beta, k_eps, backend) -> x'`` | Triton (:mod:`.triton`) | lean math (:mod:`.lean`) |
| ``deep_delta::delta_update_read(x, k, v, beta, c, k_eps, backend) -> (x', x_in)`` | Triton, fused | lean update, then the CC read |
| ``deep_delta::delta_update_backward(g, x, k, v, beta, k_eps, backend)`` | Triton | lean math |
| ``deep_delta::delta_update_read_backward(g, g_in, x, x', k, v, beta, c, k_eps, backend)`` | Triton, fused | lean math |

``backend`` is the name the caller was given, ``"auto"`` (the table; fp64 keeps the lean math on CUDA too) or
``"triton"``: the Triton kernels on every device (CPU tensors under the Triton interpreter), so that
``backend="triton"`` runs the same kernels compiled as in eager. The two backward ops are what
``register_autograd`` calls, with the forward's ``backend`` (they have no autograd of their own: no double
backward). Shapes are the flattened ones: x (N, d, d_v), k (N, d), v (N, d_v), beta (N, 1), c (d, d_v), all
contiguous; :func:`deep_delta.ops.delta.delta_update` and :func:`deep_delta.ops.delta.update_and_channel_read`
reshape to them (``backend="auto"``). The plain reference stays :mod:`.naive`; tests/ops/test_custom_ops.py
runs ``torch.library.opcheck`` on every op here and compares values and gradients with the reference.

The state rebuild (:class:`.recompute.StateTape`) works in eager: the kernels record the update on the active
tape as the autograd Functions do. Under ``torch.compile`` the kernels are not run while tracing, so there is
nothing to record; the model refuses ``recompute_states`` there (``DDLModel._use_tape``).
"""

from __future__ import annotations

import math

import torch

from deep_delta.ops.delta.lean import lean_backward, lean_forward
from deep_delta.ops.delta.naive import compute_dtype
from deep_delta.ops.delta.recompute import active_tape, delta_rebuild

Tensor = torch.Tensor


def _use_triton(x: Tensor) -> bool:
    """``backend="auto"``'s choice on x's device."""
    from deep_delta.ops.backend import resolve_backend

    # The kernels do their math in fp32: fp64 (a precision check, not a speed run) keeps the lean fp64 math.
    return resolve_backend("auto", x.device) == "triton" and x.dtype != torch.float64


def _record(x: Tensor, out: Tensor, k: Tensor, delta: Tensor | None, k_eps: float) -> None:
    """Tell the active :class:`StateTape` (eager only) how to rebuild x from out."""
    tape = active_tape()
    if tape is not None and delta is not None:
        tape.record(x, out, delta_rebuild(k, delta, k_eps))


# ----------------------------------------------------------------------------- forward ops


def _update_lean(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float) -> Tensor:
    """``x + beta u (v^T - u^T x)``, u = k normalised; flattened shapes (module docstring). Lean math."""
    out, delta = lean_forward(x, k, v, beta, k_eps)
    _record(x, out, k, delta, k_eps)
    return out


def _update_triton(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float) -> Tensor:
    from deep_delta.ops.delta.triton import triton_forward

    out, _, delta = triton_forward(x, k, v, beta, None, k_eps, want_delta=active_tape() is not None)
    _record(x, out, k, delta, k_eps)
    return out


def _update(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, backend: str = "auto") -> Tensor:
    """Every device but CUDA: the lean math, or the kernels when asked for by name."""
    return (_update_triton if backend == "triton" else _update_lean)(x, k, v, beta, k_eps)


delta_update_op = torch.library.custom_op("deep_delta::delta_update", _update, mutates_args=())

@delta_update_op.register_kernel("cuda")
def _delta_update_cuda(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, backend: str = "auto") -> Tensor:
    return (_update_triton if backend == "triton" or _use_triton(x) else _update_lean)(x, k, v, beta, k_eps)


@delta_update_op.register_fake
def _(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, backend: str = "auto") -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _update_read_lean(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float
) -> tuple[Tensor, Tensor]:
    """(x', x_in): the update and the CC read ``x_in_i = sum_j c_ij x'_ij`` of the new state. Lean math."""
    from deep_delta.ops.compress.lean import channel_read

    out, delta = lean_forward(x, k, v, beta, k_eps)
    _record(x, out, k, delta, k_eps)
    return out, channel_read(out, c)


def _update_read_triton(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float
) -> tuple[Tensor, Tensor]:
    from deep_delta.ops.delta.triton import triton_forward

    out, xin, delta = triton_forward(x, k, v, beta, c, k_eps, want_delta=active_tape() is not None)
    _record(x, out, k, delta, k_eps)
    return out, xin


def _update_read(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    return (_update_read_triton if backend == "triton" else _update_read_lean)(x, k, v, beta, c, k_eps)


delta_update_read_op = torch.library.custom_op("deep_delta::delta_update_read", _update_read, mutates_args=())

@delta_update_read_op.register_kernel("cuda")
def _delta_update_read_cuda(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    kernel = _update_read_triton if backend == "triton" or _use_triton(x) else _update_read_lean
    return kernel(x, k, v, beta, c, k_eps)


@delta_update_read_op.register_fake
def _(x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float,
      backend: str = "auto") -> tuple[Tensor, Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[:-1])


# ----------------------------------------------------------------------------- backward ops


def _update_backward_lean(
    g: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(grad_x, grad_k, grad_v, grad_beta) for the upstream gradient g (N, d, d_v). Lean math."""
    return lean_backward(g, x, k, v, beta, k_eps)


def _update_backward_triton(
    g: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from deep_delta.ops.delta.triton import triton_backward

    return triton_backward(g, None, x, k, v, beta, None, k_eps)[:4]


def _update_backward(
    g: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, k_eps: float, backend: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (_update_backward_triton if backend == "triton" else _update_backward_lean)(g, x, k, v, beta, k_eps)


delta_update_backward_op = torch.library.custom_op(
    "deep_delta::delta_update_backward", _update_backward, mutates_args=()
)

@delta_update_backward_op.register_kernel("cuda")
def _delta_update_backward_cuda(g, x, k, v, beta, k_eps, backend="auto"):
    kernel = _update_backward_triton if backend == "triton" or _use_triton(x) else _update_backward_lean
    return kernel(g, x, k, v, beta, k_eps)


@delta_update_backward_op.register_fake
def _(g, x, k, v, beta, k_eps, backend="auto"):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, k, v, beta))


def update_read_backward_lean(
    g: Tensor, gin: Tensor, x: Tensor, out: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(grad_x, grad_k, grad_v, grad_beta, grad_c) of the fused op; g (N, d, d_v), gin (N, d), out = x' the
    forward's new state (saved: the next update's input, kept anyway, except after a model's last update:
    one state per model, ``benchmarks/tools/saved_by_source.py``). Lean math: the read's gradient
    ``g_in c^T`` joins g before the update's backward (in the compute dtype, as the Triton kernel does in
    registers: a bf16 state goes through a transient fp32 copy, rounded once at the end), and
    ``grad_c = sum_n g_in x'^T``."""
    from deep_delta.ops.compress.lean import channel_read_weight_grad, read_gradient_rows

    ct = compute_dtype(x, k, v, beta)
    ge = read_gradient_rows(gin, x.shape[-1], ct)
    grad_c = channel_read_weight_grad(ge, out).to(c.dtype)
    total = torch.addcmul(g.to(ct), ge, c.to(ct))
    grad_x, grad_k, grad_v, grad_beta = lean_backward(total, x.to(ct), k, v, beta, k_eps)
    return grad_x.to(x.dtype), grad_k, grad_v, grad_beta, grad_c


def _update_read_backward_triton(
    g: Tensor, gin: Tensor, x: Tensor, out: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The kernel recomputes x' in registers: ``out`` is the lean path's."""
    from deep_delta.ops.delta.triton import triton_backward

    return triton_backward(g, gin, x, k, v, beta, c, k_eps)


def _update_read_backward(
    g: Tensor, gin: Tensor, x: Tensor, out: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor, k_eps: float,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    kernel = _update_read_backward_triton if backend == "triton" else update_read_backward_lean
    return kernel(g, gin, x, out, k, v, beta, c, k_eps)


delta_update_read_backward_op = torch.library.custom_op(
    "deep_delta::delta_update_read_backward", _update_read_backward, mutates_args=()
)

@delta_update_read_backward_op.register_kernel("cuda")
def _delta_update_read_backward_cuda(g, gin, x, out, k, v, beta, c, k_eps, backend="auto"):
    kernel = _update_read_backward_triton if backend == "triton" or _use_triton(x) else update_read_backward_lean
    return kernel(g, gin, x, out, k, v, beta, c, k_eps)


@delta_update_read_backward_op.register_fake
def _(g, gin, x, out, k, v, beta, c, k_eps, backend="auto"):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, k, v, beta, c))


# ----------------------------------------------------------------------------- autograd


def _save_inputs(ctx, inputs, output) -> None:
    *tensors, k_eps, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.k_eps, ctx.backend = k_eps, backend


def _save_inputs_and_state(ctx, inputs, output) -> None:
    """The fused op also saves its new state x' for grad_c (the next update's input, kept anyway; the extra
    memory is the model's last state only)."""
    x, k, v, beta, c, k_eps, backend = inputs
    ctx.save_for_backward(x, output[0], k, v, beta, c)
    ctx.k_eps, ctx.backend = k_eps, backend


def _delta_update_grad(ctx, g):
    return (*delta_update_backward_op(g.contiguous(), *ctx.saved_tensors, ctx.k_eps, ctx.backend), None, None)


def _delta_update_read_grad(ctx, g, gin):
    x, out, k, v, beta, c = ctx.saved_tensors
    # an unused output's gradient may arrive as None
    g = torch.zeros_like(x) if g is None else g.contiguous()
    gin = x.new_zeros(x.shape[:-1]) if gin is None else gin.contiguous()
    return (*delta_update_read_backward_op(g, gin, x, out, k, v, beta, c, ctx.k_eps, ctx.backend), None, None)


delta_update_op.register_autograd(_delta_update_grad, setup_context=_save_inputs)
delta_update_read_op.register_autograd(_delta_update_read_grad, setup_context=_save_inputs_and_state)

OPS = (delta_update_op, delta_update_read_op, delta_update_backward_op, delta_update_read_backward_op)


def update_with_op(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, c: Tensor | None, k_eps: float, backend: str = "auto"
) -> Tensor | tuple[Tensor, Tensor]:
    """The update through the custom ops, at any leading shape: x (..., d, d_v), k (..., d), v (..., d_v),
    beta (..., 1); returns x' (..., d, d_v), or (x', x_in (..., d)) with c (d, d_v) the fused CC read.
    ``backend``: "auto" or "triton" (module docstring)."""
    if backend == "triton":
        from deep_delta.ops.delta.triton import check_device

        check_device("update_and_channel_read" if c is not None else "delta_update", x)
    *lead, d, dv = x.shape
    n = math.prod(lead)
    flat = (x.reshape(n, d, dv).contiguous(), k.reshape(n, d).contiguous(), v.reshape(n, dv).contiguous(),
            beta.reshape(n, 1).contiguous())
    if c is None:
        return delta_update_op(*flat, float(k_eps), backend).view(x.shape)
    out, xin = delta_update_read_op(*flat, c.contiguous(), float(k_eps), backend)
    return out.view(x.shape), xin.view(*x.shape[:-1])
