"""Backend names and their resolution, shared by the dispatchers of every op (delta, compress, hyper, norm).

``"torch"`` is the lean PyTorch path, ``"triton"`` forces the Triton kernels, ``"auto"`` picks the kernels
for CUDA tensors when Triton imports and the lean path otherwise. The ops with a ``torch.library`` custom op
(the delta update, :mod:`deep_delta.ops.delta.library`; the norm, gate and value,
:mod:`deep_delta.ops.norm.library`) go through it where :func:`through_registered_op` says so: always while
``torch.compile`` traces, ``"auto"`` or ``"triton"``, which the op is told so that its kernel makes the same
choice.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

import torch

BACKENDS = ("auto", "torch", "triton")


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype every op does its math in: fp32 for fp32/bf16/fp16 inputs, fp64 when any input is fp64
    (gradcheck)."""
    out = torch.float32
    for t in tensors:
        out = torch.promote_types(out, t.dtype)
    return out


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


def pick(backend: str, device: torch.device, lean: Callable, load_triton: Callable[[], Callable]) -> Callable:
    """The implementation an op dispatches to for ``backend`` on ``device``: ``load_triton()`` (which imports the
    kernels' module, so a machine without Triton never does) when it resolves to Triton, else ``lean``."""
    return load_triton() if resolve_backend(backend, device) == "triton" else lean


__all__ = ["BACKENDS", "pick", "resolve_backend", "through_registered_op"]


def _use_triton_for(t: torch.Tensor) -> bool:
    """``backend="auto"``'s choice for a custom op's kernel on t's device: Triton, except for fp64 (a precision
    check, not a speed run: the kernels compute in fp32)."""
    return resolve_backend("auto", t.device) == "triton" and t.dtype != torch.float64


def register_op(name: str, prototype: Callable, lean: Callable, triton: Callable, fake: Callable):
    """The custom op ``deep_delta::<name>`` (``torch.library.custom_op``, no mutated arguments) with the signature of
    ``prototype`` (annotated, its last parameter ``backend: str = "auto"``; its body unused). Its kernels call
    ``lean`` or ``triton`` with every argument but ``backend``: on CUDA ``triton`` when ``backend == "triton"`` or
    "auto" resolves to Triton for the first argument (not fp64), else ``lean``; on every other device ``lean``
    unless ``backend == "triton"`` (the kernels under the interpreter). ``fake`` (the same arguments as the
    prototype) gives the outputs' shapes, dtypes and strides under ``torch.compile``. The one registration of the
    library's fused ops (:mod:`deep_delta.ops.delta.library`, :mod:`deep_delta.ops.norm.library`)."""
    hints = typing.get_type_hints(prototype)  # the annotations resolved in the prototype's module
    sig = inspect.signature(prototype)
    sig = sig.replace(parameters=[p.replace(annotation=hints[p.name]) for p in sig.parameters.values()],
                      return_annotation=hints["return"])
    if list(sig.parameters)[-1] != "backend":
        raise ValueError(f"register_op({name!r}): the prototype's last parameter must be `backend`")

    def arguments(args: tuple, kwargs: dict) -> tuple[tuple, str]:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        backend = values.pop("backend")
        return tuple(values.values()), backend

    def anywhere(*args, **kwargs):
        values, backend = arguments(args, kwargs)
        return (triton if backend == "triton" else lean)(*values)

    def cuda(*args, **kwargs):
        values, backend = arguments(args, kwargs)
        return (triton if backend == "triton" or _use_triton_for(values[0]) else lean)(*values)

    for fn in (anywhere, cuda):
        fn.__signature__, fn.__annotations__ = sig, hints
        fn.__module__, fn.__qualname__ = prototype.__module__, prototype.__qualname__
    op = torch.library.custom_op(f"deep_delta::{name}", anywhere, mutates_args=())
    op.register_kernel("cuda")(cuda)
    op.register_fake(fake)
    return op
