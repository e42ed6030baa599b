"""Plain PyTorch reference of Hyper-Connections (HC, arXiv 2409.19606) and mHC (arXiv 2512.24880).

State layout: the n residual streams are the last axis, ``h: (..., d, n)``, as DDL's ``(..., d, d_v)`` state.
Every sublayer reads one input from the streams and writes its output back to all of them:

    read:   h_in = h a                (a: (..., n))     HC: A_m^T H       mHC: H_pre x
    write:  h'   = h R + f b^T        (R: (..., n, n))  HC: A_r^T H + B^T F   mHC: H_res x + H_post^T F
                                                         (R = A_r)              (R = H_res^T)

The coefficients (a, R, b) are static parameters or computed per token from the state (the dynamic forms).
All coefficient math and the mixing run in fp32 (fp64 for fp64 inputs); results come back in h's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from deep_delta.ops.backend import compute_dtype


def stream_read_reference(h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``h_in = h a``: h (..., d, n), a (n,) or (..., n) -> (..., d) in h's dtype."""
    ct = compute_dtype(h, a)
    return torch.matmul(h.to(ct), a.to(ct).unsqueeze(-1)).squeeze(-1).to(h.dtype)


def stream_write_reference(h: torch.Tensor, r: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``h' = h R + f b^T``: h (..., d, n), r (n, n) or (..., n, n), b (n,) or (..., n), f (..., d) -> (..., d, n)."""
    ct = compute_dtype(h, r, b, f)
    out = torch.matmul(h.to(ct), r.to(ct)) + f.to(ct).unsqueeze(-1) * b.to(ct).unsqueeze(-2)
    return out.to(h.dtype)


def sinkhorn_knopp_reference(logits: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """Project (..., n, n) logits towards the doubly stochastic matrices (Sinkhorn-Knopp), in fp32 (fp64 stays).

    ``M = exp(logits)`` (shifted by the per-matrix maximum: the normalisations cancel the shift), then ``iters``
    rounds of a column normalisation followed by a row normalisation, each sum guarded by ``eps``. The row
    normalisation comes last, so the rows sum to 1 up to rounding and eps, the columns to the convergence.
    """
    ct = compute_dtype(logits)
    z = logits.to(ct)
    m = torch.exp(z - z.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / (m.sum(-2, keepdim=True) + eps)
        m = m / (m.sum(-1, keepdim=True) + eps)
    return m


def hc_coefficients_reference(
    h: torch.Tensor,
    static_alpha: torch.Tensor,
    static_beta: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    dynamic_proj: torch.Tensor | None = None,
    alpha_scale: torch.Tensor | None = None,
    beta_scale: torch.Tensor | None = None,
    norm_eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HC's (a, R, b) for state h (..., d, n) (the paper's eqs. for static and dynamic hyper-connections).

    static_alpha: (n, n+1), the columns ``[A_m | A_r]``; static_beta: (n,), B. Static form: the three tensors
    of None. Dynamic form: each stream i is RMS-normed over d (weight norm_weight (d,)), projected by
    dynamic_proj (d, n+2) (columns: A_m, A_r (n), B), squashed by tanh and scaled:
    ``[A_m | A_r](H) = alpha_scale tanh(Hbar W_alpha) + [A_m | A_r]``, ``B(H) = beta_scale tanh(Hbar W_beta)^T + B``.
    Returns a (..., n), R = A_r (..., n, n), b (..., n) in fp32 (unbatched (n,), (n, n), (n,) when static).
    """
    n = static_beta.shape[-1]
    ct = compute_dtype(h, static_alpha)
    alpha, beta = static_alpha.to(ct), static_beta.to(ct)
    if dynamic_proj is not None:
        hs = h.to(ct).transpose(-1, -2)  # (..., n, d): one row per stream
        hbar = hs * torch.rsqrt(hs.square().mean(-1, keepdim=True) + norm_eps) * norm_weight.to(ct)
        dyn = torch.tanh(torch.matmul(hbar, dynamic_proj.to(ct)))  # (..., n, n+2)
        alpha = alpha_scale.to(ct) * dyn[..., : n + 1] + alpha
        beta = beta_scale.to(ct) * dyn[..., n + 1] + beta
    return alpha[..., 0], alpha[..., 1:], beta


def mhc_coefficients_reference(
    h: torch.Tensor | None,
    bias_pre: torch.Tensor,
    bias_post: torch.Tensor,
    bias_res: torch.Tensor,
    phi: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    norm_eps: float = 1e-5,
    sinkhorn_iters: int = 20,
    sinkhorn_eps: float = 1e-6,
    sinkhorn: Callable[[torch.Tensor, int, float], torch.Tensor] = sinkhorn_knopp_reference,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC's (a, R, b) for state h (..., d, n): ``H_pre = sigmoid(.)``, ``H_post = 2 sigmoid(.)``,
    ``H_res = SinkhornKnopp(.)`` (the paper's eqs. 7-8).

    Dynamic form: the whole state of a token, flattened to n*d values, is RMS-normed (no weight: phi absorbs
    it) and projected by phi (n*d, 2n + n^2) (columns: pre (n), post (n), res (n*n, row-major)); the three
    parts are scaled by alpha = (alpha_pre, alpha_post, alpha_res) and added to the biases. phi's rows follow
    h's (d, n) memory order (a learned matrix: any fixed order is the same model). Static form: phi, alpha None.
    ``sinkhorn(logits, iters, eps)``: the Sinkhorn-Knopp implementation (the layer passes the dispatching
    :func:`deep_delta.ops.hyper.sinkhorn_knopp`; every implementation equals the reference).
    Returns a = H_pre (..., n), R = H_res^T (..., n, n), b = H_post (..., n) in fp32.
    """
    n = bias_pre.shape[-1]
    ct = compute_dtype(bias_res) if h is None else compute_dtype(h, bias_res)
    pre, post, res = bias_pre.to(ct), bias_post.to(ct), bias_res.to(ct)
    if phi is not None:
        flat = h.to(ct).flatten(-2)  # (..., d*n)
        xn = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
        proj = torch.matmul(xn, phi.to(ct))  # (..., 2n + n^2)
        al = alpha.to(ct)
        pre = al[0] * proj[..., :n] + pre
        post = al[1] * proj[..., n : 2 * n] + post
        res = al[2] * proj[..., 2 * n :].unflatten(-1, (n, n)) + res
    h_res = sinkhorn(res, sinkhorn_iters, sinkhorn_eps)
    return torch.sigmoid(pre), h_res.transpose(-1, -2), 2.0 * torch.sigmoid(post)
