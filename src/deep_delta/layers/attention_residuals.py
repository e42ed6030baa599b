"""Attention Residuals (AttnRes, Kimi Team, arXiv 2603.15031): a residual whose state is the list of what came
before, and whose sublayer reads a softmax over depth of it instead of the running sum.

    h_l = sum_i alpha_{i,l} V_i,   alpha_{., l} = softmax_i(w_l^T RMSNorm(V_i));   V_{l+1} = F_l(RMSNorm(h_l))

Full AttnRes: the sources V_i are the embedding and every earlier sublayer's output. Block AttnRes: the
sublayers are split into blocks, and the sources are the embedding, the sum of each finished block's outputs,
and the running sum of the current block's (a sublayer attends over blocks, not over every sublayer). Both are
one module: the state is the tuple of sources; a sublayer that starts a block appends its output as a new
source, any other adds it into the last one. Full AttnRes is the block form with one sublayer per block.

Initialisation (the paper's): the pseudo-query w starts at zero, so every sublayer starts with the plain mean
of its sources; the key norm's gain starts at 1. Since the mean is the baseline's running sum scaled by
1/(number of sources), which the sublayer's RMSNorm cancels (up to its eps), an AttnRes model at init computes
what the pre-norm baseline computes. The readout before the final norm is one more depth attention with its own
query (:class:`DepthReadout`): where the paper leaves the last step open, we attend once more.
The math is in :mod:`deep_delta.ops.depth`.
"""

from __future__ import annotations

import torch
from torch import nn

from deep_delta.ops import BACKENDS
from deep_delta.ops.depth import depth_attention, depth_weights_reference

Sources = tuple[torch.Tensor, ...]


def block_starts(sublayers: int, blocks: int | None) -> tuple[bool, ...]:
    """Which of ``sublayers`` sublayers start a block when they are split into ``blocks`` contiguous blocks of
    near-equal size (sublayer s is in block ``floor(s * blocks / sublayers)``); None, or more blocks than
    sublayers: every sublayer its own block (Full AttnRes)."""
    if sublayers < 1:
        raise ValueError(f"block_starts: `sublayers` got {sublayers}; allowed: an integer >= 1")
    if blocks is not None and blocks < 1:
        raise ValueError(f"block_starts: `blocks` got {blocks}; allowed: None or an integer >= 1")
    n = sublayers if blocks is None else min(blocks, sublayers)
    which = [s * n // sublayers for s in range(sublayers)]
    return tuple(s == 0 or which[s] != which[s - 1] for s in range(sublayers))


class _DepthQuery(nn.Module):
    """A pseudo-query (d,) and the RMSNorm gain of the keys it is compared with."""

    def __init__(self, dim: int, norm_eps: float, backend: str):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"{type(self).__name__}: `backend` must be one of {BACKENDS}, got {backend!r}")
        self.dim, self.backend = dim, backend
        self.query = nn.Parameter(torch.zeros(dim))
        self.key_norm = nn.RMSNorm(dim, eps=norm_eps)

    def reset_parameters(self) -> None:
        """The query at zero (uniform weights over the sources), the key norm's gain at 1."""
        nn.init.zeros_(self.query)
        self.key_norm.reset_parameters()

    def _check(self, sources: Sources) -> None:
        if not isinstance(sources, tuple) or not sources:
            raise ValueError(f"{type(self).__name__}: expected the state as a non-empty tuple of sources (..., "
                             f"{self.dim}), got {type(sources).__name__}")
        if sources[0].shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__}: expected sources of shape (..., {self.dim}), got "
                             f"{tuple(sources[0].shape)}")

    def attend(self, sources: Sources) -> torch.Tensor:
        """The softmax-weighted sum of the sources, (..., d) in their dtype."""
        self._check(sources)
        return depth_attention(sources, self.query, self.key_norm.weight, eps=self.key_norm.eps,
                               backend=self.backend)

    def weights(self, sources: Sources) -> torch.Tensor:
        """The weights over the sources, (..., n) in fp32 (for analysis: the reference's)."""
        self._check(sources)
        return depth_weights_reference(sources, self.query, self.key_norm.weight, self.key_norm.eps)


class AttnResidual(_DepthQuery):
    """Wrap ``branch`` (a module from R^d to R^d) with an attention residual.

    Args:
        dim: model width d.
        branch: the sublayer F; it receives ``RMSNorm(h)`` and any extra arguments given to ``forward``.
        starts_block: True: this sublayer's output is a new source (Full AttnRes: always; Block AttnRes: the
            first sublayer of a block); False: it is added into the last source (the current block's sum).
        norm_eps: eps of the sublayer's RMSNorm and of the keys' RMSNorm.
        backend: "auto" | "torch" | "triton" for the depth attention (every one runs the lean path).

    ``forward(sources, ...)``: sources is a tuple of tensors (..., d), the embedding first; returns the new tuple.
    """

    def __init__(self, dim: int, branch: nn.Module, *, starts_block: bool = True, norm_eps: float = 1e-5,
                 backend: str = "auto"):
        super().__init__(dim, norm_eps, backend)
        self.starts_block = starts_block
        self.norm = nn.RMSNorm(dim, eps=norm_eps)  # the sublayer's pre-norm (same name as DeltaResidual's)
        self.branch = branch

    def extra_repr(self) -> str:
        return f"dim={self.dim}, starts_block={self.starts_block}"

    def forward(self, sources: Sources, *branch_args, **branch_kwargs) -> Sources:
        h = self.attend(sources).to(self.norm.weight.dtype)  # a state stored in lower precision is read in ours
        out = self.branch(self.norm(h), *branch_args, **branch_kwargs).to(sources[-1].dtype)
        if self.starts_block or len(sources) == 1:  # the embedding is a source of its own, never a block's sum
            return (*sources, out)
        return (*sources[:-1], sources[-1] + out)


class DepthSources(nn.Module):
    """The first state of an AttnRes model: the embeddings (B, T, d) as the one source ``(e,)``. Same call as a
    state expander: ``forward(e, past) -> (state, None)`` (it needs no other token)."""

    history = 0

    def forward(self, e: torch.Tensor, past: torch.Tensor | None = None) -> tuple[Sources, None]:
        return (e,), None


class DepthReadout(_DepthQuery):
    """The readout of an AttnRes model before the final RMSNorm: one more depth attention over the sources, with
    its own query. Same call as a compressor: ``forward(sources, past) -> (read, None)``."""

    history = 0

    def __init__(self, dim: int, norm_eps: float = 1e-5, backend: str = "auto"):
        super().__init__(dim, norm_eps, backend)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def forward(self, sources: Sources, past: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        return self.attend(sources), None
