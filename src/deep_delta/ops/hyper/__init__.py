"""Hyper-Connections (HC) and manifold-constrained HC (mHC): the stream read and write and the coefficients.

Three implementations of the state ops, as for the DDL ops (docs/kernels.md):

- :mod:`.naive`: the plain references (the definition; the coefficients of HC and mHC live only here);
- :mod:`.lean` (``backend="torch"``): custom autograd Functions with the references' forward values that
  keep less for backward: the write and read save their inputs in their own dtypes and form no state-sized
  temporary in backward; Sinkhorn-Knopp saves only its logits (the reference's autograd keeps an (n, n)
  matrix and an n-vector per half-step, 40 of each per token at 20 rounds) and recomputes its rounds in
  backward;
- :mod:`.triton` (``backend="triton"``): fused kernels, forward and backward, one pass over the state each
  (the write ``h R + f b^T``, the read ``h a``), and Sinkhorn-Knopp in registers (backward recomputed in
  registers from the logits).

``backend`` follows :func:`deep_delta.ops.backend.resolve_backend`: "auto" is the kernels on CUDA when Triton
imports, the lean path otherwise. :class:`deep_delta.layers.HyperResidual` passes its ``backend`` (the
model's ``delta_backend``) to these functions.
"""

from __future__ import annotations

import torch

from deep_delta.ops.backend import dispatch, lazy, register
from deep_delta.ops.hyper.lean import sinkhorn_knopp_lean, stream_read_lean, stream_write_lean
from deep_delta.ops.hyper.naive import (
    hc_coefficients_reference,
    mhc_coefficients_reference,
    sinkhorn_knopp_reference,
    stream_read_reference,
    stream_write_reference,
)

__all__ = [
    "hc_coefficients_reference",
    "mhc_coefficients_reference",
    "sinkhorn_knopp",
    "sinkhorn_knopp_reference",
    "stream_read",
    "stream_read_reference",
    "stream_write",
    "stream_write_reference",
]


def _kernels():
    from deep_delta.ops.hyper import triton

    return triton


register("stream_read", torch=stream_read_lean, triton=lazy(_kernels, "stream_read_triton"))
register("stream_write", torch=stream_write_lean, triton=lazy(_kernels, "stream_write_triton"))
register("sinkhorn_knopp", torch=sinkhorn_knopp_lean, triton=lazy(_kernels, "sinkhorn_knopp_triton"))


def _check_coef(op: str, name: str, c: torch.Tensor, lead: tuple[int, ...], tail: tuple[int, ...]) -> None:
    """``c`` is (*tail) (static) or broadcasts to (*lead, *tail)."""
    ok = c.dim() >= len(tail) and tuple(c.shape[c.dim() - len(tail):]) == tail
    if ok and c.dim() > len(tail):
        try:
            ok = torch.broadcast_shapes(tuple(c.shape[: -len(tail)]), lead) == torch.Size(lead)
        except RuntimeError:
            ok = False
    if not ok:
        raise ValueError(
            f"{op}: `{name}` must have shape {tail} or broadcast to {lead + tail}, got {tuple(c.shape)}"
        )


def _check_state(op: str, h: torch.Tensor) -> tuple[tuple[int, ...], int, int]:
    if h.dim() < 2:
        raise ValueError(f"{op}: `h` must have shape (..., d, n), got {tuple(h.shape)}")
    *lead, d, n = h.shape
    return tuple(lead), d, n


def stream_read(h: torch.Tensor, a: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """``h_in = h a``: h (..., d, n), a (n,) or (..., n) -> (..., d) in h's dtype (fp32 math)."""
    lead, _, n = _check_state("stream_read", h)
    _check_coef("stream_read", "a", a, lead, (n,))
    return dispatch("stream_read", backend, h)(h, a)


def stream_write(
    h: torch.Tensor, r: torch.Tensor, b: torch.Tensor, f: torch.Tensor, *, backend: str = "auto"
) -> torch.Tensor:
    """``h' = h R + f b^T``: h (..., d, n), r (n, n) or (..., n, n), b (n,) or (..., n), f (..., d)
    -> (..., d, n) in h's dtype (fp32 math)."""
    lead, d, n = _check_state("stream_write", h)
    _check_coef("stream_write", "r", r, lead, (n, n))
    _check_coef("stream_write", "b", b, lead, (n,))
    if tuple(f.shape) != lead + (d,):
        raise ValueError(f"stream_write: `f` must have shape {lead + (d,)}, got {tuple(f.shape)}")
    return dispatch("stream_write", backend, h)(h, r, b, f)


def sinkhorn_knopp(logits: torch.Tensor, iters: int = 20, eps: float = 1e-6, *, backend: str = "auto") -> torch.Tensor:
    """Sinkhorn-Knopp of (..., n, n) logits (:func:`.naive.sinkhorn_knopp_reference`), fp32 (fp64 stays)."""
    if logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"sinkhorn_knopp: `logits` must have shape (..., n, n), got {tuple(logits.shape)}")
    return dispatch("sinkhorn_knopp", backend, logits)(logits, iters, eps)
