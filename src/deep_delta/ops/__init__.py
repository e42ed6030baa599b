"""Functional DDL math, one package per op, each with its backend dispatch in its ``__init__.py``.

- :mod:`deep_delta.ops.delta`: the delta update (eq. 2.5), the Delta Operator (eq. 2.3) and the update fused
  with the next sublayer's CC or TC read;
- :mod:`deep_delta.ops.compress`: the state compressors (CC, TC) and the embedding convolution (EC), with the
  causal short convolution they share (:mod:`deep_delta.ops.compress.shortconv`);
- :mod:`deep_delta.ops.hyper`: the Hyper-Connection (HC / mHC) stream read and write and Sinkhorn-Knopp;
- :mod:`deep_delta.ops.depth`: Attention Residuals' depth attention (a softmax over the earlier outputs);
- :mod:`deep_delta.ops.norm`: a k-Map sublayer's RMSNorm, linear gate and value from one read of its source row
  (the update fused with the next sublayer's, ``update_and_norm``, is :mod:`deep_delta.ops.delta`'s: every update
  fused with what follows lives there).

Each package holds the plain references (``naive.py``), the lean PyTorch path (``lean.py``,
``backend="torch"``) and the Triton kernels (``triton*.py``). :mod:`deep_delta.ops.backend` resolves the
``backend`` name for all of them (:func:`resolve_backend`), the compute dtype and the one registration of a custom
op; :mod:`deep_delta.ops.launch` is the one launch point of the kernels and their shared launch geometry. This module only re-exports the public entry points.
"""

from __future__ import annotations

from deep_delta.ops.backend import BACKENDS, resolve_backend
from deep_delta.ops.compress import channel_compress, embed_conv, token_compress
from deep_delta.ops.delta import (
    delta_operator,
    delta_update,
    untied_update,
    update_and_channel_read,
    update_and_norm,
    update_and_token_read,
    write_update,
)
from deep_delta.ops.depth import depth_attention
from deep_delta.ops.hyper import sinkhorn_knopp, stream_read, stream_write
from deep_delta.ops.norm import norm_gate_value

__all__ = [
    "BACKENDS",
    "channel_compress",
    "delta_operator",
    "delta_update",
    "depth_attention",
    "embed_conv",
    "norm_gate_value",
    "resolve_backend",
    "sinkhorn_knopp",
    "stream_read",
    "stream_write",
    "token_compress",
    "update_and_channel_read",
    "update_and_norm",
    "update_and_token_read",
    "untied_update",
    "write_update",
]
