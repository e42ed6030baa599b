"""The d_v = 1 delta update fused with the next sublayer's input stage (:func:`deep_delta.ops.delta.update_and_norm`,
issue 40, item 1).

- The Triton kernels (``TRITON_INTERPRET=1`` on CPU, native on CUDA) against the plain reference
  (``update_and_norm_reference``: the reference update, then the reference norm, gate and value of its result), in
  values and the gradients of x, k, v, beta and the next sublayer's five weights: fp32 and bf16 states, odd and
  even widths, N = 1, 7 and 90, the next value width 1 and 3, c in bf16; the persistent backward grid with more
  tokens than programs (``max_programs`` patched to 4: short last chunk, several reducers); an output whose
  gradient never arrives.
- The lean path (the custom op's off CUDA) against the reference in fp64 (1e-12) and its closed-form backward
  against autograd of the unfused lean ops.
- In a model: ddl-dv1 on the Triton backend with every update fused (the default) equals the same model with no
  fusion (values and every gradient), with one norm + gate + value kernel per direction left (the first sublayer's)
  instead of one per sublayer; the state rebuild (``recompute_states``) turns the fusion off and still equals.
- Clear errors.
Tolerances: tests/ops/test_kernels.py's ``assert_close`` by the state's dtype; weight gradients (sums over N
tokens) tests/ops/test_norm_gate_value.py's ``assert_sum_close``.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from tests.ops.test_kernels import DEVICE, assert_close  # noqa: E402
from tests.ops.test_norm_gate_value import assert_sum_close  # noqa: E402

from deep_delta import DDLConfig, DDLForCausalLM  # noqa: E402
from deep_delta.layers.delta_residual import Emit  # noqa: E402
from deep_delta.models.ddl.cache import output_cache  # noqa: E402
from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops.delta import update_and_norm, update_and_norm_reference  # noqa: E402
from deep_delta.ops.delta.lean_norm import update_norm_backward_lean  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from helpers import DEBUG  # noqa: E402


def update_read_and_norm(x, k, v, beta, read, *weights, **kw):
    """The fused update through the next sublayer's CC read (``update_and_norm`` with ``read``), with the read
    weight positional as the tests build their inputs."""
    return update_and_norm(x, k, v, beta, *weights, read=read, **kw)


def update_read_and_norm_reference(x, k, v, beta, read, *weights, **kw):
    return update_and_norm_reference(x, k, v, beta, *weights, read=read, **kw)

CONSTS = dict(k_eps=1e-5, eps=1e-5, beta_max=2.0, value_scale=4.0)
NAMES = ("x", "k", "v", "beta", "norm_weight", "gate_weight", "gate_bias", "value_weight", "value_bias")


def make_inputs(lead, d, dv, dtype=torch.float32, seed=0, rule="delta", gates=1):
    """x, k (*lead, d) in dtype, v and beta (*lead, 1) fp32 as the model's (beta (*lead, 2) for the untied ``rule``),
    the next sublayer's weights (fp32, fp64 for an fp64 state; a gate of ``gates`` outputs) away from their init."""
    gen = torch.Generator().manual_seed(seed)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    r = lambda *shape, s=1.0: (s * torch.randn(*shape, generator=gen)).to(wdt).to(DEVICE)  # noqa: E731
    x, k = (r(*lead, d, s=2.0) + 0.3).to(dtype), r(*lead, d).to(dtype)
    v, beta = 4 * r(*lead, 1).sigmoid(), 2 * r(*lead, 2 if rule == "untied" else 1).sigmoid()
    weights = (1 + r(d, s=0.3), r(gates, d, s=0.5), r(gates, s=0.5), r(dv, d, s=0.5), r(dv, s=0.5))
    return (x, k, v, beta, *weights)


def upstream(inputs, seed=1):
    """Gradients of (x', c, beta', v')."""
    gen = torch.Generator().manual_seed(seed)
    x, dv, gates = inputs[0], inputs[7].shape[0], inputs[5].shape[0]
    lead, d = x.shape[:-1], x.shape[-1]
    return tuple(torch.randn(*s, generator=gen).to(DEVICE) for s in ((*lead, d), (*lead, d), (*lead, gates),
                                                                       (*lead, dv)))


def run(fn, inputs, grads, dtype=None, **kw):
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in inputs]
    out = fn(*leaves, **CONSTS, **kw)
    used = [(o, g.to(o.dtype)) for o, g in zip(out, grads) if g is not None]
    torch.autograd.backward([o for o, _ in used], [g for _, g in used])
    return out, [leaf.grad for leaf in leaves]


def reading(stored):
    """The reference with the next sublayer reading ``stored`` (the kernel's x', as it stored it) in place of the
    reference's unrounded x': a bf16 state's rounding (which the interpreter's fp32 -> bf16 store does by
    truncation, a GPU to nearest) then enters both sides alike, and the values and gradients downstream of it are
    compared at fp32 accuracy. The gradient passes the substitution unchanged (the kernel adds the norm's gradient
    of x' in fp32)."""
    from deep_delta.ops.delta.naive import rule_reference
    from deep_delta.ops.norm.naive import norm_gate_value_reference

    def reference(x, k, v, beta, *weights, k_eps, eps, beta_max, value_scale, c_dtype=None, rule="delta"):
        out = rule_reference(rule, x.unsqueeze(-1), k, v, beta, k_eps).squeeze(-1)
        out = out + (stored.to(out.dtype) - out).detach()
        return (out, *norm_gate_value_reference(out, *weights, eps=eps, beta_max=beta_max, value_scale=value_scale,
                                                c_dtype=c_dtype))

    return reference


def compare(fast, inputs, grads=None, **kw):
    """fast against the reference on fp64 copies of the same rounded inputs: x' against the plain reference at the
    state's tolerance; the next sublayer's (c, beta', v') and every gradient against the reference reading the
    kernel's x' (:func:`reading`): c at its dtype's tolerance, beta', v' and the gradients of x, k, v, beta at
    fp32's (a bf16 state's gradients at bf16's), the weight gradients (sums over N tokens) by
    ``assert_sum_close``."""
    dtype = inputs[0].dtype
    grads = upstream(inputs) if grads is None else grads
    # the upstream gradients in the dtypes of the outputs they belong to (as autograd hands them over), so that the
    # fp64 references get the same values
    grads = (grads[0].to(dtype), grads[1].to(kw.get("c_dtype") or inputs[4].dtype), *grads[2:])
    got, got_grads = run(fast, inputs, grads, **kw)
    plain, _ = run(update_and_norm_reference, inputs, grads, torch.float64, **kw)
    want, want_grads = run(reading(got[0].detach()), inputs, grads, torch.float64, **kw)
    assert got[0].dtype == dtype and got[2].dtype == got[3].dtype == torch.promote_types(inputs[4].dtype,
                                                                                           torch.float32)
    assert got[1].dtype == (kw.get("c_dtype") or inputs[4].dtype)
    assert_close("x'", got[0], plain[0], dtype)
    for name, a, b in zip(("c", "beta'", "v'"), got[1:], want[1:]):
        assert_close(name, a, b, a.dtype)
    n = inputs[0].numel() // inputs[0].shape[-1]
    for i, (name, a, b, t) in enumerate(zip(NAMES, got_grads, want_grads, inputs)):
        assert a.dtype == t.dtype, f"grad {name}: dtype {a.dtype}, input {t.dtype}"
        if i < 4:
            assert_close(f"grad {name}", a, b, a.dtype)
        else:
            assert_sum_close(f"grad {name}", a, b, n)


def triton_fn(*args, **kw):
    return update_and_norm(*args, **kw, backend="triton")


SIZES = [((1,), 48, 1), ((7,), 33, 1), ((3, 30), 48, 3)]
SIZE_IDS = ["n1-d48", "n7-d33", "n90-d48-dv3"]
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", SIZES, ids=SIZE_IDS)
def test_triton_matches_reference(lead, d, dv, dtype):
    compare(triton_fn, make_inputs(lead, d, dv, dtype, seed=d + dv))


@pytest.fixture(autouse=True)
def fused_norms(set_switches):
    """This file tests the next sublayer's norm inside the update: switched on (off by default until a GPU run
    has passed; ``deep_delta.ops.switches``)."""
    set_switches(fuse_next_norm=True)


@pytest.mark.parametrize("inkernel", [False, True], ids=["torch-sum", "inkernel-sum"])
def test_triton_with_more_tokens_than_programs(monkeypatch, inkernel, set_switches):
    """Chunks of 4, 4, 4 and 3 tokens on a grid of 4 programs, the reductions spread over 4 reducers (summed in the
    launch, or by torch: the ``inkernel_reduce`` switch), c in bf16."""
    set_switches(inkernel_reduce=inkernel)
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    compare(triton_fn, make_inputs((3, 5), 33, 1, torch.bfloat16, seed=3), c_dtype=torch.bfloat16)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_only_the_state_used(backend):
    """The next sublayer's inputs unused (their gradients None): the gradients are the plain update's."""
    inputs = make_inputs((2, 3), 16, 1, seed=5)
    grads = (upstream(inputs)[0], None, None, None)
    fn = lambda *a, **kw: update_and_norm(*a, **kw, backend=backend)  # noqa: E731
    got, got_grads = run(fn, inputs, grads)
    want, want_grads = run(update_and_norm_reference, inputs, grads, torch.float64)
    for name, a, b in zip(NAMES[:4], got_grads, want_grads):
        assert_close(f"grad {name}", a, b, torch.float32)
    assert all(g is None or not g.any() for g in got_grads[4:]), "a weight got a gradient from an unused output"


def test_lean_path_matches_reference_in_fp64():
    inputs = make_inputs((4, 5), 24, 3, torch.float64, seed=7)
    grads = upstream(inputs)
    got, got_grads = run(lambda *a, **kw: update_and_norm(*a, **kw, backend="torch"), inputs, grads)
    want, want_grads = run(update_and_norm_reference, inputs, grads)
    for a, b in zip([*got, *got_grads], [*want, *want_grads]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_closed_form_backward_equals_autograd():
    """The custom op's backward off CUDA (:func:`update_norm_backward_lean`) against autograd of the reference, in
    fp64 (flattened shapes, as the op takes them)."""
    x, k, v, beta, *weights = make_inputs((9,), 20, 2, torch.float64, seed=8)
    grads = upstream((x, k, v, beta, *weights))
    _, want = run(update_and_norm_reference, (x, k, v, beta, *weights), grads)
    got = update_norm_backward_lean(*grads, x, k, v, beta, *weights, *CONSTS.values())
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m, n=name: f"grad {n}: {m}")


def test_errors_name_the_argument():
    x, k, v, beta, *weights = make_inputs((3,), 8, 1)
    with pytest.raises(ValueError, match="`x` and `k` must have the same shape"):
        update_and_norm(x, k[:, :4], v, beta, *weights, **CONSTS)
    with pytest.raises(ValueError, match=r"`v` must have shape \(3, 1\)"):
        update_and_norm(x, k, v[:2], beta, *weights, **CONSTS)
    with pytest.raises(ValueError, match="`k_eps` got -1"):
        update_and_norm(x, k, v, beta, *weights, **{**CONSTS, "k_eps": -1.0})
    with pytest.raises(ValueError, match="`norm_weight` must have shape"):
        update_and_norm(x, k, v, beta, weights[0][:4], *weights[1:], **CONSTS)


def model_run(model, ids):
    model.zero_grad(set_to_none=True)
    with count_traffic() as counter:
        out = model(ids, labels=ids)
        out.loss.backward()
    kernels = [launch.kernel for launch in counter.launches]
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, kernels


def set_fusion(model, on: bool) -> None:
    model.model.fuse_reads = on
    for block in model.model.layers:
        block.fuse_reads = on


def test_model_fused_equals_unfused_and_drops_the_norm_kernels():
    """ddl-dv1 (2 blocks, 4 sublayers) on the Triton backend: every update computes the next sublayer's norm, gate
    and value (3 fused updates, the last one plain), the same values and gradients as without the fusion, and the
    norm + gate + value kernels run once per direction (the first sublayer's) instead of 4 times."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-dv1", "tiny", delta_backend="triton", **DEBUG)).to(DEVICE)
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    fused = model_run(model, ids)
    set_fusion(model, False)
    plain = model_run(model, ids)
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-5, atol=1e-6)
    for name, g in fused[1].items():
        torch.testing.assert_close(g, plain[1][name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    count = lambda kernels, name: kernels.count(name)  # noqa: E731
    assert count(fused[2], "update_norm_fwd_kernel") == count(fused[2], "update_norm_bwd_kernel") == 3
    assert count(fused[2], "norm_gate_value_fwd_kernel") == count(fused[2], "norm_gate_value_bwd_kernel") == 1
    assert count(plain[2], "norm_gate_value_fwd_kernel") == 4 and "update_norm_fwd_kernel" not in plain[2]


def test_state_rebuild_turns_the_fusion_off():
    """``recompute_states`` records each update on a tape to rebuild its input; the fused op does not record, so
    the model runs the plain updates there: the same values and gradients as the fused model."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-dv1", "tiny", delta_backend="triton", **DEBUG)).to(DEVICE)
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fused = model_run(model, ids)
    model.model.recompute_states = True
    rebuilt = model_run(model, ids)
    assert "update_norm_fwd_kernel" not in rebuilt[2] and "update_norm_fwd_kernel" in fused[2]
    torch.testing.assert_close(rebuilt[0], fused[0], rtol=1e-5, atol=1e-6)
    for name, g in fused[1].items():
        torch.testing.assert_close(rebuilt[1][name], g, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_update_and_norm_refuses_what_it_cannot_fuse():
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-dv1", "tiny", delta_backend="torch", **DEBUG))
    block = model.model.layers[0]
    x = torch.randn(1, 4, DEBUG["hidden_size"])
    assert not block.attn.fuses_norm_of(block.mlp, x)
    with pytest.raises(ValueError, match="emit='inputs' needs two delta residuals of one width and d_v"):
        block.attn(x, None, None, None, emit=Emit("inputs", block.mlp))


# ----------------------------------------------------------------------------- d_v > 1: through the next CC read

READ_NAMES = ("x", "k", "v", "beta", "read", "norm_weight", "gate_weight", "gate_bias", "value_weight", "value_bias")


def make_read_inputs(lead, d, dv, dtype=torch.float32, seed=0, rule="delta", gates=1):
    """x (*lead, d, d_v) and k in dtype, v (*lead, d_v) and beta fp32 (beta (*lead, 2) for the untied ``rule``), the
    read weight (d, d_v) and the next sublayer's weights fp32 (fp64 for an fp64 state; a gate of ``gates``
    outputs)."""
    gen = torch.Generator().manual_seed(seed)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    r = lambda *shape, s=1.0: (s * torch.randn(*shape, generator=gen)).to(wdt).to(DEVICE)  # noqa: E731
    x, k = (r(*lead, d, dv, s=2.0) + 0.3).to(dtype), r(*lead, d).to(dtype)
    v, beta = 4 * r(*lead, dv).sigmoid(), 2 * r(*lead, 2 if rule == "untied" else 1).sigmoid()
    read = r(d, dv, s=0.7)
    weights = (1 + r(d, s=0.3), r(gates, d, s=0.5), r(gates, s=0.5), r(dv, d, s=0.5), r(dv, s=0.5))
    return (x, k, v, beta, read, *weights)


def read_upstream(inputs, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x, gates = inputs[0], inputs[6].shape[0]
    lead, d, dv = x.shape[:-2], x.shape[-2], x.shape[-1]
    return tuple(torch.randn(*s, generator=gen).to(DEVICE) for s in ((*lead, d, dv), (*lead, d), (*lead, gates),
                                                                       (*lead, dv)))


def as_stored(t, dtype):
    """``t`` rounded to ``dtype`` as the kernel rounds a value it computed (returned in t's dtype): to nearest on a
    GPU; the Triton interpreter's fp32 -> bf16 conversion truncates (drops the low 16 bits of the fp32 pattern)."""
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        bits = t.float().view(torch.int32) & -65536  # 0xFFFF0000
        return bits.view(torch.float32).to(t.dtype)
    return t.to(dtype).to(t.dtype)


def reading_read(stored):
    """The CC reference with the next sublayer reading the kernel's stored x' (as :func:`reading`), and its CC read
    rounded to the state's dtype as the unfused read stores it (the gradient passing both roundings unchanged)."""
    from deep_delta.ops.compress.naive import channel_compress_reference
    from deep_delta.ops.delta.naive import rule_reference
    from deep_delta.ops.norm.naive import norm_gate_value_reference

    def reference(x, k, v, beta, read, *weights, k_eps, eps, beta_max, value_scale, c_dtype=None, rule="delta"):
        out = rule_reference(rule, x, k, v, beta, k_eps)
        out = out + (stored.to(out.dtype) - out).detach()
        x_in = channel_compress_reference(out, read)
        x_in = x_in + (as_stored(x_in, stored.dtype) - x_in).detach()
        return (out, *norm_gate_value_reference(x_in, *weights, eps=eps, beta_max=beta_max, value_scale=value_scale,
                                                c_dtype=c_dtype))

    return reference


def compare_read(fast, inputs, **kw):
    """As :func:`compare`, for the update through the CC read: x' against the plain reference; the rest against
    :func:`reading_read`."""
    dtype = inputs[0].dtype
    grads = read_upstream(inputs)
    grads = (grads[0].to(dtype), grads[1].to(kw.get("c_dtype") or inputs[5].dtype), *grads[2:])
    got, got_grads = run(fast, inputs, grads, **kw)
    plain, _ = run(update_read_and_norm_reference, inputs, grads, torch.float64, **kw)
    want, want_grads = run(reading_read(got[0].detach()), inputs, grads, torch.float64, **kw)
    assert got[0].dtype == dtype and got[1].dtype == (kw.get("c_dtype") or inputs[5].dtype)
    assert_close("x'", got[0], plain[0], dtype)
    for name, a, b in zip(("c", "beta'", "v'"), got[1:], want[1:]):
        assert_close(name, a, b, a.dtype)
    n = inputs[0].numel() // (inputs[0].shape[-1] * inputs[0].shape[-2])
    for i, (name, a, b, t) in enumerate(zip(READ_NAMES, got_grads, want_grads, inputs)):
        assert a.dtype == t.dtype, f"grad {name}: dtype {a.dtype}, input {t.dtype}"
        if i < 4:
            assert_close(f"grad {name}", a, b, a.dtype)
        else:
            assert_sum_close(f"grad {name}", a, b, n)


def read_triton_fn(*args, **kw):
    return update_read_and_norm(*args, **kw, backend="triton")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", [((1,), 16, 4), ((7,), 33, 3)], ids=["n1-d16-dv4", "n7-d33-dv3"])
def test_read_triton_matches_reference(lead, d, dv, dtype):
    compare_read(read_triton_fn, make_read_inputs(lead, d, dv, dtype, seed=d + dv))


@pytest.mark.parametrize("inkernel", [False, True], ids=["torch-sum", "inkernel-sum"])
def test_read_triton_with_more_tokens_than_programs(monkeypatch, inkernel, set_switches):
    set_switches(inkernel_reduce=inkernel)
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    compare_read(read_triton_fn, make_read_inputs((3, 5), 24, 4, torch.bfloat16, seed=4), c_dtype=torch.bfloat16)


def test_read_lean_path_and_closed_form_backward_in_fp64():
    from deep_delta.ops.delta.lean_norm import update_read_norm_backward_lean

    inputs = make_read_inputs((3, 4), 12, 3, torch.float64, seed=9)
    grads = read_upstream(inputs)
    got, got_grads = run(lambda *a, **kw: update_read_and_norm(*a, **kw, backend="torch"), inputs, grads)
    want, want_grads = run(update_read_and_norm_reference, inputs, grads)
    for a, b in zip([*got, *got_grads], [*want, *want_grads]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    x, k, v, beta, *rest = inputs
    flat = (x.reshape(12, 12, 3), k.reshape(12, 12), v.reshape(12, 3), beta.reshape(12, 1), *rest)
    ups = (grads[0].reshape(12, 12, 3), grads[1].reshape(12, 12), grads[2].reshape(12, 1), grads[3].reshape(12, 3))
    closed = update_read_norm_backward_lean(*ups, *flat, *CONSTS.values())
    for name, a, b in zip(READ_NAMES, closed, want_grads):
        torch.testing.assert_close(a.reshape(b.shape), b, rtol=1e-12, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_read_errors_name_the_argument():
    x, k, v, beta, read, *weights = make_read_inputs((3,), 8, 2)
    with pytest.raises(ValueError, match=r"`read` must have shape \(8, 2\)"):
        update_read_and_norm(x, k, v, beta, read[:4], *weights, **CONSTS)
    with pytest.raises(ValueError, match="`x` must have shape \\(..., d, d_v\\) and `k` \\(..., d\\)"):
        update_read_and_norm(x, k[:, :4], v, beta, read, *weights, **CONSTS)


def test_cc_model_fused_equals_unfused_and_drops_the_reads_and_norms():
    """ddl-cc-noec (2 blocks) on the Triton backend: 3 updates compute the next sublayer's CC read and its norm, gate
    and value (update_read_norm_*), the last one the final read (delta_fwd_kernel with the read); the first read and
    norm stay their own kernels. Values and every gradient as without any fusion."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc-noec", "tiny", delta_backend="triton", **DEBUG)).to(DEVICE)
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    fused = model_run(model, ids)
    set_fusion(model, False)
    plain = model_run(model, ids)
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-5, atol=1e-6)
    for name, g in fused[1].items():
        torch.testing.assert_close(g, plain[1][name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    count = lambda kernels, name: kernels.count(name)  # noqa: E731
    assert count(fused[2], "update_read_norm_fwd_kernel") == count(fused[2], "update_read_norm_bwd_kernel") == 3
    assert count(fused[2], "norm_gate_value_fwd_kernel") == count(fused[2], "cc_fwd_kernel") == 1
    assert count(fused[2], "delta_fwd_kernel") == 1
    assert count(plain[2], "norm_gate_value_fwd_kernel") == 4 and count(plain[2], "cc_fwd_kernel") == 5


@torch.no_grad()
def test_cc_decoding_runs_the_fused_norms_and_matches_a_full_forward():
    """Decoding an unpadded batch with the cache (a CC read needs no token history): each step's updates take the
    next sublayer's read and input stage in their pass too, and the step's logits equal a full forward's."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc-noec", "tiny", delta_backend="triton", **DEBUG)).to(DEVICE)
    model.eval()
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    full = model(ids).logits[:, -1]
    past = output_cache(model(ids[:, :5], use_cache=True))
    with count_traffic() as counter:
        step = model(ids[:, 5:], cache=past, use_cache=True).logits[:, -1]
    kernels = [launch.kernel for launch in counter.launches]
    assert kernels.count("update_read_norm_fwd_kernel") == 2 * DEBUG["num_hidden_layers"] - 1
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
