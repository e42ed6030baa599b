"""Backend names and their resolution, shared by the dispatchers of every op (delta, compress, hyper).

``"torch"`` is the lean PyTorch path, ``"triton"`` forces the Triton kernels, ``"auto"`` picks the kernels
for CUDA tensors when Triton imports and the lean path otherwise (the delta update's ``"auto"`` calls its
``torch.library`` custom op, :mod:`deep_delta.ops.delta.library`, which makes the same choice, except in eager on
the Triton path: :func:`through_registered_op`).
"""

from __future__ import annotations

import torch

BACKENDS = ("auto", "torch", "triton")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - depends on the install
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``auto`` to a concrete backend for tensors on ``device``; validate the name."""
    if backend not in BACKENDS:
        raise ValueError(f"delta_update: `backend` must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and _triton_available() else "torch"
    return backend


def through_registered_op(backend: str, impl: str, dtype: torch.dtype) -> bool:
    """Whether ``backend="auto"`` (resolved to ``impl``) goes through the op's ``torch.library`` custom op: while
    ``torch.compile`` traces (one opaque node, fullgraph), off the Triton path (the delta op's CPU kernel is the
    lean math) and for fp64 (the ops keep fp64 on the lean math; the kernels compute in fp32). Eager on the
    Triton path calls the kernels' autograd Function directly: the same kernels without the custom op's Python
    dispatch, 156-180 us of host time per forward + backward of each op on the 2-core CPU VM
    (benchmarks/op_dispatch.py), two ops per DDL sublayer; eager steps of small batches are host-bound."""
    return backend == "auto" and (impl != "triton" or dtype == torch.float64 or torch.compiler.is_compiling())


__all__ = ["BACKENDS", "resolve_backend", "through_registered_op"]
