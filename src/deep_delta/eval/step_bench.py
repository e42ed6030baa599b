"""The measured training step of the benchmarks, and the memory it needs.

:class:`StepSubject` holds one variant's model (fp32 weights), its AdamW (built as ``ddl train`` builds
it: :func:`deep_delta.train.optim.build_optimizer` with the :class:`~deep_delta.train.config.TrainConfig`
defaults, fused on CUDA) and a fixed random batch; :meth:`StepSubject.train_step` is
:class:`deep_delta.train.step.OptimizerStep`, the step the trainer runs (forward + backward under the
training autocast, gradient clipping at the training default 1.0, AdamW, zero_grad). ``ddl bench`` and
``ddl bench-kernels`` both time that method.

Memory:

- :meth:`StepSubject.peak_train_memory`: the variant's own persistent tensors (weights, AdamW state) plus
  the highest transient allocation during one step (activations, gradients: the step ends with
  ``zero_grad(set_to_none=True)``, as in training): on CUDA from
  ``torch.cuda.max_memory_allocated`` relative to the allocation before the step; on CPU from torch's
  profiler (``profile_memory=True``): the running sum of its allocation and free events
  (:func:`cpu_transient_peak`). Other models in the process do not count.
- :func:`saved_activation_bytes`: what autograd keeps for backward after one forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from deep_delta.eval.settings import check_dtype
from deep_delta.eval.timing import autocast_for, check_int


class StepSubject:
    """One variant ready to train: model, optimizer, a (batch_size, seq_len) batch and the autocast context, the
    step built as the trainer builds it (:func:`deep_delta.train.step.build_step`) with the trainer's defaults
    and ``train`` (TrainConfig fields: e.g. a run's ``compile``, ``cuda_graphs``, ``activation_checkpointing``,
    ``grad_clip``, lr and betas). ``compile`` / ``cuda_graphs``: as ``ddl train --set compile=true`` /
    ``cuda_graphs=...``."""

    def __init__(self, variant: str, preset: str = "tiny", *, batch_size: int, seq_len: int,
                 device: torch.device | str = "cpu", dtype: str = "float32", overrides: dict | None = None,
                 seed: int = 0, compile: bool = False, cuda_graphs: str = "off", train: dict | None = None):
        from deep_delta.models import DDLConfig, DDLForCausalLM
        from deep_delta.train.config import TrainConfig
        from deep_delta.train.distributed import DistInfo
        from deep_delta.train.step import build_step

        check_int("batch_size", batch_size, 1)
        check_int("seq_len", seq_len, 1)
        check_dtype(dtype)
        device = torch.device(device)
        self.variant, self.device, self.dtype = variant, device, dtype
        self.batch_size, self.seq_len = batch_size, seq_len
        torch.manual_seed(seed)
        cfg = DDLConfig.from_variant(variant, preset, **(overrides or {}))
        self.model = DDLForCausalLM(cfg).to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        settings = {**(train or {}), "compile": bool(compile) or bool((train or {}).get("compile")),
                    "cuda_graphs": cuda_graphs if cuda_graphs != "off" else (train or {}).get("cuda_graphs", "off")}
        run = TrainConfig(variant=variant, preset=preset, batch_size=batch_size, seq_len=seq_len, seed=seed,
                          device=str(device), dtype=dtype if dtype != "float16" else "float32", **settings)
        self.compiled, self.cuda_graphs = run.compile, run.cuda_graphs
        self.activation_checkpointing = run.activation_checkpointing
        self.grad_clip = run.grad_clip
        self.autocast = autocast_for(dtype, device)
        self.info = DistInfo(device=device)
        built = build_step(self.model, run, self.info, autocast=self.autocast)
        self.opt, self.step = built.optimizer, built.step
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), generator=g).to(device)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]

    def train_step(self) -> None:
        """One optimizer step on the batch: the trainer's :class:`~deep_delta.train.step.OptimizerStep`."""
        self.model.train()
        self.step([(self.x, self.y)])

    def persistent_bytes(self) -> int:
        """Bytes of the weights, the gradients held (none between steps) and the optimizer state (each storage
        once)."""
        params = list(self.model.parameters())
        tensors = params + [p.grad for p in params if p.grad is not None]
        for state in self.opt.state.values():
            tensors += [t for t in state.values() if torch.is_tensor(t)]
        return _storage_bytes(tensors)

    def peak_train_memory(self) -> int:
        """Peak bytes of one training step (see the module docstring for the method per device)."""
        self.train_step()  # optimizer state exists from here on
        base = self.persistent_bytes()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.train_step()
            torch.cuda.synchronize(self.device)
            return base + torch.cuda.max_memory_allocated(self.device) - before
        return base + cpu_transient_peak(self.train_step)

    def saved_activation_bytes(self, recompute_states: bool = False) -> int:
        """:func:`saved_activation_bytes` of the batch under the training autocast, with ``recompute_states``
        set for the measurement (restored afterwards)."""
        inner = self.model.model
        old = inner.recompute_states
        inner.recompute_states = recompute_states
        try:
            return saved_activation_bytes(self.model, self.x, self.y, autocast=self.autocast)
        finally:
            inner.recompute_states = old


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def cpu_transient_peak(fn: Callable[[], None]) -> int:
    """Highest net CPU tensor allocation (bytes) while ``fn`` runs, from torch's profiler memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = best = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        # "[memory]" events are allocations/frees outside any op; an op's own (self) net allocation otherwise
        cur += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        best = max(best, cur)
    return best


def saved_activation_bytes(model, ids, tgt, *, autocast=None) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward (storage-deduplicated,
    parameters excluded), measured with saved-tensor hooks; with ``model.model.recompute_states`` the
    handles of the state tape count their frontier state and small rebuild tensors. The graph is then freed
    (no backward runs). ``autocast``: the context the forward runs in (none: plain fp32); the
    weights' low-precision copies autocast keeps for backward count as saved tensors.
    """
    import contextlib

    from deep_delta.ops.delta.recompute import kept_tensors, observe

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: list = []
    with observe(kept), torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        with autocast if autocast is not None else contextlib.nullcontext():
            loss = model(ids, shift_labels=tgt).loss
    storages = {}
    for obj in kept:
        for t in kept_tensors(obj):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                storages[st.data_ptr()] = st.nbytes()
    del loss  # the graph is freed with the last reference to it; nothing was accumulated into .grad
    return sum(storages.values())
