"""The generation caches of the DDL model, and the names transformers gives the cache argument.

Decoding carries two things from step to step: the attention K/V of every layer, and the token history of the
DDL convolutions (EC, TC): the last K-1 inputs of each, which a new token's convolution reads.

- :class:`DDLCache`: the library's ``DynamicCache`` for the K/V plus the token history; what ``generate()`` and
  every forward with ``use_cache=True`` fill. It grows by concatenation and counts its length on the host.
- :class:`DDLStaticCache`: the same things in buffers of fixed shape, for decoding steps that compile once and
  replay as CUDA graphs (:class:`deep_delta.hf.decode.StaticDecoder`).
- The cache argument under the names of each transformers release (:data:`CACHE_NAMES`: ``past_key_values`` up
  to 5.23, ``cache`` from 5.24): the forwards take it under any one of them (:func:`one_cache`), refuse every
  keyword they do not use (:func:`refuse_unknown_kwargs`) and return it under the installed release's name
  (:data:`CACHE_FIELD`, read back by :func:`output_cache`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

# The names of the generation cache in transformers: `past_key_values` up to 5.23; `cache` from 5.24, where
# `past_key_values` (and `cache_params`, the recurrent models' name) are deprecated aliases.
CACHE_NAMES = ("cache", "past_key_values", "cache_params")
# The forwards take the cache under each of its names (CACHE_NAMES; one at a time) and return it under the
# installed release's name (CACHE_FIELD); `output_cache(out)` reads it there.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
# Keywords transformers passes to a forward that we accept when they ask for nothing we would have to do:
# their neutral values. (`cache_position`, passed by generate() before 5.24, is the range of new positions,
# which the model takes from the cache length; it is accepted whatever it holds.)
_NEUTRAL_KWARGS = {"output_attentions": False, "output_hidden_states": False, "output_router_logits": False}


class DDLCache(DynamicCache):
    """Attention K/V (the library's DynamicCache) plus DDL's token history.

    ``token_history[name]`` holds the last K-1 inputs of a token-axis convolution: the embeddings for EC
    ("embed") and the expanded states read by each TC compressor ("<layer>.attn", "<layer>.mlp", "final").
    CC and d_v = 1 carry nothing beyond the K/V. Beam search reorders and selects rows of both.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.token_history: dict[str, torch.Tensor] = {}

    def store_history(self, key: str, history: torch.Tensor) -> None:
        self.token_history[key] = history

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        self._select_history(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        self._select_history(indices)

    def _select_history(self, rows: torch.Tensor) -> None:
        for key, t in self.token_history.items():
            self.token_history[key] = t.index_select(0, rows.to(t.device))

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        for key, t in self.token_history.items():
            self.token_history[key] = t.repeat_interleave(repeats, dim=0)

    def crop(self, max_length: int):
        if self.token_history:
            raise NotImplementedError(
                "DDLCache: cannot crop a cache that holds DDL token history (TC compressors, EC): the states "
                "before the cut are not kept; decoding strategies that roll the cache back (assisted "
                "decoding, prompt lookup) are not supported for these variants"
            )
        super().crop(max_length)

    def reset(self):
        super().reset()
        self.token_history.clear()


class DDLStaticCache:
    """Attention K/V and DDL token history in buffers of fixed shape, for a compiled decoding step.

    :class:`DDLCache` grows its K/V by concatenation and counts its length on the host: every decoding step has
    new shapes and a Python int in it, so a compiled step recompiles and cannot be captured as a graph. This
    cache holds the same things in buffers allocated once:

    - K and V of each layer: (B, heads, max_length, head_dim), allocated at the first write (the prefill, in the
      dtype attention computes in there) and then written in place at the new positions;
    - the number of positions written, ``length``: a 0-d tensor on the device, advanced in place by the model's
      forward (never read on the host inside the forward);
    - the token history of the DDL convolutions (EC, TC): the last K-1 inputs of each, (B, K-1, ...), whose shape
      is fixed anyway; the prefill allocates each buffer, later steps copy into it.

    Every buffer is marked a static address for ``torch.compile``, so that a step compiled with
    ``mode="reduce-overhead"`` may write into it and still run as a CUDA graph. Attention reads all
    ``max_length`` positions with a mask of those written; the unwritten K/V are zeros and are masked out.

    ``DDLStaticCache(config, batch_size, max_length, device=...)``; the first forward through it (the prefill,
    run eagerly) allocates the K/V and history buffers, later ones (the compiled steps) write into them. Host
    checks (the batch size, the room left) belong to the caller, which knows how many tokens it has fed:
    :class:`deep_delta.hf.decode.StaticDecoder` does them. Padded batches are refused (``attention_mask``): the
    cache serves prompts of one length.
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


def output_cache(output) -> DDLCache | None:
    """The cache a forward returned, under the name the installed transformers gives it."""
    return getattr(output, CACHE_FIELD)


def one_cache(where: str, *given: DynamicCache | None) -> DynamicCache | None:
    """The cache passed under one of its names (CACHE_NAMES, in that order); the same object twice is fine."""
    caches = {id(c): c for c in given if c is not None}
    if len(caches) > 1:
        names = ", ".join(f"`{n}`" for n, c in zip(CACHE_NAMES, given) if c is not None)
        raise ValueError(f"{where}: pass the cache once, as `cache`, not under several names ({names})")
    return next(iter(caches.values()), None)


def refuse_unknown_kwargs(where: str, kwargs: dict) -> None:
    """Raise on every keyword the forward does not use: a renamed or misspelt argument (`past_key_value=`, a
    future name of the cache) must not be dropped without a word. Neutral values of the flags transformers
    passes are accepted; asking for what the model does not compute is an error."""
    unknown = []
    for key, value in kwargs.items():
        if key == "cache_position":
            continue
        if key in _NEUTRAL_KWARGS:
            if value not in (None, _NEUTRAL_KWARGS[key]):
                raise ValueError(f"{where}: `{key}={value!r}` is not supported; allowed: None or False")
            continue
        unknown.append(f"`{key}`")
    if unknown:
        raise TypeError(
            f"{where}: unexpected keyword argument(s) {', '.join(unknown)}; the cache is passed as `cache` "
            "(or `past_key_values`, its name before transformers 5.24)"
        )


def cache_to_fill(cache: DynamicCache | None, use_cache: bool) -> DDLCache | DDLStaticCache | None:
    """The cache to fill: the given DDLCache or DDLStaticCache, a new DDLCache for ``use_cache``, or a new one in
    place of the empty DynamicCache that ``generate()`` makes for a model. Any other cache (transformers' static
    or quantized caches, a filled one) is refused: it cannot carry the token history of the DDL convolutions."""
    if use_cache and cache is None:
        cache = DDLCache()
    if cache is None or isinstance(cache, (DDLCache, DDLStaticCache)):
        return cache
    if type(cache) is DynamicCache and cache.get_seq_length() == 0:
        return DDLCache()
    raise ValueError(
        "DDLModel: `cache` must be a DDLCache (attention K/V plus the token history of the DDL convolutions) or "
        f"an empty DynamicCache, got {'a filled ' if cache.get_seq_length() else ''}{type(cache).__name__}; "
        "a static or quantized cache (`cache_implementation=...` in generate) is not supported for this model "
        "(for fixed-shape decoding use deep_delta's DDLStaticCache, through deep_delta.hf.StaticDecoder)"
    )
