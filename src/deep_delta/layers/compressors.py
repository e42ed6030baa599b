"""Reading the expanded state out (compressors) and building it (state expansion).

Compressors map X: (B, T, d, d_v) to x_in: (B, T, d). Both start as the plain average over the value
channels, so at initialisation the read of a freshly expanded state equals the embedding it came from.
"""

from __future__ import annotations

import torch
from torch import nn

from deep_delta.ops import resolve_backend
from deep_delta.ops.compress import channel_compress, embed_conv, token_compress
from deep_delta.ops.compress.shortconv import next_past

COMPRESSORS = ("token", "channel")
STATE_INITS = ("repeat", "conv")


def identity_taps_(weight: nn.Parameter) -> None:
    """Initialise the taps (K, ...) of a causal conv as the identity: 1 at lag 0, 0 at every other lag.

    A tensor marked ``_is_hf_initialized`` (loaded by transformers) is left alone, as the ``nn.init``
    functions leave it inside ``PreTrainedModel.initialize_weights``.
    """
    if getattr(weight, "_is_hf_initialized", False):
        return
    with torch.no_grad():
        weight.zero_()
        weight[0].fill_(1.0)


def _check_state(name: str, x: torch.Tensor, dim: int, value_channels: int) -> None:
    if x.dim() != 4 or x.shape[-2:] != (dim, value_channels):
        raise ValueError(
            f"{name}: expected a state of shape (B, T, {dim}, {value_channels}), got {tuple(x.shape)}"
        )


class ChannelCompressor(nn.Module):
    """CC: per-feature mix over the value channels, ``x_in_i = sum_j c_ij X_ij`` (kernel = d_v).

    Needs no token history, so generation carries nothing extra for it.
    """

    def __init__(self, dim: int, value_channels: int, kernel_size: int | None = None, backend: str = "auto"):
        super().__init__()
        resolve_backend(backend, torch.device("cpu"))  # validates the name
        self.backend = backend
        if kernel_size is not None and kernel_size != value_channels:
            raise ValueError(
                f"ChannelCompressor: `kernel_size` spans the value channels and must equal "
                f"value_channels={value_channels}, got {kernel_size}"
            )
        self.dim, self.value_channels, self.kernel_size = dim, value_channels, value_channels
        self.weight = nn.Parameter(torch.empty(dim, value_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The mean over the value channels."""
        nn.init.constant_(self.weight, 1.0 / self.value_channels)

    @property
    def history(self) -> int:
        return 0

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None):
        """x: (B, T, d, d_v) -> (x_in: (B, T, d), None)."""
        _check_state("ChannelCompressor", x, self.dim, self.value_channels)
        return channel_compress(x, self.weight, backend=self.backend), None


class TokenConvCompressor(nn.Module):
    """TC: causal depthwise conv over tokens on the d*d_v channels, then a read vector w_p over d_v.

    ``x_in_{t,i} = sum_j w_p,j sum_s c_{i,j,s} X_{t-s,i,j}``. Starts as identity conv + mean read.
    A decoding step passes the last K-1 states as ``past`` and gets the next ``past`` back.
    """

    def __init__(self, dim: int, value_channels: int, kernel_size: int = 4, backend: str = "auto"):
        super().__init__()
        resolve_backend(backend, torch.device("cpu"))  # validates the name
        self.backend = backend
        if kernel_size < 1:
            raise ValueError(f"TokenConvCompressor: `kernel_size` must be >= 1, got {kernel_size}")
        self.dim, self.value_channels, self.kernel_size = dim, value_channels, kernel_size
        self.conv_weight = nn.Parameter(torch.empty(kernel_size, dim, value_channels))
        self.read = nn.Parameter(torch.empty(value_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Identity taps and the mean read vector: at init the read is the mean over the value channels."""
        identity_taps_(self.conv_weight)
        nn.init.constant_(self.read, 1.0 / self.value_channels)

    @property
    def history(self) -> int:
        return self.kernel_size - 1

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None):
        """x: (B, T, d, d_v), past: (B, K-1, d, d_v) or None -> (x_in: (B, T, d), next past or None)."""
        _check_state("TokenConvCompressor", x, self.dim, self.value_channels)
        k = self.kernel_size
        if past is not None and tuple(past.shape) != (x.shape[0], k - 1) + tuple(x.shape[2:]):
            raise ValueError(
                f"TokenConvCompressor: `past` must have shape {(x.shape[0], k - 1) + tuple(x.shape[2:])}, "
                f"got {tuple(past.shape)}"
            )
        out = token_compress(x, self.folded_weight(), past, backend=self.backend)
        return out, _history(x, past, k)

    def folded_weight(self) -> torch.Tensor:
        """The read vector folded into the conv taps, (K, d, d_v): one reduction over d_v instead of a full conv
        output (what the fused update + read takes, deep_delta.ops.delta.update_and_token_read)."""
        return self.conv_weight * self.read


def _history(x: torch.Tensor, past: torch.Tensor | None, kernel_size: int) -> torch.Tensor | None:
    """The last K-1 inputs along dim 1 (with ``past`` in front, zeros if None): the next ``past``."""
    if kernel_size == 1:
        return None
    need = kernel_size - 1
    if x.shape[1] >= need:
        return x[:, x.shape[1] - need :].detach().clone()  # small; does not keep x alive
    if past is None:
        past = x.new_zeros((x.shape[0], need) + tuple(x.shape[2:]))
    return next_past(torch.cat([past.to(x.dtype), x], dim=1), kernel_size)


def make_compressor(
    kind: str, dim: int, value_channels: int, kernel_size: int | None, backend: str = "auto"
) -> nn.Module:
    if kind == "channel":
        return ChannelCompressor(dim, value_channels, kernel_size, backend=backend)
    if kind == "token":
        return TokenConvCompressor(dim, value_channels, 4 if kernel_size is None else kernel_size, backend=backend)
    raise ValueError(f"compressor must be one of {COMPRESSORS}, got {kind!r}")


class StateExpander(nn.Module):
    """Build X_0: (B, T, d, d_v) from embeddings e: (B, T, d).

    kind="repeat": ``X_0 = e 1^T``. kind="conv" (EC): depthwise causal conv over tokens mapping d to
    d*d_v, identity-initialised so it starts as repetition; decoding passes the last K-1 embeddings.
    """

    def __init__(
        self, dim: int, value_channels: int, kind: str = "repeat", kernel_size: int = 4, backend: str = "auto"
    ):
        super().__init__()
        resolve_backend(backend, torch.device("cpu"))  # validates the name
        self.backend = backend
        if kind not in STATE_INITS:
            raise ValueError(f"StateExpander: `kind` must be one of {STATE_INITS}, got {kind!r}")
        if kernel_size < 1:
            raise ValueError(f"StateExpander: `kernel_size` must be >= 1, got {kernel_size}")
        self.dim, self.value_channels, self.kind = dim, value_channels, kind
        self.kernel_size = kernel_size if kind == "conv" else 1
        if kind == "conv":
            self.weight = nn.Parameter(torch.empty(kernel_size, dim, value_channels))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """EC starts with identity taps: at init it equals repetition."""
        if self.weight is not None:
            identity_taps_(self.weight)

    @property
    def history(self) -> int:
        return self.kernel_size - 1

    def forward(self, e: torch.Tensor, past: torch.Tensor | None = None):
        """e: (B, T, d), past: (B, K-1, d) or None -> (X_0: (B, T, d, d_v), next past or None)."""
        if e.dim() != 3 or e.shape[-1] != self.dim:
            raise ValueError(f"StateExpander: expected embeddings of shape (B, T, {self.dim}), got {tuple(e.shape)}")
        if self.weight is None:
            return e.unsqueeze(-1).expand(*e.shape, self.value_channels).contiguous(), None
        k = self.kernel_size
        if past is not None and tuple(past.shape) != (e.shape[0], k - 1, e.shape[2]):
            raise ValueError(
                f"StateExpander: `past` must have shape {(e.shape[0], k - 1, e.shape[2])}, got {tuple(past.shape)}"
            )
        return embed_conv(e, self.weight, past, backend=self.backend), _history(e, past, k)
