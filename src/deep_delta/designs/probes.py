"""What ``ddl analyze`` reports of a model: the probes' common interface and the probes every design can use.

A probe finds its modules in a model, watches them with forward hooks while a sample of token windows runs through
the unchanged model, and turns what it saw into report sections, a Markdown table and figures. A residual design
names its probes (``ResidualDesign.probes``); :mod:`deep_delta.experiments.analyze` runs the backbone's
(:class:`EmbeddingProbe`) and the model's design's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from deep_delta.fsutil import save_figure
from deep_delta.layers.additive import AdditiveResidual
from deep_delta.layers.delta_residual import DeltaResidual


def first(out):
    return out[0] if isinstance(out, tuple) else out


def stats(x: torch.Tensor) -> dict[str, float]:
    x = x.flatten().double()
    return {"mean": float(x.mean()), "sd": float(x.std()) if x.numel() > 1 else 0.0, "min": float(x.min()),
            "max": float(x.max())}


def fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def short(name: str) -> str:
    return name.removeprefix("model.")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Probe:
    """What one kind of residual module reports. A subclass sets ``name`` (its key in ``report["probes"]``) and
    ``watched`` (the class of the modules it reports on, narrowed by ``reports_on``: :meth:`find`), and
    implements ``__init__`` (attach hooks), ``close`` (detach them and undo any change), ``sections`` (the report's
    entries it owns), and the static ``format`` / ``plot`` of a finished report."""

    name = ""
    watched: type[torch.nn.Module] | tuple[type[torch.nn.Module], ...] = torch.nn.Module  # the kinds it reports on

    @classmethod
    def find(cls, model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
        """The probe's modules in ``model`` (named): every ``watched`` one the probe ``reports_on``."""
        return [(n, m) for n, m in model.named_modules() if isinstance(m, cls.watched) and cls.reports_on(m)]

    @staticmethod
    def reports_on(module: torch.nn.Module) -> bool:
        return True

    def __init__(self, model: torch.nn.Module, modules: list[tuple[str, torch.nn.Module]]):
        self.model, self.modules = model, modules
        self.handles: list = []

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def sections(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def format(report: dict[str, Any]) -> str:
        raise NotImplementedError

    @staticmethod
    def plot(report: dict[str, Any], out: Path) -> list[Path]:
        raise NotImplementedError



class StateProbe(Probe):
    """The residual state through the depth, for the designs whose state is one tensor updated in place (the
    additive baseline and Peri-LN, DDL and its rules): per sublayer the state's mean norm per token entering and
    leaving it and the update's (``|X' - X|``, and relative to ``|X|``), so that the variants' states can be set
    side by side."""

    name, watched = "state", (AdditiveResidual, DeltaResidual)

    def __init__(self, model, modules):
        super().__init__(model, modules)
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for name, m in modules:
            self.handles.append(m.register_forward_hook(self._hook(self.sums[name], getattr(m, "value_channels", 1))))

    @staticmethod
    def _hook(acc: dict[str, float], dv: int):
        def hook(mod, args, out):
            x, new = args[0].detach().double(), first(out).detach().double()
            per = (lambda t: t.flatten(-1 if dv == 1 else -2).norm(dim=-1))  # noqa: E731  (per token)
            before, after, update = per(x), per(new), per(new - x)
            acc["tokens"] += before.numel()
            acc["before"] += float(before.sum())
            acc["after"] += float(after.sum())
            acc["update"] += float(update.sum())
            acc["relative"] += float((update / before.clamp_min(1e-30)).sum())
        return hook

    def sections(self):
        out = {}
        for name, _ in self.modules:
            a = self.sums[name]
            n = max(1.0, a["tokens"])
            out[name] = {"norm_before": a["before"] / n, "norm_after": a["after"] / n, "update_norm": a["update"] / n,
                         "update_relative": a["relative"] / n}
        return {"states": out}

    @staticmethod
    def format(report):
        lines = ["| sublayer | state norm entering | state norm leaving | update norm | update / state |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        for name, r in report["states"].items():
            lines.append(f"| {short(name)} | {fmt(r['norm_before'])} | {fmt(r['norm_after'])} "
                         f"| {fmt(r['update_norm'])} | {fmt(r['update_relative'])} |")
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """The state's norm through the depth (entering each sublayer, then leaving the last)."""
        plt = pyplot()
        names = list(report["states"])
        norms = [report["states"][n]["norm_before"] for n in names] + [report["states"][names[-1]]["norm_after"]]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(norms) + 2), 3.5))
        ax.plot(range(len(norms)), norms, "o-")
        ax.set_xticks(range(len(norms)), [short(n) for n in names] + ["out"], rotation=60, fontsize=7)
        ax.set_ylabel("mean state norm per token")
        ax.set_title(f"the residual state through the depth ({report.get('variant') or 'model'})")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        return [save_figure(fig, out / "state_norms.png", dpi=120)]


class EmbeddingProbe(Probe):
    """What enters the residual stream, for every model: the embedding's mean norm per token and, with the
    embedding norm (``embed_norm``), the normed embedding's, beside the first sublayer's write (its update norm,
    from the state probe): at std 0.02 the embedding enters at ~0.02 sqrt(d), far below a sublayer's write."""

    name, watched = "embedding", torch.nn.Embedding

    @classmethod
    def find(cls, model):
        backbone = getattr(model, "model", model)
        embed = getattr(backbone, "embed_tokens", None)
        if not isinstance(embed, torch.nn.Embedding):
            return []
        norm = getattr(backbone, "embed_norm", None)
        return [("embed_tokens", embed)] + ([("embed_norm", norm)] if norm is not None else [])

    def __init__(self, model, modules):
        super().__init__(model, modules)
        self.sums: dict[str, list[float]] = {name: [0.0, 0.0] for name, _ in modules}
        for name, m in modules:
            self.handles.append(m.register_forward_hook(self._hook(self.sums[name])))

    @staticmethod
    def _hook(acc: list[float]):
        def hook(mod, args, out):
            norms = out.detach().double().norm(dim=-1)
            acc[0] += float(norms.sum())
            acc[1] += norms.numel()
        return hook

    def sections(self):
        return {"embedding": {name: a[0] / max(1.0, a[1]) for name, a in self.sums.items()}}

    @staticmethod
    def format(report):
        found = report["embedding"]
        cells = [f"embedding {fmt(found['embed_tokens'])}"]
        if "embed_norm" in found:
            cells.append(f"after the embedding norm {fmt(found['embed_norm'])}")
        return "What enters the residual stream (mean norm per token): " + "; ".join(cells) + "."

    @staticmethod
    def plot(report, out):
        return []


__all__ = ["EmbeddingProbe", "Probe", "StateProbe", "first", "fmt", "pyplot", "short", "stats"]
