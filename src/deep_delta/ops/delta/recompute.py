"""Reversible state storage: keep only the last (d, d_v) state of a chain of delta updates for backward.

Autograd keeps every state a backward pass needs: the update saves its input x, the compressors save
the state they read. Each state is stored once (the saving ops share its storage), so a model with
2L sublayers keeps 2L + 1 states. The update is invertible given the small per-token ``delta`` it
computed,

    x' = x + u delta^T,   delta = beta (v - u^T x)   =>   x = x' - u delta^T,

so inside :class:`StateTape` a saved state is replaced by a handle that rebuilds it in backward from the
next state: only the last state of the chain (and k, v, beta, delta, which are small or saved anyway) is
kept. Backward walks the chain from the end, each rebuilt state is cached until its own users and the
rebuild of the previous state have used it, so about two states are alive at a time.

Precision: the rebuilt x differs from the forward's x by the rounding of ``x' - u delta^T`` (one
rounding per sublayer, accumulating along the chain): fp32 ~1e-7 relative per sublayer; bf16 ~2^-9 per
sublayer, i.e. up to about 1e-2 relative after 24 sublayers. Only the gradients see it (the forward is
unchanged), and the gradient terms that multiply x (grad of k, and of the compressor weights).

Usage (the model does this when ``DDLModel.recompute_states`` is True)::

    with StateTape() as tape:
        tape.register(x0)            # optional: the first state, so its readers do not keep it
        ... delta updates (lean or Triton backend) ...
    torch.autograd.grad(loss, params)  # or the trainer's step: the rebuild runs in backward
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from deep_delta.ops.delta.naive import unit_direction

_ACTIVE = threading.local()


def active_tape() -> StateTape | None:
    """The StateTape of the current thread's forward pass, or None."""
    return getattr(_ACTIVE, "tape", None)


def _whole_storage(t: torch.Tensor) -> bool:
    s = t.untyped_storage()
    return t.is_contiguous() and t.storage_offset() == 0 and t.numel() * t.element_size() == s.nbytes()


class _Node:
    """One state: held as a tensor (the frontier), or rebuilt from the next state by ``rebuild``."""

    __slots__ = ("numel", "dtype", "tensor", "cache", "next", "rebuild", "users", "needed_by_prev")

    def __init__(self, t: torch.Tensor):
        self.numel, self.dtype = t.numel(), t.dtype  # resolve() may return another view
        self.tensor: torch.Tensor | None = t
        self.cache: torch.Tensor | None = None
        self.next: _Node | None = None
        self.rebuild: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.users = 0  # saved handles not yet unpacked
        self.needed_by_prev = False  # another node rebuilds from this one and has not done so yet

    def resolve(self) -> torch.Tensor:
        if self.tensor is not None:
            return self.tensor
        if self.cache is not None:
            return self.cache
        nxt = self.next
        out = self.rebuild(nxt.resolve())
        nxt.needed_by_prev = False
        nxt._maybe_release()
        self.cache = out
        return out

    def _maybe_release(self) -> None:
        if self.users <= 0 and not self.needed_by_prev:
            self.cache = None


class _Handle:
    __slots__ = ("node", "shape", "stride", "offset")

    def __init__(self, node: _Node, t: torch.Tensor):
        self.node, self.shape, self.stride, self.offset = node, tuple(t.shape), t.stride(), t.storage_offset()
        node.users += 1

    def unpack(self) -> torch.Tensor:
        node = self.node
        base = node.resolve()
        out = base.as_strided(self.shape, self.stride, self.offset)
        node.users -= 1
        node._maybe_release()
        return out


class StateTape:
    """Context manager: states produced by delta updates are saved for backward as rebuildable handles.

    Not for ``torch.compile`` (saved-tensor hooks are not traced; the model switches the tape off while
    compiling) and not for double backward. A second backward with ``retain_graph=True`` works (states
    are rebuilt again from the last one).
    """

    def __init__(self):
        self._frontier: dict[int, _Node] = {}  # storage ptr -> node still held as a tensor
        self._pending: list[_Node] = []  # consumed during the current op; drop their tensor at the next
        self._hooks = None

    def __enter__(self) -> StateTape:
        if active_tape() is not None:
            raise RuntimeError("StateTape: a tape is already active in this thread (tapes do not nest)")
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        _ACTIVE.tape = self
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.tape = None
        self._hooks.__exit__(*exc)
        self._flush()
        self._frontier.clear()

    def register(self, t: torch.Tensor) -> None:
        """Track a state that no update produced (e.g. the first one) so that its readers save a handle."""
        if _whole_storage(t):
            self._frontier.setdefault(t.untyped_storage().data_ptr(), _Node(t))

    def record(self, x: torch.Tensor, out: torch.Tensor, rebuild: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """An update turned state ``x`` into ``out``; ``rebuild(out) -> x`` (both of x's shape and layout).

        ``rebuild`` must not hold x. Called inside the update's forward, before its saved tensors are packed.
        """
        self._flush()
        if not (_whole_storage(x) and _whole_storage(out)) or x.shape != out.shape or x.dtype != out.dtype:
            return
        ptr = x.untyped_storage().data_ptr()
        node = self._frontier.get(ptr)
        if node is None or node.dtype != x.dtype or node.numel != x.numel():
            node = _Node(x)
            self._frontier[ptr] = node
        nxt = _Node(out)
        self._frontier[out.untyped_storage().data_ptr()] = nxt
        node.next, node.rebuild = nxt, rebuild
        nxt.needed_by_prev = True
        self._pending.append(node)  # x is packed by this very op after its forward: drop it afterwards

    def _flush(self) -> None:
        for node in self._pending:
            node.tensor = None
            for ptr, n in list(self._frontier.items()):
                if n is node:
                    del self._frontier[ptr]
        self._pending.clear()

    def _pack(self, t: torch.Tensor):
        if not self._frontier or t.layout != torch.strided:
            for kept in _OBSERVER:
                kept.append(t)
            return t
        node = self._frontier.get(t.untyped_storage().data_ptr())
        out = t if node is None or node.dtype != t.dtype else _Handle(node, t)
        for kept in _OBSERVER:
            kept.append(out)
        return out

    @staticmethod
    def _unpack(obj):
        return obj.unpack() if isinstance(obj, _Handle) else obj


class _DeltaRebuild:
    """``out -> out - u delta^T`` for a flattened update (out: (N, d, d_v), k: (N, d), delta: (N, d_v)).

    u is recomputed from k by :func:`deep_delta.ops.delta.naive.unit_direction`, as the forward computed it.
    Holds k (saved by the update anyway) and delta (N, d_v) in fp32: the only extra memory of the tape.
    """

    __slots__ = ("k", "delta", "k_eps")

    def __init__(self, k: torch.Tensor, delta: torch.Tensor, k_eps: float):
        self.k, self.delta, self.k_eps = k, delta, k_eps

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        k, delta = self.k, self.delta
        d = k.shape[-1]
        u, _ = unit_direction(k, self.k_eps, delta.dtype)  # bit for bit the forward's u
        o = out.reshape(k.shape[0], d, delta.shape[-1])
        x = torch.addcmul(o, u.to(o.dtype).unsqueeze(-1), delta.to(o.dtype).unsqueeze(1), value=-1)
        return x.view(out.shape)


def delta_rebuild(k: torch.Tensor, delta: torch.Tensor, k_eps: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The rebuild function of one update; see :class:`_DeltaRebuild`."""
    return _DeltaRebuild(k, delta, k_eps)


def kept_tensors(obj) -> list[torch.Tensor]:
    """Tensors that a packed object keeps alive: the tensor itself, or a handle's frontier state and the
    small tensors of its rebuild (for memory accounting; see :func:`observe`)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, _Handle):
        node, out = obj.node, []
        if node.tensor is not None:
            out.append(node.tensor)
        if isinstance(node.rebuild, _DeltaRebuild):
            out += [node.rebuild.k, node.rebuild.delta]
        return out
    return []


_OBSERVER: list = []


class observe:
    """Context manager for memory accounting: every object a StateTape packs is appended to ``kept``.

    (Saved-tensor hooks do not nest: inside the model's tape an outer hook sees nothing.)
    """

    def __init__(self, kept: list):
        self.kept = kept

    def __enter__(self):
        _OBSERVER.append(self.kept)
        return self.kept

    def __exit__(self, *exc):
        _OBSERVER.remove(self.kept)
