"""The optimizers: AdamW with weight decay on matrices only, or Muon on the hidden matrices with AdamW on the
rest (:class:`MuonWithAdamW`); the warm-up + cosine learning-rate schedule.

``build_optimizer`` is the one place a run's optimizer is made (``train/step.py::build_step`` calls it for the
trainer, ``ddl bench`` and ``ddl compare``'s step times); :func:`optimizer_record` is what run.json says of it.
"""

from __future__ import annotations

import math
from collections import ChainMap
from typing import Any

import torch
from torch import nn

# Muon as Keller Jordan's and Moonlight's recipes run it: momentum 0.95 with Nesterov, and (Moonlight) the update
# scaled by 0.2 sqrt(max(A, B)) to AdamW's RMS, so that AdamW's lr and weight decay serve it unchanged
MUON_MOMENTUM = 0.95
MUON_ADJUST_LR = "match_rms_adamw"


def param_groups(model: nn.Module, weight_decay: float, lr: float | None = None, *,
                 exclude: frozenset[str] | set[str] = frozenset()) -> list[dict]:
    """AdamW groups: parameters with dim >= 2 (matrices, embeddings, conv taps) decay; vectors (norm gains,
    biases, gate and compressor vectors) do not. Tied parameters appear once; those named in ``exclude`` (what
    Muon trains) not at all.

    A model with ``lr_multipliers()`` (a DDL model under muP, docs/mup.md) adds one group per other
    multiplier ``r``: learning rate ``lr * r`` and weight decay ``weight_decay / r``, so that AdamW's
    per-step shrink ``lr * weight_decay`` stays the same. Without such parameters (every "sp" model) these
    are the two groups ``[decay, no decay]``, in this order; the first group always has the base rate.
    A user's own loop: ``torch.optim.AdamW(param_groups(model, wd, lr), lr=lr)``.
    """
    multipliers = model.lr_multipliers() if hasattr(model, "lr_multipliers") else {}
    if multipliers and lr is None:
        raise ValueError("param_groups: `lr` is needed for a model with per-parameter learning-rate multipliers")
    groups: dict[tuple[bool, float], list] = {(True, 1.0): [], (False, 1.0): []}
    for name, p in model.named_parameters():  # yields a tied tensor once
        if p.requires_grad and name not in exclude:
            groups.setdefault((p.dim() >= 2, multipliers.get(name, 1.0)), []).append(p)
    out = []
    for (decay, r), params in groups.items():
        if r == 1.0:
            out.append({"params": params, "weight_decay": weight_decay if decay else 0.0})
        elif params:
            out.append({"params": params, "weight_decay": weight_decay / r if decay else 0.0, "lr": lr * r})
    return out


def muon_lr_multipliers(model: nn.Module) -> dict[str, float]:
    """The tensors Muon trains, by name, each with its learning-rate multiplier: the model's own choice
    (``model.muon_lr_multipliers()``: a DDL model's hidden matrices, the 2-D weights of its attention and MLP
    sublayers, 1/sqrt(m) under muP), or for a model without that method every 2-D parameter but the embeddings
    (``nn.Embedding`` weights, and the output embeddings a transformers model names with
    ``get_output_embeddings()``), at multiplier 1. A tied tensor appears once, under its first name."""
    if hasattr(model, "muon_lr_multipliers"):
        return dict(model.muon_lr_multipliers())
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        embeddings.add(id(head.weight))
    return {name: 1.0 for name, p in model.named_parameters()
            if p.requires_grad and p.dim() == 2 and id(p) not in embeddings}


def muon_param_groups(model: nn.Module, weight_decay: float, lr: float) -> list[dict]:
    """Muon's groups (:func:`muon_lr_multipliers`): one per multiplier ``r``, learning rate ``lr * r`` and weight
    decay ``weight_decay / r`` (Muon shrinks a weight by its group's ``lr * weight_decay`` a step, which then does
    not change with ``r``, as for AdamW's muP groups)."""
    params = dict(model.named_parameters())
    groups: dict[float, list] = {}
    for name, r in muon_lr_multipliers(model).items():
        if params[name].requires_grad:
            groups.setdefault(r, []).append(params[name])
    return [{"params": ps, "lr": lr * r, "weight_decay": weight_decay / r} for r, ps in groups.items()]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                    fused: bool | None = None, *, optimizer: str = "adamw",
                    adamw_lr_ratio: float = 1.0) -> torch.optim.Optimizer | MuonWithAdamW:
    """The run's optimizer (``TrainConfig.optimizer``): "adamw", AdamW over :func:`param_groups`; "muon",
    :class:`MuonWithAdamW`: ``torch.optim.Muon`` (momentum 0.95, Nesterov, ``weight_decay``, the update scaled to
    AdamW's RMS) over :func:`muon_param_groups` at ``lr``, and AdamW over the other parameters at
    ``lr * adamw_lr_ratio`` (their muP multipliers kept). Every group records its base rate as ``initial_lr``,
    which the schedule scales (:func:`set_learning_rate`)."""
    if optimizer == "adamw":
        if adamw_lr_ratio != 1.0:
            raise ValueError(f"build_optimizer: `adamw_lr_ratio` got {adamw_lr_ratio!r}; allowed: 1.0 unless "
                             "`optimizer` is muon")
        built = torch.optim.AdamW(param_groups(model, weight_decay, lr), lr=lr, betas=betas, fused=fused)
    elif optimizer == "muon":
        muon_groups = muon_param_groups(model, weight_decay, lr)
        adamw_lr = lr * adamw_lr_ratio
        # no empty group: the distributed state dict (checkpoints) takes none beside a second optimizer
        adamw_groups = [g for g in param_groups(model, weight_decay, adamw_lr,
                                                exclude={n for n in muon_lr_multipliers(model)}) if g["params"]]
        built = MuonWithAdamW(
            torch.optim.Muon(muon_groups, lr=lr, weight_decay=weight_decay, momentum=MUON_MOMENTUM, nesterov=True,
                             adjust_lr_fn=MUON_ADJUST_LR) if muon_groups else None,
            torch.optim.AdamW(adamw_groups, lr=adamw_lr, betas=betas, fused=fused) if adamw_groups else None,
            lr=lr)
    else:
        raise ValueError(f"build_optimizer: `optimizer` got {optimizer!r}; allowed: adamw | muon")
    for group in built.param_groups:
        group["initial_lr"] = group["lr"]  # the group's base rate the schedule scales (set_learning_rate)
    return built


class MuonWithAdamW:
    """``torch.optim.Muon`` and ``torch.optim.AdamW`` over disjoint parameters, stepped as one optimizer: what the
    step, the schedule and the checkpoints use of an optimizer (``param_groups``, Muon's first, ``state``,
    ``step``, ``zero_grad``, ``state_dict``, ``load_state_dict``, ``defaults["lr"]``: the base rate, Muon's).
    ``optimizers``: the torch optimizers (either may be absent when it has no parameters), which the checkpoints'
    distributed state dict takes as a list (``train/distributed.py``)."""

    def __init__(self, muon: torch.optim.Muon | None, adamw: torch.optim.AdamW | None, *, lr: float):
        self.muon, self.adamw = muon, adamw
        self.optimizers = [o for o in (muon, adamw) if o is not None]
        if not self.optimizers:
            raise ValueError("MuonWithAdamW: no parameters to train; allowed: a model with trainable parameters")
        self.defaults = {"lr": lr}

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> ChainMap:
        return ChainMap(*(o.state for o in self.optimizers))

    @torch.no_grad()
    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """``{"muon": ..., "adamw": ...}``: each optimizer's own state dict (absent ones omitted)."""
        return {name: o.state_dict() for name, o in (("muon", self.muon), ("adamw", self.adamw)) if o is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = {name for name, o in (("muon", self.muon), ("adamw", self.adamw)) if o is not None}
        if set(state) != mine:
            raise ValueError(f"MuonWithAdamW: the state holds {sorted(state)}; allowed: the states of {sorted(mine)}")
        for name in mine:
            getattr(self, name).load_state_dict(state[name])


def optimizer_record(optimizer: torch.optim.Optimizer | MuonWithAdamW, model: nn.Module, name: str) -> dict[str, Any]:
    """What run.json records of a run's optimizer: its ``name`` (``TrainConfig.optimizer``) and every group, in
    order: which torch optimizer steps it, its base learning rate and weight decay, and the names of its tensors
    (a tied tensor under its first name)."""
    names = {id(p): n for n, p in model.named_parameters()}
    parts = optimizer.optimizers if isinstance(optimizer, MuonWithAdamW) else [optimizer]
    return {"name": name, "groups": [
        {"optimizer": type(o).__name__.lower(), "lr": g.get("initial_lr", g["lr"]), "weight_decay": g["weight_decay"],
         "params": [names[id(p)] for p in g["params"]]}
        for o in parts for g in o.param_groups]}


class WarmupCosine:
    """Multiplier of the base learning rate after ``step`` optimizer steps.

    Linear warm-up ``(step + 1) / warmup`` for ``step < warmup``, then cosine from 1 down to ``min_ratio`` at
    ``total``; ``min_ratio`` beyond. A plain object (numbers only) so its state pickles without code.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if step >= self.total:
            return self.min_ratio
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer | MuonWithAdamW, factor: float) -> float:
    """Set every group's learning rate to its base rate (``initial_lr``, recorded on first use) times
    ``factor``; returns the optimizer's base rate (``defaults["lr"]``: the run's ``lr``, Muon's under muon) times
    ``factor``, what a run logs. The schedule is a pure function of the step, so a resumed run needs nothing but
    the step to continue it."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor
    return optimizer.defaults["lr"] * factor
