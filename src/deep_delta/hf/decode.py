"""Decoding with a fixed-shape cache and one compiled step: what ``generate()`` with our dynamic cache cannot do.

    decoder = StaticDecoder(model, batch_size=8, max_length=1024, compile=True)
    logits = decoder.prefill(input_ids)       # (B, T) prompts of one length -> (B, V), the last position's logits
    logits = decoder.step(next_ids)           # (B,) or (B, 1) -> (B, V)
    ids = decoder.generate(input_ids, 32)     # prefill + 32 greedy steps -> (B, 32) new token ids
    decoder.reset()                           # the next batch of prompts, same buffers, no recompilation
    decoder = shared_decoder(model, 8, 100)   # the decoder kept on the model for (8 rows, 100 positions)

Every step has the same shapes and writes its K/V and token history in place
(:class:`deep_delta.models.ddl.cache.DDLStaticCache`), so ``torch.compile(fullgraph=True)`` traces it
once; on CUDA the default mode is ``"reduce-overhead"``, which replays the step as a CUDA graph (one launch
instead of a few hundred: decoding one token at a time is bound by the host, not the GPU). The prefill runs
eagerly (its length differs from batch to batch). Greedy decoding here equals ``generate()``'s with the
dynamic cache (tests/hf/test_static_decode.py compares the logits of every variant).

Each decoder compiles its own step: its compiled code and its count of recompilations (torch allows
``torch._dynamo.config.recompile_limit``, 8, per code object) belong to it, so any number of decoders can be
made in one process. A decoder is made for one model and shape; code that decodes many times (a server, a
notebook, ``generate_text(..., compile=True)``) should reuse one instead of making one per call:
:func:`shared_decoder` keeps the decoders of a model on the model, one per (rows, length bucket, device,
autocast dtype), and hands the same one back, so the step compiles once per shape, not per call.
"""

from __future__ import annotations

import itertools
import types
from collections import OrderedDict

import torch

from deep_delta.models.ddl.cache import DDLStaticCache

# torch.compile's backend when none is given (tests trace with "eager": the same graph without inductor's code
# generation, which takes tens of seconds on a CPU)
DEFAULT_BACKEND = "inductor"
# decoders :func:`shared_decoder` keeps per model (the least recently used one is dropped beyond this)
SHARED_DECODERS = 4
_step_names = itertools.count()


class StaticDecoder:
    """Prefill and one-token steps of ``model`` (a :class:`DDLForCausalLM`, in eval mode) over a
    :class:`DDLStaticCache` of ``batch_size`` rows and ``max_length`` positions.

    compile: trace the step with ``torch.compile(fullgraph=True)``; ``mode`` (default: ``"reduce-overhead"``
    on CUDA, CUDA graphs; torch's default elsewhere) and ``backend`` (default ``DEFAULT_BACKEND``, inductor) are
    torch.compile's.
    Run the calls under the autocast the model should decode in; the cache's K/V take the dtype attention
    computes in at the first prefill, and a decoder decodes in one dtype.
    """

    def __init__(self, model, batch_size: int, max_length: int, *, compile: bool = False, mode: str | None = None,
                 backend: str | None = None):
        self.model, self.batch_size, self.max_length = model, batch_size, max_length
        self._check_mode()
        self.device = next(model.parameters()).device
        if mode is None and compile and self.device.type == "cuda":
            mode = "reduce-overhead"
        # the modes that replay CUDA graphs (on CUDA)
        self.graphs = compile and self.device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")
        # checks the sizes; its K/V buffers are allocated by the first prefill
        self.cache = DDLStaticCache(model.config, batch_size, max_length, device=self.device)
        self.filled = 0  # positions written, counted on the host (the cache counts them on the device)
        self._step = (torch.compile(_own_step(self), fullgraph=True, mode=mode, backend=backend or DEFAULT_BACKEND)
                      if compile else self._forward_one)

    def _forward_one(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, cache=self.cache, use_cache=True).logits[:, -1]

    def _check_mode(self) -> None:
        if self.model.training:
            raise ValueError("StaticDecoder: the model is in training mode; call `model.eval()` first")

    def _check_tokens(self, ids: torch.Tensor, what: str) -> None:
        """Token ids in [0, vocab_size), checked on the host (one read of the prompt; a step's ids only when
        they are on the CPU, so that decoding on a GPU never waits for a host read)."""
        if ids.device.type != "cpu" and what != "input_ids":
            return
        vocab = self.model.config.vocab_size
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"StaticDecoder: `{what}` holds token ids in [{lo}, {hi}]; allowed: ids in "
                             f"[0, {vocab}) (the model's vocab_size)")

    def _check_ids(self, ids: torch.Tensor, what: str) -> None:
        if ids.dim() != 2 or ids.shape[0] != self.batch_size:
            raise ValueError(f"StaticDecoder: `{what}` must have shape ({self.batch_size}, T), got {tuple(ids.shape)}")
        if self.filled + ids.shape[1] > self.max_length:
            raise ValueError(
                f"StaticDecoder: {self.filled} positions written + {ids.shape[1]} new exceed `max_length` "
                f"{self.max_length}; make the decoder with a larger max_length or call reset()"
            )

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed (B, T) prompt ids (eagerly) into an empty cache; returns the last position's logits (B, V)."""
        self._check_mode()
        if self.filled:
            raise ValueError("StaticDecoder: prefill() needs an empty cache; call reset() first")
        self._check_ids(input_ids, "input_ids")
        if input_ids.shape[1] == 0:
            raise ValueError(f"StaticDecoder: `input_ids` has shape {tuple(input_ids.shape)}, an empty prompt; "
                             "allowed: at least one token per row (start from the end-of-text token)")
        self._check_tokens(input_ids, "input_ids")
        out = self.model(input_ids=input_ids.to(self.device), cache=self.cache, use_cache=True, logits_to_keep=1)
        self.filled = input_ids.shape[1]
        return out.logits[:, -1]

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """One token per row, (B,) or (B, 1); returns its logits (B, V)."""
        if not self.filled:
            raise ValueError("StaticDecoder: step() before prefill(); feed the prompts first")
        ids = ids.reshape(-1, 1) if ids.dim() == 1 else ids
        self._check_ids(ids, "ids")
        if ids.shape[1] != 1:
            raise ValueError(f"StaticDecoder: step() takes one token per row, got {ids.shape[1]}")
        self._check_tokens(ids, "ids")
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits = self._step(ids.to(self.device))
        self.filled += 1
        # a CUDA graph's output is overwritten by its next replay: hand the caller its own copy
        return logits.clone() if self.graphs else logits

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, pick=None,
                 eos_token_id: int | None = None) -> torch.Tensor:
        """Prefill ``input_ids`` (B, T), then up to ``max_new_tokens`` steps: the new ids (B, n). ``pick(logits)
        -> (B,) ids`` chooses each token (default: the argmax); with ``eos_token_id`` decoding stops once every
        row has produced it (a host read per token, as ``generate()`` does)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"StaticDecoder: `max_new_tokens` got {max_new_tokens!r}; allowed: an integer >= 1")
        if input_ids.dim() == 2 and input_ids.shape[1] + max_new_tokens - 1 > self.max_length:
            raise ValueError(
                f"StaticDecoder: a {input_ids.shape[1]}-token prompt and `max_new_tokens` {max_new_tokens} need "
                f"{input_ids.shape[1] + max_new_tokens - 1} positions (the last new token is not fed back), more "
                f"than `max_length` {self.max_length}; make the decoder with a larger max_length or ask for fewer "
                "tokens")
        pick = pick or (lambda logits: logits.argmax(-1))
        self.reset()
        logits = self.prefill(input_ids)
        new = []
        done = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        for i in range(max_new_tokens):
            nxt = pick(logits)
            new.append(nxt)
            if eos_token_id is not None:
                done |= nxt == eos_token_id
                if bool(done.all()):
                    break
            if i + 1 < max_new_tokens:
                logits = self.step(nxt)
        return torch.stack(new, dim=1)

    def reset(self) -> None:
        """Empty the cache (keeping its buffers) for the next batch of prompts."""
        self.cache.reset()
        self.filled = 0


def _own_step(decoder: StaticDecoder):
    """``decoder._forward_one`` with a code object of its own. torch.compile keeps compiled code, and counts
    recompilations against ``recompile_limit``, per code object: with the method's shared code, every decoder
    (its cache is another object, so the guards fail) would be one more recompilation of the same code, and the
    ninth decoder in a process would fail under ``fullgraph=True``. A copy renamed per decoder is compiled,
    counted and freed with its decoder."""
    code = StaticDecoder._forward_one.__code__
    own = code.replace(co_name=f"_decode_step_{next(_step_names)}")
    return types.MethodType(types.FunctionType(own, StaticDecoder._forward_one.__globals__, own.co_name), decoder)


class _Shelf(OrderedDict):
    """The decoders :func:`shared_decoder` keeps on a model (most recently used last). A copy or pickle of the
    model starts with none: a decoder belongs to the model object it was made for."""

    def __deepcopy__(self, memo):
        return _Shelf()

    def __reduce__(self):
        return (_Shelf, ())


def length_bucket(length: int, limit: int) -> int:
    """The positions a shared decoder holds for ``length``: the next power of two (at least 16), at most
    ``limit`` (the model's context). Generations of similar lengths share one decoder and one compilation;
    attention reads at most twice the positions it needs (the extra ones are masked)."""
    return min(max(16, 1 << (length - 1).bit_length()), limit)


def shared_decoder(model, batch_size: int, length: int, *, mode: str | None = None,
                   backend: str | None = None) -> StaticDecoder:
    """A compiled :class:`StaticDecoder` for ``model`` with ``batch_size`` rows and room for ``length``
    positions, kept on the model and handed back to later calls of the same shape: one per (rows,
    :func:`length_bucket` of ``length``, device, autocast dtype, mode, backend); the :data:`SHARED_DECODERS`
    most recently used stay. Reset before it is returned. One caller decodes with it at a time."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"shared_decoder: `length` got {length!r}; allowed: an integer >= 1")
    device = next(model.parameters()).device
    autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    max_length = length_bucket(length, model.config.max_position_embeddings)
    key = (batch_size, max_length, str(device), autocast, mode, backend or DEFAULT_BACKEND)
    shelf = model.__dict__.get("_ddl_decoders")
    if not isinstance(shelf, _Shelf):
        shelf = model.__dict__["_ddl_decoders"] = _Shelf()
    decoder = shelf.pop(key, None)
    if decoder is None:
        decoder = StaticDecoder(model, batch_size, max_length, compile=True, mode=mode, backend=backend)
        while len(shelf) >= SHARED_DECODERS:
            shelf.popitem(last=False)
    shelf[key] = decoder
    decoder.reset()
    return decoder
