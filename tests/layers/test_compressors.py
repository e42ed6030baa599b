"""Compressors (CC, TC) and the state expansion (repeat, EC) against their definitions.

Definitions (SPEC section 2, appendix B.3), written here as plain loops over tokens:
    CC:  x_in_{t,i} = sum_j c_ij X_{t,i,j}
    TC:  x_in_{t,i} = sum_j w_p,j sum_s c_{s,i,j} X_{t-s,i,j}      (X_{t<0} = 0, or the given past)
    EC:  X0_{t,i,j} = sum_s w_{s,i,j} e_{t-s,i}
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

from deep_delta.layers import ChannelCompressor, StateExpander, TokenConvCompressor, make_compressor
from deep_delta.models import count_parameters

F64 = torch.float64


def randomise(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def tc_definition(x, conv, read, past=None):
    """x: (B, T, d, d_v); conv: (K, d, d_v); read: (d_v); past: (B, K-1, d, d_v) or None."""
    b, t, d, dv = x.shape
    k = conv.shape[0]
    hist = torch.zeros(b, k - 1, d, dv, dtype=x.dtype) if past is None else past
    full = torch.cat([hist, x], dim=1)  # token t of x is full[t + K - 1]
    out = torch.zeros(b, t, d, dtype=x.dtype)
    for tt in range(t):
        for s in range(k):
            out[:, tt] += (full[:, tt + k - 1 - s] * conv[s] * read).sum(-1)
    return out


def ec_definition(e, w, past=None):
    """e: (B, T, d); w: (K, d, d_v) -> (B, T, d, d_v)."""
    b, t, d = e.shape
    k, _, dv = w.shape
    hist = torch.zeros(b, k - 1, d, dtype=e.dtype) if past is None else past
    full = torch.cat([hist, e], dim=1)
    out = torch.zeros(b, t, d, dv, dtype=e.dtype)
    for tt in range(t):
        for s in range(k):
            out[:, tt] += full[:, tt + k - 1 - s].unsqueeze(-1) * w[s]
    return out


def gradcheck_module(module, *inputs):
    """float64 gradcheck over the inputs (None entries passed through) and every parameter."""
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]
    n = len(inputs)

    def f(*args):
        out = functional_call(module, dict(zip(names, args[n:])), args[:n])
        return out[0]

    return torch.autograd.gradcheck(f, tuple(inputs) + tuple(params), eps=1e-6, atol=1e-7, rtol=1e-5)


shapes = st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 12), st.integers(1, 5))


# ----------------------------------------------------------------------------- initialisation


@pytest.mark.parametrize("dv", [1, 2, 4])
@pytest.mark.parametrize("make", ["channel", "token", "token-k1"])
def test_every_compressor_reads_back_the_repeated_embedding_at_init(make, dv):
    d = 16
    comp = make_compressor(make.split("-")[0], d, dv, 1 if make == "token-k1" else None)
    e = torch.randn(2, 9, d)
    state = e.unsqueeze(-1).expand(2, 9, d, dv)
    x_in, _ = comp(state)
    # with d_v in {1, 2, 4} (the variants use 4) the average of d_v equal copies is the embedding itself,
    # bit for bit: 1/d_v and every partial sum are exact in binary floating point
    assert torch.equal(x_in, e)


@pytest.mark.parametrize("dv", [3, 5, 8])
def test_read_back_at_init_other_d_v(dv):
    # partial sums like 3e/8 may round: equal to the embedding within a few ulp
    e = torch.randn(2, 9, 16)
    for comp in (ChannelCompressor(16, dv), TokenConvCompressor(16, dv)):
        torch.testing.assert_close(comp(e.unsqueeze(-1).expand(2, 9, 16, dv))[0], e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dv", [1, 3, 4])
def test_ec_at_init_equals_repetition(dv):
    e = torch.randn(3, 11, 16)
    ec, rep = StateExpander(16, dv, "conv"), StateExpander(16, dv, "repeat")
    assert count_parameters(rep) == 0
    x_ec, past_ec = ec(e)
    x_rep, past_rep = rep(e)
    assert x_rep.shape == (3, 11, 16, dv) and past_rep is None
    assert torch.equal(x_rep, e.unsqueeze(-1).expand(3, 11, 16, dv))
    assert torch.equal(x_ec, x_rep)
    assert torch.equal(past_ec, e[:, -3:])  # the next call's history: last K-1 embeddings


# ----------------------------------------------------------------------------- definitions


@settings(max_examples=20, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_channel_compressor_definition(shape, seed):
    b, t, d, dv = shape
    comp = randomise(ChannelCompressor(d, dv).double(), seed)
    x = torch.randn(b, t, d, dv, dtype=F64)
    out, nxt = comp(x)
    assert nxt is None and comp.history == 0
    torch.testing.assert_close(out, torch.einsum("btij,ij->bti", x, comp.weight))


@settings(max_examples=20, deadline=None)
@given(shape=shapes, ksize=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), split=st.integers(0, 9))
def test_token_compressor_definition_and_history(shape, ksize, seed, split):
    b, t, d, dv = shape
    comp = randomise(TokenConvCompressor(d, dv, ksize).double(), seed)
    x = torch.randn(b, t, d, dv, dtype=F64)
    out, nxt = comp(x)
    torch.testing.assert_close(out, tc_definition(x, comp.conv_weight, comp.read))
    assert comp.history == ksize - 1
    if ksize == 1:
        assert nxt is None
    else:
        # history = the last K-1 states, zero-padded when the sequence is shorter
        padded = torch.cat([torch.zeros(b, ksize - 1, d, dv, dtype=F64), x], 1)
        assert torch.equal(nxt, padded[:, -(ksize - 1):])
    # streaming: two chunks with the carried history equal the whole sequence
    split = min(split, t)
    a, past = comp(x[:, :split])
    rest, _ = comp(x[:, split:], past)
    torch.testing.assert_close(torch.cat([a, rest], 1), out, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(shape=shapes, ksize=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), split=st.integers(0, 9))
def test_embedding_conv_definition_and_history(shape, ksize, seed, split):
    b, t, d, dv = shape
    ec = randomise(StateExpander(d, dv, "conv", ksize).double(), seed)
    e = torch.randn(b, t, d, dtype=F64)
    out, _ = ec(e)
    torch.testing.assert_close(out, ec_definition(e, ec.weight))
    split = min(split, t)
    a, past = ec(e[:, :split])
    rest, _ = ec(e[:, split:], past)
    torch.testing.assert_close(torch.cat([a, rest], 1), out, rtol=1e-12, atol=1e-12)


def test_token_convolutions_are_causal():
    d, dv, t = 8, 3, 10
    tc = randomise(TokenConvCompressor(d, dv, 4))
    ec = randomise(StateExpander(d, dv, "conv", 4), 1)
    x = torch.randn(1, t, d, dv)
    e = torch.randn(1, t, d)
    for pos in range(t):
        x2, e2 = x.clone(), e.clone()
        x2[:, pos] += 1.0
        e2[:, pos] += 1.0
        assert torch.equal(tc(x2)[0][:, :pos], tc(x)[0][:, :pos])
        assert not torch.equal(tc(x2)[0][:, pos], tc(x)[0][:, pos])
        assert torch.equal(ec(e2)[0][:, :pos], ec(e)[0][:, :pos])


# ----------------------------------------------------------------------------- gradients


def test_gradcheck_channel_compressor():
    comp = randomise(ChannelCompressor(5, 3).double())
    assert gradcheck_module(comp, torch.randn(2, 4, 5, 3, dtype=F64, requires_grad=True))


@pytest.mark.parametrize("with_past", [False, True], ids=["no-past", "past"])
def test_gradcheck_token_compressor(with_past):
    comp = randomise(TokenConvCompressor(4, 3, 3).double())
    x = torch.randn(2, 5, 4, 3, dtype=F64, requires_grad=True)
    if with_past:
        past = torch.randn(2, 2, 4, 3, dtype=F64, requires_grad=True)
        assert gradcheck_module(comp, x, past)
    else:
        assert gradcheck_module(comp, x)


@pytest.mark.parametrize("with_past", [False, True], ids=["no-past", "past"])
def test_gradcheck_state_expander_conv(with_past):
    ec = randomise(StateExpander(4, 3, "conv", 3).double())
    e = torch.randn(2, 5, 4, dtype=F64, requires_grad=True)
    if with_past:
        assert gradcheck_module(ec, e, torch.randn(2, 2, 4, dtype=F64, requires_grad=True))
    else:
        assert gradcheck_module(ec, e)


# ----------------------------------------------------------------------------- errors


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"`kernel_size` .* must equal value_channels=4, got 3"):
        ChannelCompressor(8, 4, kernel_size=3)
    with pytest.raises(ValueError, match=r"TokenConvCompressor: `kernel_size` must be >= 1, got 0"):
        TokenConvCompressor(8, 4, kernel_size=0)
    with pytest.raises(ValueError, match=r"StateExpander: `kind` must be one of \('repeat', 'conv'\), got 'ec'"):
        StateExpander(8, 4, "ec")
    with pytest.raises(ValueError, match=r"StateExpander: `kernel_size` must be >= 1, got 0"):
        StateExpander(8, 4, "conv", 0)
    with pytest.raises(ValueError, match=r"compressor must be one of \('token', 'channel'\), got 'mean'"):
        make_compressor("mean", 8, 4, None)


def test_shape_errors_say_expected_and_got():
    for comp in (ChannelCompressor(8, 4), TokenConvCompressor(8, 4)):
        name = type(comp).__name__
        with pytest.raises(ValueError, match=rf"{name}: expected a state of shape \(B, T, 8, 4\), got \(2, 3, 8\)"):
            comp(torch.zeros(2, 3, 8))
        with pytest.raises(ValueError, match=rf"{name}: expected a state of shape \(B, T, 8, 4\), got \(2, 3, 4, 8\)"):
            comp(torch.zeros(2, 3, 4, 8))
    with pytest.raises(ValueError, match=r"`past` must have shape \(2, 3, 8, 4\), got \(2, 2, 8, 4\)"):
        TokenConvCompressor(8, 4)(torch.zeros(2, 5, 8, 4), torch.zeros(2, 2, 8, 4))
    with pytest.raises(ValueError, match=r"expected embeddings of shape \(B, T, 8\), got \(2, 3, 6\)"):
        StateExpander(8, 4, "conv")(torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match=r"expected embeddings of shape \(B, T, 8\), got \(3, 8\)"):
        StateExpander(8, 4, "repeat")(torch.zeros(3, 8))
    with pytest.raises(ValueError, match=r"`past` must have shape \(2, 3, 8\), got \(1, 3, 8\)"):
        StateExpander(8, 4, "conv")(torch.zeros(2, 5, 8), torch.zeros(1, 3, 8))
