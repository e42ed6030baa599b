"""The sublayer's input stage (:func:`deep_delta.ops.norm.norm_gate_value`): RMSNorm, linear gate, k-Map value.

- The Triton kernels (``TRITON_INTERPRET=1`` on CPU, native on CUDA) against the plain reference, in values and
  the gradients of src and every weight: fp32 and bf16 src, d = 48 and 100, N = 1, 7 and 90, d_v = 1, 3, 4; both
  forms of the per-token reductions (``ONE_PASS``) and of the backward loop (``BWD_PREFETCH``).
- c in a lower dtype (``c_dtype``): only c changes; ``DeltaResidual(norm_output="autocast")`` casts c once.
- The weight gradients on the persistent grid: with ``max_programs`` patched to 4, still equal; the partial
  buffers have the same size at N and 4N tokens, at most ``max_programs`` x the weights.
- The lean path against the reference (fp64 to 1e-12, fp32), its closed-form backward (the custom op's off
  CUDA) against autograd, the lean op bit for bit equal to the modules it stands for, and ``DeltaResidual`` on
  the Triton backend (the fused op) against the same module running the modules (values and gradients, d_v = 1
  and 4).
- Clear errors for bad arguments.
Tolerances: those of tests/ops/test_kernels.py (``assert_close``), by the dtype of src.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from tests.ops.test_kernels import DEVICE, assert_close  # noqa: E402

from deep_delta.layers import AdditiveResidual, DeltaResidual  # noqa: E402
from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from deep_delta.ops.norm import norm_gate_value, norm_gate_value_reference  # noqa: E402
from deep_delta.ops.norm.lean import norm_gate_value_backward_lean  # noqa: E402

CONSTS = dict(eps=1e-5, beta_max=2.0, value_scale=4.0)
NAMES = ("src", "norm_weight", "gate_weight", "gate_bias", "value_weight", "value_bias")


def norm_inputs(lead, d, dv, dtype=torch.float32, weight_dtype=torch.float32, seed=0):
    """src (*lead, d) in dtype; weights in weight_dtype, away from their init so that every term matters."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape, s=1.0: (s * torch.randn(*shape, generator=gen)).to(DEVICE)  # noqa: E731
    src = (r(*lead, d, s=2.0) + 0.5).to(dtype)
    weights = (1 + r(d, s=0.3), r(1, d, s=0.5), r(1, s=0.5), r(dv, d, s=0.5), r(dv, s=0.5))
    return (src, *(w.to(weight_dtype) for w in weights))


def upstream(src, dv, seed=1):
    gen = torch.Generator().manual_seed(seed)
    lead = src.shape[:-1]
    return tuple(torch.randn(*shape, generator=gen).to(src.device) for shape in ((*lead, src.shape[-1]), (*lead, 1),
                                                                             (*lead, dv)))


def outputs_and_grads(fn, inputs, grads, ref_dtype=None):
    leaves = [t.detach().to(ref_dtype or t.dtype).requires_grad_() for t in inputs]
    out = fn(*leaves, **CONSTS)
    torch.autograd.backward(out, [g.to(o.dtype) for g, o in zip(grads, out)])
    return out, [leaf.grad for leaf in leaves]


def assert_sum_close(name: str, got: torch.Tensor, ref: torch.Tensor, n: int) -> None:
    """A weight gradient, a sum over n tokens in fp32 whatever the order: its rounding error grows like sqrt(n)
    and a sum that cancels (a random upstream gradient) has no relative accuracy, so the bound is elementwise,
    ``sqrt(n) (1e-5 |ref| + 1e-6 max|ref|)``; a missing or wrong term is off by about |ref|."""
    err = (got.double() - ref.double()).abs()
    bound = n**0.5 * (1e-5 * ref.double().abs() + 1e-6 * ref.double().abs().max())
    worst = (err - bound).max().item()
    assert worst <= 0, f"{name}: elementwise error exceeds the bound by {worst:.2e} (max |ref| {ref.abs().max():.2e})"


def compare(fast, inputs, dtype, ref=norm_gate_value_reference):
    """fast against the reference on fp64 copies of the same rounded inputs: values (the norm weight's dtype's
    tolerance), grad src (src's dtype's) and the weight gradients (:func:`assert_sum_close`; fp64: 1e-12)."""
    dv = inputs[4].shape[0]
    grads = upstream(inputs[0], dv)
    got, got_grads = outputs_and_grads(fast, inputs, grads)
    want, want_grads = outputs_and_grads(ref, inputs, grads, torch.float64)
    assert got[0].dtype == inputs[1].dtype and got[1].dtype == got[2].dtype == torch.promote_types(
        inputs[1].dtype, torch.float32)
    for name, a, b in zip(("c", "beta", "v"), got, want):
        assert_close(name, a, b, inputs[1].dtype)
    n = inputs[0].numel() // inputs[0].shape[-1]
    for i, (name, a, b, t) in enumerate(zip(NAMES, got_grads, want_grads, inputs)):
        assert a.dtype == t.dtype, f"grad {name}: dtype {a.dtype}, input {t.dtype}"
        if i == 0 or dtype == torch.float64:
            assert_close(f"grad {name}", a, b, dtype)
        else:
            assert_sum_close(f"grad {name}", a, b, n)


def triton_fn(*args, **kw):
    return norm_gate_value(*args, **kw, backend="triton")


# more tokens than programs: test_triton_with_more_tokens_than_programs (the grid patched to 4 programs)
SIZES = [((1,), 48, 1), ((7,), 100, 4), ((3, 30), 48, 3)]
SIZE_IDS = ["n1-d48-dv1", "n7-d100-dv4", "n90-d48-dv3"]
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", SIZES, ids=SIZE_IDS)
def test_triton_matches_reference(lead, d, dv, dtype):
    compare(triton_fn, norm_inputs(lead, d, dv, dtype, seed=d + dv), dtype)


@pytest.mark.parametrize("one_pass", [False, True], ids=["chained", "one-pass"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["no-prefetch", "prefetch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_triton_with_more_tokens_than_programs(monkeypatch, dtype, prefetch, one_pass):
    """Chunks of 4, 4, 4 and 3 tokens on a grid of 4 programs: the persistent loop and its short last chunk, with
    the next token's rows loaded ahead (``BWD_PREFETCH``) or each in its own iteration; each token's reductions
    taken at once (``ONE_PASS``, forward and backward) or in the order the math is written."""
    from deep_delta.ops.norm import triton as norm_triton

    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    monkeypatch.setattr(norm_triton, "BWD_PREFETCH", prefetch)
    monkeypatch.setattr(norm_triton, "ONE_PASS", one_pass)
    compare(triton_fn, norm_inputs((3, 5), 33, 4, dtype, seed=3), dtype)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_low_precision_src_equals_a_cast_before_the_op(backend):
    """A bf16 src (a bf16 state, as DeltaResidual passes it on the Triton backend) gives exactly what casting it to
    the norm weight's dtype first gives: the same c, beta, v and weight gradients, and src's gradient is the cast
    one's rounded to bf16 (the cast's backward), bit for bit. Under the Triton interpreter (CPU) the kernel's
    fp32 -> bf16 store truncates where the GPU rounds to nearest, so there src's gradient may differ by one bf16
    step; on CUDA it is checked bit for bit."""
    src, *weights = norm_inputs((3, 7), 40, 4, torch.bfloat16, seed=11)
    grads = upstream(src, 4)
    fn = lambda *a, **kw: norm_gate_value(*a, **kw, backend=backend)  # noqa: E731
    new, new_grads = outputs_and_grads(fn, (src, *weights), grads)
    cast = lambda s, *w, **kw: fn(s.float(), *w, **kw)  # noqa: E731
    old, old_grads = outputs_and_grads(cast, (src, *weights), grads)
    assert new_grads[0].dtype == torch.bfloat16
    for a, b in zip(new, old):
        assert a.dtype == b.dtype and torch.equal(a, b)
    truncating = backend == "triton" and DEVICE == "cpu"
    for name, a, b in zip(NAMES, new_grads, old_grads):
        assert a.dtype == b.dtype, name
        if truncating and name == "src":
            step = 2.0 ** -7 * b.float().abs()  # one bf16 step (8 significant bits) at b's magnitude
            assert ((a.float() - b.float()).abs() <= step).all(), f"grad {name} differs by more than one bf16 step"
        else:
            assert torch.equal(a, b), f"grad {name} differs"


@pytest.mark.parametrize("backend", ["triton", "torch", "op"])
def test_c_in_a_lower_dtype_changes_only_c(backend):
    """``c_dtype=bf16``: c is the fp32 one rounded to bf16 (what autocast's cast before a matmul gives), beta and v
    are unchanged (the gate reads c before the rounding), and with a bf16 gradient of c every gradient is bit for
    bit what the fp32 c gives for the same gradient values. Under the Triton interpreter (CPU) the kernel's fp32
    -> bf16 store truncates where the GPU and torch round to nearest: there c may differ by one bf16 step."""
    from deep_delta.ops.norm.library import norm_gate_value_with_op

    if backend == "op":
        def fn(*a, eps, beta_max, value_scale, **kw):
            return norm_gate_value_with_op(*a, eps, beta_max, value_scale, **kw)
    else:
        fn = lambda *a, **kw: norm_gate_value(*a, **kw, backend=backend)  # noqa: E731
    inputs = norm_inputs((3, 7), 40, 4, seed=12)
    gc, gbeta, gv = upstream(inputs[0], 4)
    gc = gc.to(torch.bfloat16)
    low, low_grads = outputs_and_grads(lambda *a, **kw: fn(*a, **kw, c_dtype=torch.bfloat16), inputs,
                                       (gc, gbeta, gv))
    full, full_grads = outputs_and_grads(fn, inputs, (gc.float(), gbeta, gv))
    assert low[0].dtype == torch.bfloat16 and full[0].dtype == torch.float32
    if backend == "triton" and DEVICE == "cpu":
        step = 2.0 ** -7 * full[0].abs()
        assert ((low[0].float() - full[0]).abs() <= step).all(), "c differs by more than one bf16 step"
    else:
        assert torch.equal(low[0], full[0].to(torch.bfloat16))
    assert torch.equal(low[1], full[1]) and torch.equal(low[2], full[2])
    for name, a, b in zip(NAMES, low_grads, full_grads):
        assert a.dtype == b.dtype and torch.equal(a, b), f"grad {name} differs"
    with pytest.raises(TypeError, match="`c_dtype` must be None or a floating-point torch.dtype, got torch.int32"):
        norm_gate_value(*inputs, **CONSTS, c_dtype=torch.int32)


class ThreeMatmuls(torch.nn.Module):
    """A branch whose first ops on c are three matmuls (attention's q, k and v)."""

    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))

    def forward(self, c):
        return torch.tanh(self.q(c)) * self.k(c) + self.v(c)


@pytest.mark.parametrize("dv,additive,rmap", [(1, False, "k"), (4, False, "k"), (1, True, "k"), (1, False, "v")],
                         ids=["dv1", "dv4", "additive", "vmap"])
def test_norm_output_autocast_rounds_c_once(dv, additive, rmap):
    """``DeltaResidual(norm_output="autocast")`` under (CPU) autocast on the modules' path: the branch gets c in
    bf16, one cast where autocast made one per matmul (3 here, and the v-Map's phi_k a fourth); the output is bit
    for bit the default's (the same rounding, done once), and the gradients differ only by c's gradient being
    summed in bf16 (close)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountCasts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 and args[0].dim() > 1 \
                    and tuple(args[0].shape[-1:]) == (d,) and (kwargs or {}).get("dtype") == torch.bfloat16 \
                    and not isinstance(args[0], torch.nn.Parameter) and args[0].requires_grad:
                self.n += 1
            return func(*args, **(kwargs or {}))

    d = 16
    torch.manual_seed(0)
    res = AdditiveResidual(d, ThreeMatmuls(d)) if additive else DeltaResidual(
        d, ThreeMatmuls(d), value_channels=dv, residual_map=rmap, backend="torch")
    x = torch.randn(2, 5, d, *((dv,) if dv > 1 else ()))
    x_in = torch.randn(2, 5, d) if dv > 1 else None
    g = torch.randn_like(x)

    def run(mode):
        res.norm_output = mode
        res.zero_grad()
        xs = x.clone().requires_grad_()
        counter = CountCasts()
        with torch.autocast("cpu", dtype=torch.bfloat16), counter:
            out = res(xs) if additive else res(xs, x_in=x_in)
        out.backward(g.to(out.dtype))
        return out, [xs.grad] + [p.grad.clone() for p in res.parameters() if p.grad is not None], counter.n

    new, new_grads, new_casts = run("autocast")
    old, old_grads, old_casts = run("module")
    assert torch.equal(new, old)
    # 3 casts of c (4 with phi_k) become 1; src's for the k-Map's value is in both
    assert old_casts - new_casts == (3 if rmap == "v" else 2), (old_casts, new_casts)
    for i, (a, b) in enumerate(zip(new_grads, old_grads)):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2, msg=f"gradient {i}")
    with pytest.raises(ValueError, match="`norm_output` must be one of \\('module', 'autocast'\\), got 'bf16'"):
        DeltaResidual(d, ThreeMatmuls(d), norm_output="bf16")


def partial_bytes(n: int, d: int, dv: int) -> list[int]:
    src, *weights = norm_inputs((n,), d, dv)
    leaves = [t.requires_grad_() for t in (src, *weights)]
    with count_traffic() as counter:
        c, beta, v = triton_fn(*leaves, **CONSTS)
        (c.sum() + beta.sum() + v.sum()).backward()
    return [la.read_bytes for la in counter.launches if la.kernel == "partial_sum"]


def test_partial_buffers_do_not_grow_with_the_token_count(monkeypatch):
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    d, dv = 9, 4
    small, large = partial_bytes(10, d, dv), partial_bytes(40, d, dv)
    weights = [2 * d * 4, (1 + dv) * 4, dv * d * 4]  # (g, w_g), (b_g, b_v), W_v in fp32
    assert small == large, f"partial bytes {small} at 10 tokens, {large} at 40"
    assert len(large) == len(weights) and all(s <= 4 * w for s, w in zip(large, weights)), (large, weights)


def test_persistent_sums_are_deterministic(monkeypatch):
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    inputs = norm_inputs((15,), 12, 4)
    grads = upstream(inputs[0], 4)
    first, second = (outputs_and_grads(triton_fn, inputs, grads)[1] for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("lead,d,dv", SIZES, ids=SIZE_IDS)
def test_lean_matches_reference(lead, d, dv, dtype):
    inputs = norm_inputs(lead, d, dv, dtype, dtype, seed=d)
    compare(lambda *a, **kw: norm_gate_value(*a, **kw, backend="torch"), inputs, dtype)


@pytest.mark.parametrize("lead,d,dv", SIZES, ids=SIZE_IDS)
def test_closed_form_backward_matches_autograd(lead, d, dv):
    """The backward the custom op runs off CUDA (and the kernels' formulas) against autograd of the reference."""
    inputs = norm_inputs(lead, d, dv, torch.float64, torch.float64, seed=d + 1)
    grads = upstream(inputs[0], dv)
    _, want = outputs_and_grads(norm_gate_value_reference, inputs, grads)
    n = inputs[0].numel() // d
    flat = (inputs[0].reshape(n, d), *inputs[1:])
    got = norm_gate_value_backward_lean(*(g.double().reshape(n, -1) for g in grads), *flat, *CONSTS.values())
    for name, a, b in zip(NAMES, got, want):
        assert_close(f"grad {name}", a.reshape(b.shape), b, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_custom_op_matches_reference(dtype):
    """The registered op (what "auto" calls on CUDA) with its closed-form backward: off CUDA its lean kernels."""
    from deep_delta.ops.norm.library import norm_gate_value_with_op

    def op(*args, eps, beta_max, value_scale):
        return norm_gate_value_with_op(*args, eps, beta_max, value_scale)

    compare(op, norm_inputs((3, 5), 20, 4, dtype, dtype, seed=7), dtype)


def test_custom_op_compiles_fullgraph():
    """One node under torch.compile(fullgraph=True) (aot_eager: the fake implementations and the registered
    autograd, no C++ build): the same values and gradients as eager."""
    from deep_delta.ops.norm.library import norm_gate_value_with_op

    def step(*args):
        c, beta, v = norm_gate_value_with_op(*args, *CONSTS.values())
        return c.square().sum() + beta.sum() + v.square().sum()

    inputs = norm_inputs((2, 6), 16, 3)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (step, compiled):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        loss = fn(*leaves)
        loss.backward()
        results.append([loss, *(leaf.grad for leaf in leaves)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_auto_off_cuda_is_the_lean_path_bit_for_bit():
    if DEVICE == "cuda":
        pytest.skip("on CUDA 'auto' is the Triton custom op")
    inputs = norm_inputs((2, 5), 16, 4)
    grads = upstream(inputs[0], 4)
    auto = outputs_and_grads(lambda *a, **kw: norm_gate_value(*a, **kw), inputs, grads)
    lean = outputs_and_grads(lambda *a, **kw: norm_gate_value(*a, **kw, backend="torch"), inputs, grads)
    assert all(torch.equal(a, b) for a, b in zip((*auto[0], *auto[1]), (*lean[0], *lean[1])))


class Branch(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, c):
        return torch.tanh(self.lin(c))


@pytest.mark.parametrize("dv", [1, 4])
def test_lean_op_is_bit_for_bit_the_modules(dv):
    """norm_gate_value(backend="torch") against nn.RMSNorm, BetaGate("linear") and the value nn.Linear."""
    from deep_delta.layers.gate import BetaGate

    d = 24
    norm, gate, value = torch.nn.RMSNorm(d, eps=1e-5), BetaGate(d, "linear"), torch.nn.Linear(d, dv)
    with torch.no_grad():
        norm.weight.add_(0.1 * torch.randn(d))
    src = torch.randn(2, 5, d)
    grads = upstream(src, dv)
    leaves = [src.clone().requires_grad_()]
    c = norm(leaves[0])
    old = (c, gate(c), 4.0 * torch.sigmoid(value(leaves[0])))
    torch.autograd.backward(old, list(grads))
    params = (norm.weight, gate.proj.weight, gate.proj.bias, value.weight, value.bias)
    old_grads = [leaves[0].grad, *(p.grad for p in params)]
    new, new_grads = outputs_and_grads(lambda *a, **kw: norm_gate_value(*a, **kw, backend="torch"),
                                       (src, *(p.detach() for p in params)), grads)
    assert all(torch.equal(a, b) for a, b in zip(new, old))
    for name, a, b in zip(NAMES, new_grads, old_grads):
        assert torch.equal(a, b), f"grad {name} differs"


@pytest.mark.parametrize("dv", [1, 4])
def test_delta_residual_fused_on_triton_equals_the_modules(dv):
    """DeltaResidual on the Triton backend (the fused op) against the same module with ``fuse_inputs`` off (the
    norm, gate and value modules, the path every other backend runs): output and every gradient, fp32."""
    d = 24
    torch.manual_seed(0)
    res = DeltaResidual(d, Branch(d), value_channels=dv, backend="triton").to(DEVICE)
    with torch.no_grad():
        for p in res.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert res.fuse_inputs
    x = torch.randn(2, 5, d, *((dv,) if dv > 1 else ()), device=DEVICE)
    x_in = torch.randn(2, 5, d, device=DEVICE) if dv > 1 else None
    g = torch.randn_like(x)
    calls = []
    hook = res.gate.register_forward_hook(lambda *a: calls.append(1))

    def run(fused: bool):
        res.fuse_inputs = fused
        res.zero_grad()
        xs = x.clone().requires_grad_()
        xi = None if x_in is None else x_in.clone().requires_grad_()
        out = res(xs, x_in=xi)
        out.backward(g)
        grads = [xs.grad] + ([] if xi is None else [xi.grad]) + [p.grad.clone() for p in res.parameters()]
        return out, grads

    (new, new_grads), n_fused = run(True), len(calls)
    old, old_grads = run(False)
    hook.remove()
    assert n_fused == 0 and len(calls) == 1  # the fused op bypasses the gate module; off, its hooks fire
    torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6)
    assert len(new_grads) == len(old_grads)
    for i, (a, b) in enumerate(zip(new_grads, old_grads)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"gradient {i} differs")


@pytest.mark.parametrize("dv", [1, 4])
def test_delta_residual_fused_under_autocast_matches_the_modules(dv):
    """``norm_output="autocast"`` under (CPU) autocast: the fused op writes c in bf16 and the modules' path casts
    it once; both give the same output and gradients to bf16's precision (the output first, then x's and every
    parameter's gradient)."""
    d = 24
    torch.manual_seed(1)
    res = DeltaResidual(d, ThreeMatmuls(d), value_channels=dv, backend="triton", norm_output="autocast").to(DEVICE)
    x = torch.randn(2, 5, d, *((dv,) if dv > 1 else ()), device=DEVICE)
    x_in = torch.randn(2, 5, d, device=DEVICE) if dv > 1 else None
    g = torch.randn_like(x)

    def run(fused: bool):
        res.fuse_inputs = fused
        res.zero_grad()
        xs = x.clone().requires_grad_()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = res(xs, x_in=x_in)
        out.backward(g.to(out.dtype))
        return out, [xs.grad] + [p.grad.clone() for p in res.parameters()]

    (new, new_grads), (old, old_grads) = run(True), run(False)
    names = ["output", "x", *(name for name, _ in res.named_parameters())]
    # bf16 matmuls on both paths, and under the interpreter c's store truncates where the cast rounds: each
    # within 2% of its largest entry or of x's gradient's (the gate bias's is a sum over tokens that cancels);
    # one to two bf16 steps. The op's own test (c_dtype above) checks every gradient bit for bit.
    scale = old_grads[0].float().abs().max().item()
    for name, a, b in zip(names, [new, *new_grads], [old, *old_grads]):
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 2e-2 * max(b.float().abs().max().item(), scale), f"{name}: max error {err:.3g}"
    seen = []
    hook = res.branch.register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    run(True)
    hook.remove()
    assert seen == [torch.bfloat16]


def test_bad_arguments_are_named():
    src, g, wg, bg, wv, bv = norm_inputs((3,), 8, 4)
    cases = [
        ((src, g[:7], wg, bg, wv, bv), "`norm_weight` must have shape \\(8,\\)"),
        ((src, g, wg.t(), bg, wv, bv), "`gate_weight` must have shape \\(1, 8\\)"),
        ((src, g, wg, bg.expand(2), wv, bv), "`gate_bias` must have shape \\(1,\\)"),
        ((src, g, wg, bg, wv[:, :5], bv), "`value_weight` must have shape \\(d_v, 8\\)"),
        ((src, g, wg, bg, wv, bv[:3]), "`value_bias` must have shape \\(4,\\) \\(d_v = 4"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            norm_gate_value(*args, **CONSTS)
    with pytest.raises(TypeError, match="`src` must be a floating-point tensor"):
        norm_gate_value(src.long(), g, wg, bg, wv, bv, **CONSTS)
    with pytest.raises(ValueError, match="`beta_max` got -1"):
        norm_gate_value(src, g, wg, bg, wv, bv, eps=1e-5, beta_max=-1.0, value_scale=4.0)
    with pytest.raises(ValueError, match="`backend` must be one of"):
        norm_gate_value(src, g, wg, bg, wv, bv, **CONSTS, backend="cuda")
