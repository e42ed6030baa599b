"""Attention Residuals' depth attention (issue 56): ``sum_i softmax_i(q^T RMSNorm(V_i) g) V_i``. The lean
Function against the plain reference (values and gradients of every input, several source counts and dtypes;
fp64 gradcheck), the zero query as the plain mean, and the errors."""

from __future__ import annotations

import pytest
import torch

from deep_delta.ops.depth import depth_attention, depth_attention_reference, depth_weights_reference


def _inputs(n, lead=(2, 5), d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    sources = [(torch.randn(*lead, d, generator=g) * (1 + i)).to(dtype).requires_grad_() for i in range(n)]
    query = torch.randn(d, generator=g, dtype=torch.float32).requires_grad_()
    gain = (1 + 0.3 * torch.randn(d, generator=g, dtype=torch.float32)).requires_grad_()
    return sources, query, gain


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("backend", ["torch", "auto", "triton"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_lean_equals_the_reference_values_and_gradients(backend, dtype, n):
    sources, query, gain = _inputs(n, dtype=dtype)
    got = depth_attention(sources, query, gain, eps=1e-5, backend=backend)
    ref_in = [s.detach().double().requires_grad_() for s in sources]
    q, w = query.detach().double().requires_grad_(), gain.detach().double().requires_grad_()
    want = depth_attention_reference(ref_in, q, w, 1e-5)
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    assert got.dtype == dtype and got.shape == sources[0].shape and _rel(got, want) < tol
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    grads = torch.autograd.grad(got, (*sources, query, gain), g.to(dtype))
    want_grads = torch.autograd.grad(want, (*ref_in, q, w), g)
    for i, (a, b) in enumerate(zip(grads, want_grads)):
        # the query's and the gain's gradients come back in their own dtype (fp32)
        assert _rel(a, b) < 4 * (tol if i < n else max(tol, 1e-6)), f"gradient {i}"


def test_gradcheck():
    sources, query, gain = _inputs(3, lead=(2,), d=6)
    query, gain = query.detach().double().requires_grad_(), gain.detach().double().requires_grad_()
    assert torch.autograd.gradcheck(lambda q, w, *s: depth_attention(s, q, w, eps=1e-5), (query, gain, *sources))


def test_zero_query_is_the_mean_and_weights_sum_to_one():
    sources, query, gain = _inputs(4)
    zero = torch.zeros_like(query)
    mean = torch.stack([s.detach() for s in sources]).mean(0)
    torch.testing.assert_close(depth_attention(sources, zero, gain), mean, rtol=1e-12, atol=1e-12)
    w = depth_weights_reference(sources, query, gain, 1e-5)
    assert w.shape == (2, 5, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5, dtype=w.dtype))
    # a query along one source's direction puts most of the weight there
    sharp = depth_weights_reference(sources, 50 * sources[2].detach()[0, 0].float(), torch.ones_like(gain), 1e-5)
    assert sharp[0, 0].argmax() == 2


def test_errors_name_what_is_wrong():
    sources, query, gain = _inputs(2)
    with pytest.raises(ValueError, match="`sources` got none"):
        depth_attention([], query, gain)
    with pytest.raises(ValueError, match=r"source 1 is \(2, 5, 8\) torch.float64, source 0 \(2, 5, 16\)"):
        depth_attention([sources[0], sources[1][..., :8]], query, gain)
    with pytest.raises(ValueError, match=r"`query` must have shape \(16,\), got \(8,\)"):
        depth_attention(sources, query[:8], gain)
    with pytest.raises(ValueError, match="`backend`|backend"):
        depth_attention(sources, query, gain, backend="cuda")


def test_without_gradients_the_forward_alone_gives_the_same_values():
    """Inference skips the autograd Function (nothing to save; Dynamo traces a plain function there): the values
    are the Function's, and a compiled decoding step of an AttnRes model traces it whole."""
    sources, query, gain = _inputs(3, dtype=torch.float32)
    with_grad = depth_attention(sources, query, gain)
    assert with_grad.grad_fn is not None
    with torch.no_grad():
        plain = depth_attention(sources, query, gain)
        compiled = torch.compile(lambda *s: depth_attention(s, query, gain), fullgraph=True, backend="eager")(*sources)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, with_grad.detach(), rtol=0, atol=0)
    torch.testing.assert_close(compiled, plain, rtol=0, atol=0)
