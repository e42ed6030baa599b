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


# ---------------------------------------------------------------- compress and hyper: one dispatcher (ops.backend.pick)
COMPRESS_AND_HYPER = [
    # (package, op, its arguments for a small case)
    ("compress", "channel_compress", lambda: (torch.randn(2, 3, 8, 4), torch.randn(8, 4))),
    ("compress", "token_compress", lambda: (torch.randn(2, 3, 8, 4), torch.randn(3, 8, 4), None)),
    ("compress", "embed_conv", lambda: (torch.randn(2, 3, 8), torch.randn(3, 8, 4), None)),
    ("hyper", "stream_read", lambda: (torch.randn(2, 3, 8, 4), torch.softmax(torch.randn(4), 0))),
    ("hyper", "stream_write", lambda: (torch.randn(2, 3, 8, 4), torch.randn(4, 4), torch.randn(4),
                                       torch.randn(2, 3, 8))),
    ("hyper", "sinkhorn_knopp", lambda: (torch.randn(5, 4, 4), 20, 1e-6)),
]


def test_pick_loads_the_kernels_only_when_the_backend_resolves_to_triton():
    from deep_delta.ops.backend import pick

    loaded = []

    def load():
        loaded.append(1)
        return "kernels"

    cpu = torch.device("cpu")
    assert pick("auto", cpu, "lean", load) == "lean" and pick("torch", cpu, "lean", load) == "lean"
    assert not loaded
    assert pick("triton", cpu, "lean", load) == "kernels" and loaded == [1]
    with pytest.raises(ValueError, match=r"`backend` must be one of .* got 'cuda'"):
        pick("cuda", cpu, "lean", load)


@pytest.mark.parametrize("package, op, make", COMPRESS_AND_HYPER, ids=[c[1] for c in COMPRESS_AND_HYPER])
def test_compress_and_hyper_ops_dispatch_to_lean_or_kernels(monkeypatch, package, op, make):
    """``"torch"`` and ``"auto"`` on CPU call the lean function, ``"triton"`` the kernels' entry point (run here
    under the interpreter), each with the op's arguments, and return what it returns: the two agree."""
    import importlib

    pkg = importlib.import_module(f"deep_delta.ops.{package}")
    kernels = importlib.import_module(f"deep_delta.ops.{package}.triton")
    calls = []
    spy(monkeypatch, pkg, f"{op}_lean", calls)
    spy(monkeypatch, kernels, f"{op}_triton", calls)
    torch.manual_seed(0)
    args = make()
    lean = [getattr(pkg, op)(*args, backend=b) for b in ("torch", "auto")]
    assert [c[0] for c in calls] == [f"{op}_lean"] * 2
    fused = getattr(pkg, op)(*args, backend="triton")
    assert [c[0] for c in calls] == [f"{op}_lean"] * 2 + [f"{op}_triton"]
    torch.testing.assert_close(lean[0], lean[1], rtol=0, atol=0)
    torch.testing.assert_close(fused, lean[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("package, op, make", COMPRESS_AND_HYPER, ids=[c[1] for c in COMPRESS_AND_HYPER])
def test_compress_and_hyper_dispatch_compiles_whole(package, op, make):
    """The dispatch (``pick`` and its lambda) traces without a graph break: ``fullgraph=True`` on the lean path
    (the CPU's ``"auto"``), equal to eager."""
    import importlib

    f = getattr(importlib.import_module(f"deep_delta.ops.{package}"), op)
    torch.manual_seed(0)
    args = make()
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: f(*a, backend="auto"), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), f(*args, backend="auto"), rtol=0, atol=0)
