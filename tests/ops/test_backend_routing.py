"""Where ``backend="auto"`` and ``"triton"`` go (:func:`deep_delta.ops.backend.through_registered_op`): the custom
ops while ``torch.compile`` traces, both of them (``"triton"`` tells the op to run the kernels, on CPU tensors under
the Triton interpreter too); ``"auto"`` also off the Triton path and for fp64; the kernels' autograd Functions in
eager on the Triton path (the same kernels without the custom op's Python dispatch). ``"auto"``'s Triton path is
forced on CPU tensors here (``resolve_backend`` patched; the kernels run under ``TRITON_INTERPRET=1``). Every public
op reaches its implementation through the one table of :func:`deep_delta.ops.backend.dispatch`."""

from __future__ import annotations

import inspect
import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import deep_delta.ops.delta as delta_ops  # noqa: E402
import deep_delta.ops.norm as norm_ops  # noqa: E402
from deep_delta.ops import backend as ops_backend  # noqa: E402
from deep_delta.ops.backend import IMPLEMENTATIONS, through_registered_op  # noqa: E402
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
    if backend == "auto":  # the one resolution of every op's route
        monkeypatch.setattr(ops_backend, "resolve_backend", lambda backend, device: "triton" if backend != "torch"
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


# ---------------------------------------------------------------- one dispatch (ops.backend.dispatch), one table
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


def test_lazy_loads_the_kernels_only_when_their_route_is_taken(monkeypatch):
    """A route's kernels' module is imported when the route is taken, not before (a machine without Triton never
    imports it); an unknown backend is refused before anything is chosen."""
    loaded = []

    def load():
        loaded.append(1)
        return type("Kernels", (), {"op_triton": staticmethod(lambda t: "kernels")})

    monkeypatch.setitem(IMPLEMENTATIONS, "test_op", {})
    ops_backend.register("test_op", torch=lambda t: "lean", triton=ops_backend.lazy(load, "op_triton"))
    t = torch.zeros(1)
    assert ops_backend.dispatch("test_op", "auto", t)(t) == "lean" and ops_backend.dispatch("test_op", "torch", t)(t) == "lean"
    assert not loaded
    assert ops_backend.dispatch("test_op", "triton", t)(t) == "kernels" and loaded == [1]
    with pytest.raises(ValueError, match=r"`backend` must be one of .* got 'cuda'"):
        ops_backend.dispatch("test_op", "cuda", t)
    with pytest.raises(ValueError, match="exactly one of `torch`"):
        ops_backend.register("test_op", triton=lambda t: t)


def _small_calls() -> list:
    """Every public op with a ``backend``, on small CPU tensors: (its name in ``deep_delta.ops`` or
    ``deep_delta.ops.delta``, its table entry, the routes ``"torch"`` and ``"auto"`` take on CPU, its arguments and
    keywords)."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x, k, v, beta, c, w = r(2, 3, 8, 4), r(2, 3, 8), r(2, 3, 4), r(2, 3, 1).sigmoid(), r(8, 4), r(3, 8, 4)
    norm = (torch.ones(8), r(1, 8), r(1), r(4, 8), r(4))
    consts = dict(eps=1e-5, beta_max=2.0, value_scale=4.0)
    lean, parts = ("torch", "torch"), ("unfused", "unfused")
    return [  # "auto" off the Triton path: the delta rule's custom op (its lean kernel), the other rules' lean path
        ("delta_update", "update", ("torch", "library"), (x, k, v, beta), {}),
        ("write_update", "update", lean, (x, k, v, beta), {}),
        ("untied_update", "update", lean, (x, k, v, beta, beta / 2), {}),
        ("apply_update", "update", lean, ("write", x, k, v, beta), {}),
        ("update_and_channel_read", "update_and_channel_read", ("unfused", "library"), (x, k, v, beta, c), {}),
        ("update_and_token_read", "update_and_token_read", parts, (x, k, v, beta, w), {}),
        ("update_and_norm", "update_and_norm", parts, (x, k, v, beta, *norm), dict(read=c, k_eps=1e-5, **consts)),
        ("channel_compress", "channel_compress", lean, (x, c), {}),
        ("token_compress", "token_compress", lean, (x, w), {}),
        ("embed_conv", "embed_conv", lean, (k, w), {}),
        ("stream_read", "stream_read", lean, (x, torch.softmax(r(4), 0)), {}),
        ("stream_write", "stream_write", lean, (x, r(4, 4), r(4), k), {}),
        ("sinkhorn_knopp", "sinkhorn_knopp", lean, (r(5, 4, 4),), {}),
        ("depth_attention", "depth_attention", lean, ([k, k + 1], r(8), torch.ones(8)), {}),
        ("norm_gate_value", "norm_gate_value", lean, (k, *norm), consts),
    ]


def test_every_public_op_is_reached_through_the_one_table(monkeypatch):
    """Each public op with a ``backend`` checks its inputs, then takes its implementation from the one table by
    (op, route) (:func:`deep_delta.ops.backend.dispatch`): the route's entry is what runs. Off the kernels the
    updates fused with the next sublayer's read or input stage run their parts ("unfused"), each dispatched with
    the caller's backend: the update's own route is taken inside."""
    from deep_delta import ops

    calls = _small_calls()
    assert {op for _, op, _, _, _ in calls} == set(IMPLEMENTATIONS)
    public = {name for name in ops.__all__ if name != "resolve_backend" and callable(getattr(ops, name))
              and "backend" in inspect.signature(getattr(ops, name)).parameters}
    assert public <= {name for name, *_ in calls}, public  # every public op with a backend is called here
    taken = []
    for op, routes in IMPLEMENTATIONS.items():
        for route, implementation in routes.items():
            spy = lambda *a, _op=op, _route=route, _impl=implementation, **kw: taken.append((_op, _route)) or \
                _impl(*a, **kw)  # noqa: E731
            monkeypatch.setitem(routes, route, spy)
    for name, op, want, args, kwargs in calls:
        for backend, route in zip(("torch", "auto"), want):
            taken.clear()
            (getattr(ops, name, None) or getattr(delta_ops, name))(*args, backend=backend, **kwargs)
            assert taken and taken[0] == (op, route), (name, backend, taken)


@pytest.mark.parametrize("package, op, make", COMPRESS_AND_HYPER, ids=[c[1] for c in COMPRESS_AND_HYPER])
def test_compress_and_hyper_ops_dispatch_to_lean_or_kernels(monkeypatch, package, op, make):
    """``"torch"`` and ``"auto"`` on CPU call the lean function, ``"triton"`` the kernels' entry point (run here
    under the interpreter), each with the op's arguments, and return what it returns: the two agree."""
    import importlib

    pkg = importlib.import_module(f"deep_delta.ops.{package}")
    kernels = importlib.import_module(f"deep_delta.ops.{package}.triton")
    calls = []
    lean = IMPLEMENTATIONS[op]["torch"]
    assert lean is getattr(pkg, f"{op}_lean")  # the table's lean entry is the package's lean function
    monkeypatch.setitem(IMPLEMENTATIONS[op], "torch", lambda *a: calls.append((f"{op}_lean", None)) or lean(*a))
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
    """The dispatch (``dispatch``, the table and the lazy kernels' entry) traces without a graph break: ``fullgraph=True`` on the lean path
    (the CPU's ``"auto"``), equal to eager."""
    import importlib

    f = getattr(importlib.import_module(f"deep_delta.ops.{package}"), op)
    torch.manual_seed(0)
    args = make()
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: f(*a, backend="auto"), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), f(*args, backend="auto"), rtol=0, atol=0)
