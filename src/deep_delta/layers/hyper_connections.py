"""Hyper-Connections (HC, Zhu et al., arXiv 2409.19606) and manifold-constrained HC (mHC, Xie et al.,
arXiv 2512.24880): a residual around any sublayer whose state is n streams, ``h: (..., d, n)``.

    h_in = h a;   f = branch(RMSNorm(h_in));   h' = h R + f b^T

HC: a = A_m, R = A_r, b = B, learned freely (static) plus ``scale * tanh(.)`` of the per-stream RMS-normed
state (dynamic). mHC: a = sigmoid(.), b = 2 sigmoid(.), R = H_res^T with H_res projected onto the doubly
stochastic matrices by Sinkhorn-Knopp; the dynamic part is a projection of the whole normed state of the token.
The math is in :mod:`deep_delta.ops.hyper`; this module holds the parameters and their initialisation. The
read, the write and Sinkhorn-Knopp run on ``backend`` (the model's ``delta_backend``): the fused Triton
kernels on CUDA under "auto", the lean PyTorch path otherwise; the coefficients are the reference's.

Initialisation (docs/rivals.md): HC follows its paper, A_m = e_(sublayer mod n), A_r = I, B = 1, the
dynamic projections 0 and their scales 0.01, so with streams that start as copies of the embedding the
model starts as the pre-norm residual baseline. mHC (the paper leaves it open): every static map starts
halfway between HC's and the uniform mixture, H_pre = (e_(sublayer mod n) + 1/n) / 2, H_res = (I + J/n) / 2
(doubly stochastic, so Sinkhorn leaves it unchanged), H_post = 1; alpha = 0.01 (the paper), phi ~ N(0, std^2).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from deep_delta.ops import BACKENDS
from deep_delta.ops.hyper import (
    hc_coefficients_reference,
    mhc_coefficients_reference,
    sinkhorn_knopp,
    stream_read,
    stream_write,
)

HYPER_KINDS = ("hc", "mhc")


def _fill_(param: nn.Parameter, value: torch.Tensor | float) -> None:
    """Set a parameter in place, leaving one loaded by transformers (``_is_hf_initialized``) alone."""
    if getattr(param, "_is_hf_initialized", False):
        return
    with torch.no_grad():
        if isinstance(value, torch.Tensor):
            param.copy_(value)
        else:
            param.fill_(value)


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p) - torch.log1p(-p)


class HyperResidual(nn.Module):
    """Wrap ``branch`` (a module from R^d to R^d) with a hyper-connection over ``streams`` residual streams.

    Args:
        dim: model width d.
        branch: the sublayer F; it receives ``RMSNorm(h_in)`` and any extra arguments given to ``forward``.
        streams: n, the expansion rate (HC and mHC use 4).
        kind: "hc" (Hyper-Connections) or "mhc" (manifold-constrained; needs n >= 2).
        dynamic: True: coefficients depend on the token's state (the papers' default); False: static.
        sublayer: this sublayer's index in the network (2 * block + 0 for attention, + 1 for the MLP):
            HC's A_m starts at e_(sublayer mod n).
        norm_eps: eps of the sublayer's RMSNorm and of the coefficient norms.
        sinkhorn_iters, sinkhorn_eps: Sinkhorn-Knopp rounds (mHC: 20) and the guard of its sums.
        backend: "auto" | "torch" | "triton" for the read, the write and Sinkhorn-Knopp
            (:func:`deep_delta.ops.resolve_backend`).
    """

    def __init__(self, dim: int, branch: nn.Module, *, streams: int = 4, kind: str = "hc", dynamic: bool = True,
                 sublayer: int = 0, norm_eps: float = 1e-5, sinkhorn_iters: int = 20, sinkhorn_eps: float = 1e-6,
                 backend: str = "auto"):
        super().__init__()
        if kind not in HYPER_KINDS:
            raise ValueError(f"HyperResidual: `kind` must be one of {HYPER_KINDS}, got {kind!r}")
        if streams < (2 if kind == "mhc" else 1):
            raise ValueError(
                f"HyperResidual: `streams` must be >= {2 if kind == 'mhc' else 1} for kind={kind!r}, got {streams}"
                + (" (with one stream H_res is the constant 1 and H_pre a lone gate)" if kind == "mhc" else "")
            )
        if sublayer < 0:
            raise ValueError(f"HyperResidual: `sublayer` must be >= 0, got {sublayer}")
        if sinkhorn_iters < 1:
            raise ValueError(f"HyperResidual: `sinkhorn_iters` must be >= 1, got {sinkhorn_iters}")
        if backend not in BACKENDS:
            raise ValueError(f"HyperResidual: `backend` must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        self.dim, self.streams, self.kind, self.dynamic, self.sublayer = dim, streams, kind, dynamic, sublayer
        self.norm_eps, self.sinkhorn_iters, self.sinkhorn_eps = norm_eps, sinkhorn_iters, sinkhorn_eps
        self.norm = nn.RMSNorm(dim, eps=norm_eps)  # the sublayer's pre-norm, on h_in (same name as DeltaResidual's)
        self.branch = branch
        n = streams
        # plain Parameters (no nn.Linear): construction draws no random numbers, so a model's other weights
        # at a seed are those of the baseline
        if kind == "hc":
            self.static_alpha = nn.Parameter(torch.empty(n, n + 1))  # [A_m | A_r]
            self.static_beta = nn.Parameter(torch.empty(n))  # B
            if dynamic:
                self.coef_norm = nn.RMSNorm(dim, eps=norm_eps)
                self.dynamic_proj = nn.Parameter(torch.empty(dim, n + 2))  # W_alpha (n+1 columns) | W_beta
                self.alpha_scale = nn.Parameter(torch.empty(()))
                self.beta_scale = nn.Parameter(torch.empty(()))
        else:
            self.bias_pre = nn.Parameter(torch.empty(n))
            self.bias_post = nn.Parameter(torch.empty(n))
            self.bias_res = nn.Parameter(torch.empty(n, n))
            if dynamic:
                self.phi = nn.Parameter(torch.empty(n * dim, 2 * n + n * n))
                self.alpha = nn.Parameter(torch.empty(3))  # alpha_pre, alpha_post, alpha_res
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        """The hyper-connection's own parameters (the module docstring says how); the branch keeps its init.

        std: mHC's phi ~ N(0, std^2), default ``0.5 / sqrt(n d)`` (the hidden init over its fan-in n*d).
        HC's init draws no random numbers.
        """
        n, k = self.streams, self.sublayer % self.streams
        one_hot = torch.zeros(n)
        one_hot[k] = 1.0
        if self.kind == "hc":
            _fill_(self.static_alpha, torch.cat([one_hot[:, None], torch.eye(n)], dim=1))
            _fill_(self.static_beta, 1.0)
            if self.dynamic:
                self.coef_norm.reset_parameters()
                _fill_(self.dynamic_proj, 0.0)
                _fill_(self.alpha_scale, 0.01)
                _fill_(self.beta_scale, 0.01)
            return
        _fill_(self.bias_pre, _logit((one_hot + 1.0 / n) / 2))
        _fill_(self.bias_post, 0.0)  # 2 sigmoid(0) = 1
        _fill_(self.bias_res, torch.log((torch.eye(n) + 1.0 / n) / 2))
        if self.dynamic:
            std = std if std is not None else 0.5 / math.sqrt(n * self.dim)
            nn.init.normal_(self.phi, mean=0.0, std=std)
            _fill_(self.alpha, 0.01)

    def extra_repr(self) -> str:
        form = "dynamic" if self.dynamic else "static"
        return f"dim={self.dim}, streams={self.streams}, kind={self.kind}, {form}, sublayer={self.sublayer}"

    def coefficients(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a, R, b) for state h (..., d, n): read a (..., n), mixing R (..., n, n), write b (..., n), fp32.

        Static forms return unbatched (n,), (n, n), (n,).
        """
        if self.kind == "hc":
            if not self.dynamic:
                return hc_coefficients_reference(h, self.static_alpha, self.static_beta)
            return hc_coefficients_reference(
                h, self.static_alpha, self.static_beta, self.coef_norm.weight, self.dynamic_proj,
                self.alpha_scale, self.beta_scale, norm_eps=self.norm_eps,
            )
        return mhc_coefficients_reference(
            h if self.dynamic else None, self.bias_pre, self.bias_post, self.bias_res,
            self.phi if self.dynamic else None, self.alpha if self.dynamic else None,
            norm_eps=self.norm_eps, sinkhorn_iters=self.sinkhorn_iters, sinkhorn_eps=self.sinkhorn_eps,
            sinkhorn=self._sinkhorn,
        )

    def _sinkhorn(self, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        return sinkhorn_knopp(logits, iters, eps, backend=self.backend)

    def forward(self, h: torch.Tensor, *branch_args, **branch_kwargs) -> torch.Tensor:
        """h: (..., d, n) -> the new state (..., d, n) in h's dtype."""
        if h.dim() < 3 or tuple(h.shape[-2:]) != (self.dim, self.streams):
            raise ValueError(
                f"HyperResidual: expected a state of shape (..., {self.dim}, {self.streams}), got {tuple(h.shape)}"
            )
        a, r, b = self.coefficients(h)
        h_in = stream_read(h, a, backend=self.backend)
        f = self.branch(self.norm(h_in), *branch_args, **branch_kwargs)
        return stream_write(h, r, b, f, backend=self.backend)


class StreamReadout(nn.Module):
    """The final readout of the streams before the last RMSNorm: their mean, (B, T, d, n) -> (B, T, d).

    The HC paper sums the streams; the mean is the sum scaled by 1/n, which the final RMSNorm cancels (up to
    its eps), and keeps the readout at the embedding's scale, so an HC model at init equals the baseline.
    Same call as a compressor: ``forward(h, past) -> (read, None)`` (it needs no other token).
    """

    history = 0

    def __init__(self, dim: int, streams: int):
        super().__init__()
        self.dim, self.streams = dim, streams

    def extra_repr(self) -> str:
        return f"dim={self.dim}, streams={self.streams}, mean"

    def forward(self, h: torch.Tensor, past: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        if h.dim() < 3 or tuple(h.shape[-2:]) != (self.dim, self.streams):
            raise ValueError(
                f"StreamReadout: expected a state of shape (..., {self.dim}, {self.streams}), got {tuple(h.shape)}"
            )
        return h.mean(-1), None
