"""Backend names and their resolution, shared by the dispatchers of every op (delta, compress, hyper).

``"torch"`` is the lean PyTorch path, ``"triton"`` forces the Triton kernels, ``"auto"`` picks the kernels
for CUDA tensors when Triton imports and the lean path otherwise (the delta update's ``"auto"`` calls its
``torch.library`` custom op, :mod:`deep_delta.ops.delta.library`, which makes the same choice).
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


__all__ = ["BACKENDS", "resolve_backend"]
