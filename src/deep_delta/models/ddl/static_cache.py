"""A generation cache of fixed shapes, for decoding steps that compile once and replay as CUDA graphs.

:class:`DDLCache` (a transformers ``DynamicCache``) grows its K/V by concatenation and counts its length on the
host: every decoding step has new shapes and a Python int in it, so a compiled step recompiles and cannot be
captured as a graph. :class:`DDLStaticCache` holds the same things in buffers allocated once:

- K and V of each layer: (B, heads, max_length, head_dim), allocated at the first write (the prefill, in the
  dtype attention computes in there) and then written in place at the new positions;
- the number of positions written, ``length``: a 0-d tensor on the device, advanced in place by the model's
  forward (never read on the host inside the forward);
- the token history of the DDL convolutions (EC, TC): the last K-1 inputs of each, (B, K-1, ...), whose shape is
  fixed anyway; the prefill allocates each buffer, later steps copy into it.

Every buffer is marked a static address for ``torch.compile``, so that a step compiled with
``mode="reduce-overhead"`` may write into it and still run as a CUDA graph. Attention reads all ``max_length``
positions with a mask of those written; the unwritten K/V are zeros and are masked out.

Host checks (the batch size, the room left) belong to the caller, which knows how many tokens it has fed:
:class:`deep_delta.hf.decode.StaticDecoder` does them. Padded batches are refused (``attention_mask``): the
cache serves prompts of one length.
"""

from __future__ import annotations

import torch


class DDLStaticCache:
    """Attention K/V and DDL token history in buffers of fixed shape (see the module docstring).

    ``DDLStaticCache(config, batch_size, max_length, device=...)``; the first forward through it (the prefill,
    run eagerly) allocates the K/V and history buffers, later ones (the compiled steps) write into them.
    """

    def __init__(self, config, batch_size: int, max_length: int, *, device: torch.device | str):
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DDLStaticCache: `{name}` got {value!r}; allowed: an integer >= 1")
        if max_length > config.max_position_embeddings:
            raise ValueError(
                f"DDLStaticCache: `max_length` got {max_length}; allowed: at most the model's "
                f"max_position_embeddings ({config.max_position_embeddings})"
            )
        self.batch_size, self.max_length = batch_size, max_length
        self.keys: list[torch.Tensor | None] = [None] * config.num_hidden_layers
        self.values: list[torch.Tensor | None] = [None] * config.num_hidden_layers
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.token_history: dict[str, torch.Tensor] = {}
        torch._dynamo.mark_static_address(self.length)

    def positions(self, t: int) -> torch.Tensor:
        """The positions of ``t`` new tokens: (t,) on the device, from the written length."""
        return self.length + torch.arange(t, device=self.length.device)

    def attention_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """(1, 1, t, max_length) boolean: query at position p sees the keys at positions <= p."""
        keys = torch.arange(self.max_length, device=positions.device)
        return (keys[None, :] <= positions[:, None])[None, None]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, heads, t, head_dim) K and V at the next t positions; returns the whole buffers."""
        if self.keys[layer_idx] is None:
            shape = (*k.shape[:2], self.max_length, k.shape[3])
            for store, new in ((self.keys, k), (self.values, v)):
                store[layer_idx] = torch.zeros(shape, device=new.device, dtype=new.dtype)
                torch._dynamo.mark_static_address(store[layer_idx])
        at = self.positions(k.shape[2])
        self.keys[layer_idx].index_copy_(2, at, k)
        self.values[layer_idx].index_copy_(2, at, v)
        return self.keys[layer_idx], self.values[layer_idx]

    def store_history(self, key: str, history: torch.Tensor) -> None:
        """Keep a convolution's next history: the first time in a new buffer (the prefill), then in place."""
        buffer = self.token_history.get(key)
        if buffer is None:
            buffer = self.token_history[key] = history.clone()
            torch._dynamo.mark_static_address(buffer)
        else:
            buffer.copy_(history)

    def advance(self, t: int) -> None:
        """Count ``t`` more positions as written (the model's forward calls this once, after every layer)."""
        self.length.add_(t)

    def reset(self) -> None:
        """Empty the cache for a new batch of prompts, keeping its buffers (and their addresses): a zero history
        is what a convolution reads before the first token."""
        self.length.zero_()
        for t in (*self.keys, *self.values, *self.token_history.values()):
            if t is not None:
                t.zero_()
