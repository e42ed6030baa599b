"""Backend names, their resolution and the one dispatch of every op (delta, compress, hyper, depth, norm).

``"torch"`` is the lean PyTorch path, ``"triton"`` forces the Triton kernels, ``"auto"`` picks the kernels for CUDA
tensors when Triton imports and the lean path otherwise (:func:`resolve_backend`).

Every public op reaches its implementation the same way: it checks its inputs, then :func:`dispatch` resolves the
backend once, picks the op's route (:func:`route`) and looks the implementation up in one table, by (op, route),
which each op package fills with :func:`register`:

- ``"torch"``: the lean PyTorch path (an autograd Function, or autograd's own);
- ``"triton"``: the kernels' autograd Function (its module imported only when taken: :func:`lazy`);
- ``"library"``: the op's ``torch.library`` custom op (:mod:`deep_delta.ops.delta.library`,
  :mod:`deep_delta.ops.norm.library`), told the caller's backend so that its kernel makes the same choice: always
  while ``torch.compile`` traces, ``"auto"`` with fp64 (:func:`through_registered_op`), and for ``"auto"`` off the
  Triton path where the caller asks (its kernel off CUDA is the lean math: one node under ``torch.compile``);
- ``"unfused"``: an op fused from others with no lean path of its own (the update and the next sublayer's read or
  input stage) runs them one after the other, each dispatched with the caller's backend.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from types import ModuleType

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


ROUTES = ("torch", "triton", "library", "unfused")
_TOLD_BACKEND = ("library", "unfused")  # the routes whose implementation takes the caller's ``backend``
IMPLEMENTATIONS: dict[str, dict[str, Callable]] = {}  # op -> route -> implementation, filled by register()


def register(op: str, **implementations: Callable) -> None:
    """The implementations of ``op`` by route (:data:`ROUTES`), each called with the op's checked arguments (and
    ``backend=`` on the ``"library"`` and ``"unfused"`` routes): a lean path, ``torch``, or ``unfused``, exactly one;
    ``triton`` and ``library`` where the op has them. The one table :func:`dispatch` looks up."""
    unknown = sorted(set(implementations) - set(ROUTES))
    if unknown:
        raise ValueError(f"register({op!r}): unknown route {unknown[0]!r}; allowed: {', '.join(ROUTES)}")
    if ("torch" in implementations) == ("unfused" in implementations):
        raise ValueError(f"register({op!r}): give exactly one of `torch` (a lean path) and `unfused`")
    IMPLEMENTATIONS[op] = dict(implementations)


def lazy(load: Callable[[], ModuleType], name: str) -> Callable:
    """The function ``name`` of the module that ``load()`` imports (a function-local import statement), looked up
    at every call: a kernels' module is imported only when its route is taken (a machine without Triton never
    imports it), and ``torch.compile`` traces the import."""

    def call(*args, **kwargs):
        return getattr(load(), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def route(op: str, backend: str, like: torch.Tensor, *, kernels: bool = True, auto_library: bool = False) -> str:
    """The route of ``op`` for ``backend`` on ``like``'s device and dtype, among the routes it has:

    - where the backend resolves to Triton and ``kernels`` (False: an update rule behind its switch), the custom op
      where :func:`through_registered_op` says so and the op has one, else the kernels;
    - elsewhere, the custom op for ``"auto"`` where ``auto_library`` (its kernel off CUDA the lean math), else the
      op's lean path (``"torch"``) or its parts (``"unfused"``)."""
    routes = IMPLEMENTATIONS[op]
    impl = resolve_backend(backend, like.device)
    through = "library" in routes and through_registered_op(backend, impl, like.dtype)
    if impl == "triton" and kernels and "triton" in routes:
        return "library" if through else "triton"
    if auto_library and through:
        return "library"
    return "torch" if "torch" in routes else "unfused"


def dispatch(op: str, backend: str, like: torch.Tensor, *, kernels: bool = True,
             auto_library: bool = False) -> Callable:
    """The implementation of ``op`` to call for ``backend`` on tensors like ``like`` (:func:`route`, one lookup in
    the table :func:`register` fills), with the caller's ``backend`` bound where its route takes it."""
    taken = route(op, backend, like, kernels=kernels, auto_library=auto_library)
    implementation = IMPLEMENTATIONS[op][taken]
    return functools.partial(implementation, backend=backend) if taken in _TOLD_BACKEND else implementation


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


__all__ = ["BACKENDS", "IMPLEMENTATIONS", "ROUTES", "compute_dtype", "dispatch", "lazy", "register", "register_op",
           "resolve_backend", "route", "through_registered_op"]
