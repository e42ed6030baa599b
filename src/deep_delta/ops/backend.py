"""Backend names and their resolution, shared by the dispatchers of every op (delta, compress, hyper, norm).

``"torch"`` is the lean PyTorch path, ``"triton"`` forces the Triton kernels, ``"auto"`` picks the kernels
for CUDA tensors when Triton imports and the lean path otherwise. The ops with a ``torch.library`` custom op
(the delta update, :mod:`deep_delta.ops.delta.library`; the norm, gate and value,
:mod:`deep_delta.ops.norm.library`) go through it where :func:`through_registered_op` says so: always while
``torch.compile`` traces, ``"auto"`` or ``"triton"``, which the op is told so that its kernel makes the same
choice.
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
    """Whether an op with a ``torch.library`` custom op goes through it for ``backend`` (resolved to ``impl``).

    While ``torch.compile`` traces, ``"auto"`` and ``"triton"`` do (one opaque node, fullgraph; the op's kernel
    runs the Triton path for ``"triton"`` on any device, CPU tensors under the interpreter included). In eager
    ``"auto"`` does off the Triton path (the op's kernel off CUDA is the lean math) and for fp64 (the ops keep
    fp64 on the lean math; the kernels compute in fp32). Eager on the Triton path, ``"auto"`` on CUDA or
    ``"triton"``, calls the kernels' autograd Function directly: the same kernels without the custom op's Python
    dispatch, 156-180 us of host time per forward + backward of each op on the 2-core CPU VM
    (benchmarks/tools/op_dispatch.py), two ops per DDL sublayer; eager steps of small batches are host-bound.
    ``"torch"`` never does (the lean autograd Functions)."""
    if backend == "torch":
        return False
    if torch.compiler.is_compiling():
        return True
    return backend == "auto" and (impl != "triton" or dtype == torch.float64)


__all__ = ["BACKENDS", "resolve_backend", "through_registered_op"]
