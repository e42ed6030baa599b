"""The delta update fused with the next TC read (ops.delta.triton_token), against the plain reference.

The reference is the two plain ops in a row: ``delta_update_reference`` then ``token_compress_reference``
of the new state. The kernels run under ``TRITON_INTERPRET=1`` on CPU. Sizes are odd (d = 37, d_v = 3) and
the chunk of tokens per program is made small (4) so that the halo (the K-1 tokens recomputed before each
chunk) crosses chunk and sequence boundaries; the backward's persistent grid is made small (3 programs) so
that each program's chunk of tokens, and the window of g_in rows it carries, crosses sequences; a sequence of 3
tokens is shorter than that window. K = 1 to 5; K = 5 takes the second kernel for the fifth tap. Tolerances:
fp32 1e-5 relative (the same arithmetic in another order); bf16 state 2e-2 relative (one bf16 rounding of each
stored value, as the reference's).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import deep_delta.ops.delta.triton_token as tt  # noqa: E402
from deep_delta.ops import delta_update, switches  # noqa: E402
from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops.compress.naive import token_compress_reference  # noqa: E402
from deep_delta.ops.delta import update_and_token_read  # noqa: E402
from deep_delta.ops.delta.naive import delta_update_reference  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from helpers import rel_error  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"



def _inputs(b, t, d, dv, ks, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d, dv, generator=g).to(DEVICE, dtype)
    k = torch.randn(b, t, d, generator=g).to(DEVICE)
    v = torch.randn(b, t, dv, generator=g).to(DEVICE)
    beta = (2 * torch.rand(b, t, 1, generator=g)).to(DEVICE)
    w = (torch.randn(ks, d, dv, generator=g) / dv).to(DEVICE)
    return [a.requires_grad_() for a in (x, k, v, beta, w)]


def _reference(x, k, v, beta, w):
    out = delta_update_reference(x, k, v, beta)
    return out, token_compress_reference(out, w.to(out.dtype))


@pytest.fixture
def small_grid(monkeypatch):
    monkeypatch.setattr(tt, "CHUNK", 4)
    monkeypatch.setattr(ops_launch, "MAX_PROGRAMS", 3)


PATHS = [{}, {"tc_one_pass": True, "inkernel_reduce": True}]  # the defaults; the switched-on paths (issue 47)


@pytest.mark.parametrize("paths", PATHS, ids=["default", "one-pass+inkernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("b", "t", "ks"), [(2, 19, 4), (1, 7, 1), (3, 5, 5), (2, 13, 3), (4, 3, 2)])
def test_values_and_gradients_equal_the_reference(small_grid, dtype, b, t, ks, paths):
    """Both backward forms (``switches``: the one-pass backward with the in-kernel sum, and the defaults) give the
    reference's values and gradients."""
    d, dv = 37, 3
    args = _inputs(b, t, d, dv, ks, dtype)
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    with switches.override(**paths):
        out, xin = update_and_token_read(*args, backend="triton")
    ref_out, ref_xin = _reference(*ref_args)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert out.dtype == dtype and xin.dtype == dtype
    assert rel_error(out, ref_out) < tol and rel_error(xin, ref_xin) < tol
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(out.shape, generator=gen).to(DEVICE, dtype)
    g_in = torch.randn(xin.shape, generator=gen).to(DEVICE, dtype)
    with switches.override(**paths):
        torch.autograd.backward((out, xin), (g_out, g_in))
    torch.autograd.backward((ref_out, ref_xin), (g_out, g_in))
    for name, a, r in zip(("x", "k", "v", "beta", "w"), args, ref_args):
        assert rel_error(a.grad, r.grad) < (1e-5 if dtype == torch.float32 else 3e-2), name


@pytest.mark.parametrize("prefetch", [False, True])
def test_forward_with_and_without_the_prefetch(small_grid, monkeypatch, prefetch):
    """Both forms of the forward's token loop (the launch knob ``PREFETCH``: token t+1 loaded before token t's
    math, or each token loaded in its own iteration) give the reference's values."""
    monkeypatch.setattr(tt, "PREFETCH", prefetch)
    args = [a.detach() for a in _inputs(2, 11, 37, 3, 4, torch.float32)]
    out, xin = update_and_token_read(*args, backend="triton")
    ref_out, ref_xin = _reference(*args)
    assert rel_error(out, ref_out) < 1e-5 and rel_error(xin, ref_xin) < 1e-5


@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ks", [4, 5])
def test_backward_with_the_prefetch(small_grid, monkeypatch, dtype, ks, one_pass, set_switches):
    """The backward's token loop in its other form (the launch knob ``BWD_PREFETCH``: token n+1's inputs and
    g_in row loaded before token n's math) gives the reference's gradients too, with the one-pass backward and
    without it."""
    monkeypatch.setattr(tt, "BWD_PREFETCH", not tt.BWD_PREFETCH)
    set_switches(tc_one_pass=one_pass)
    args = _inputs(2, 19, 37, 3, ks, dtype)
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    out, xin = update_and_token_read(*args, backend="triton")
    ref_out, ref_xin = _reference(*ref_args)
    gen = torch.Generator().manual_seed(2)
    grads = (torch.randn(out.shape, generator=gen).to(DEVICE, dtype),
             torch.randn(xin.shape, generator=gen).to(DEVICE, dtype))
    torch.autograd.backward((out, xin), grads)
    torch.autograd.backward((ref_out, ref_xin), grads)
    for name, a, r in zip(("x", "k", "v", "beta", "w"), args, ref_args):
        assert rel_error(a.grad, r.grad) < (1e-5 if dtype == torch.float32 else 3e-2), name


@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("ks", [3, 4, 5])
def test_backward_is_one_pass_over_the_state(ks, one_pass):
    """With the one-pass backward (the ``tc_one_pass`` switch), for K <= 4 the backward is one launch that reads x,
    G, k, v, beta and g_in once and writes every gradient once (the taps' gradient from x' recomputed in
    registers, into one partial per program), then the partials' sum; past four taps a second kernel reads the
    saved x' for the other taps. Switched off, the second kernel always runs and sums every tap's gradient from
    x', and the update's launch writes no partial. Counted from the launch arguments (dry)."""
    b, t, d, dv = 2, 8, 16, 4
    x, k, v, beta, w = (a.detach() for a in _inputs(b, t, d, dv, ks, torch.float32))
    n, state, vec = b * t, d * dv * 4, d * 4
    with count_traffic(dry=True) as c:
        tt.token_read_backward(torch.zeros_like(x), torch.zeros(b, t, d), x, x if ks > 4 or not one_pass else None,
                               k, v, beta.reshape(b, t), w, 1e-5, one_pass=one_pass)
    kernels = [la.kernel for la in c.launches]
    second = ks > 4 or not one_pass
    assert kernels == ["delta_bwd_kernel"] + ["delta_tc_grad_w_kernel"] * second + ["partial_sum"]
    progs = c.launches[-1].read_bytes // (ks * state)
    update = c.launches[0]
    assert update.read_bytes == n * (2 * state + 2 * vec + dv * 4 + 4) + ks * state
    assert update.write_bytes == n * (state + vec + dv * 4 + 4) + progs * ks * state * one_pass


@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "two-pass"])
def test_saves_the_new_state_only_where_the_second_kernel_reads_it(one_pass):
    """With the one-pass backward, x' is recomputed for the first four taps: the Function keeps it only where a
    fifth tap's gradient reads it; without it, always (the second kernel reads it for every tap)."""
    for ks in (4, 5):
        x, k, v, beta, w = _inputs(1, 6, 8, 2, ks, torch.float32)
        with switches.override(tc_one_pass=one_pass):
            out, _ = update_and_token_read(x, k, v, beta, w, backend="triton")
        saved = out.grad_fn.saved_tensors
        kept = ks > 4 or not one_pass
        assert any(s is not None and s.data_ptr() == out.data_ptr() for s in saved) == kept


def test_only_one_output_used(small_grid):
    """The read's gradient absent (None in backward) is zero, not garbage."""
    args = _inputs(2, 9, 16, 4, 4, torch.float32)
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    out, _ = update_and_token_read(*args, backend="triton")
    ref_out, _ = _reference(*ref_args)
    out.square().sum().backward()
    ref_out.square().sum().backward()
    for a, r in zip(args[:4], ref_args[:4]):
        assert rel_error(a.grad, r.grad) < 1e-5


def test_lean_path_is_the_update_then_the_read():
    """backend="torch": the two ops in a row, bit for bit (what the model ran before the fusion)."""
    args = [a.detach() for a in _inputs(2, 11, 24, 4, 4, torch.float32)]
    out, xin = update_and_token_read(*args, backend="torch")
    ref = delta_update(*args[:4], backend="torch")
    from deep_delta.ops.compress import token_compress

    assert torch.equal(out, ref) and torch.equal(xin, token_compress(ref, args[4], None, backend="torch"))


@pytest.mark.parametrize("tokens", [512, 8192])
def test_partial_buffer_is_bounded_by_the_programs(monkeypatch, tokens):
    """grad_w's partial buffer holds one (K, d, d_v) tile per program, at most MAX_PROGRAMS, for any token count."""
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 5)  # on CUDA too (there: 2 x the SM count)
    d, dv, ks = 16, 4, 4
    x, k, v, beta, w = _inputs(2, tokens // 2, d, dv, ks, torch.float32)
    with count_traffic(dry=True) as c:
        c.phase = "backward"
        tt.token_read_backward(torch.zeros_like(x), None, x.detach(), x.detach(), k.detach(), v.detach(),
                               beta.detach().reshape(2, -1), w.detach(), 1e-5)
    partial = [launch for launch in c.launches if launch.kernel == "partial_sum"]
    assert len(partial) == 1 and partial[0].read_bytes == 5 * ks * d * dv * 4


def test_shapes_are_checked():
    x, k, v, beta, w = (a.detach() for a in _inputs(1, 4, 8, 2, 3, torch.float32))
    with pytest.raises(ValueError, match="weight"):
        update_and_token_read(x, k, v, beta, w[:, :4], backend="torch")
