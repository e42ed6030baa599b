"""Where ``backend="auto"`` and ``"triton"`` go (:func:`deep_delta.ops.backend.through_registered_op`): the custom
ops while ``torch.compile`` traces, both of them (``"triton"`` tells the op to run the kernels, on CPU tensors under
the Triton interpreter too); ``"auto"`` also off the Triton path and for fp64; the kernels' autograd Functions in
eager on the Triton path (the same kernels without the custom op's Python dispatch). ``"auto"``'s Triton path is
forced on CPU tensors here (``resolve_backend`` patched; the kernels run under ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import inspect
import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import deep_delta.ops.delta as delta_ops  # noqa: E402
import deep_delta.ops.norm as norm_ops  # noqa: E402
from deep_delta.ops.backend import through_registered_op  # noqa: E402
from deep_delta.ops.delta import library as delta_library  # noqa: E402
from deep_delta.ops.delta import triton as delta_triton  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from deep_delta.ops.norm import library as norm_library  # noqa: E402
from deep_delta.ops.norm import triton as norm_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("compiling", [False, True], ids=["eager", "compiling"])
def test_through_registered_op(monkeypatch, compiling):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    f32, f64 = torch.float32, torch.float64
    for dtype in (f32, f64):
        assert through_registered_op("triton", "triton", dtype) is compiling
    assert through_registered_op("auto", "triton", f32) is compiling
    assert through_registered_op("auto", "triton", f64) and through_registered_op("auto", "torch", f32)
    assert not through_registered_op("torch", "torch", f32)


def spy(monkeypatch, module, name, calls):
    """Record each call of ``module.name`` as (name, its ``backend`` argument: the custom ops' entry points take
    one, the Functions' wrappers none)."""
    real = getattr(module, name)
    signature = inspect.signature(real)

    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append((name, bound.arguments.get("backend")))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


@pytest.mark.parametrize("compiling", [False, True], ids=["eager", "compiling"])
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_the_triton_path_calls_the_function_in_eager_and_the_op_when_compiling(monkeypatch, backend, compiling):
    """``"auto"`` resolved to Triton and ``"triton"`` take the same route. The op is told the backend: with
    ``"triton"`` its kernel launches the Triton kernels (on CPU tensors too); with ``"auto"`` its CPU kernel is the
    lean math (its CUDA kernel the Triton one)."""
    if backend == "auto":
        for module in (delta_ops, norm_ops):
            monkeypatch.setattr(module, "resolve_backend", lambda backend, device: "triton" if backend != "torch"
                                else "torch")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    calls = []
    for module, name in ((delta_library, "update_with_op"), (delta_triton, "delta_update_triton"),
                         (delta_triton, "delta_update_read_triton"), (norm_library, "norm_gate_value_with_op"),
                         (norm_triton, "norm_gate_value_triton")):
        spy(monkeypatch, module, name, calls)
    gen = torch.Generator().manual_seed(0)
    x, k, v, beta, c = (torch.randn(*s, generator=gen).to(DEVICE) for s in ((3, 8, 2), (3, 8), (3, 2), (3, 1), (8, 2)))
    src = torch.randn(3, 8, generator=gen).to(DEVICE)
    weights = tuple(f(*s, device=DEVICE) for f, s in ((torch.ones, (8,)), (torch.zeros, (1, 8)), (torch.zeros, (1,)),
                                                      (torch.zeros, (2, 8)), (torch.zeros, (2,))))
    with count_traffic() as counter:
        out = delta_ops.delta_update(x, k, v, beta, backend=backend)
        out_read, _ = delta_ops.update_and_channel_read(x, k, v, beta, c, backend=backend)
        norm_ops.norm_gate_value(src, *weights, eps=1e-5, beta_max=2.0, value_scale=4.0, backend=backend)
    launched = [launch.kernel for launch in counter.launches]
    if compiling:
        assert calls == [("update_with_op", backend), ("update_with_op", backend),
                         ("norm_gate_value_with_op", backend)]
    else:
        assert calls == [("delta_update_triton", None), ("delta_update_read_triton", None),
                         ("norm_gate_value_triton", None)]
    if compiling and backend == "auto" and DEVICE == "cpu":
        assert launched == []
    else:
        assert launched == ["delta_fwd_kernel", "delta_fwd_kernel", "norm_gate_value_fwd_kernel"]
    want = delta_ops.delta_update(x, k, v, beta, backend="torch")
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_read, want, rtol=1e-5, atol=1e-6)
