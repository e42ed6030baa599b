"""What a trained model does with its residual: ``ddl analyze``.

Each residual design names its probes (``ResidualDesign.probes``; :mod:`deep_delta.designs`): a probe finds its
modules in a model, watches them with forward hooks while a sample of token windows runs through the unchanged
model, and turns what it saw into report sections, a Markdown table and figures. ``analyze_model`` runs the
backbone's probe (what enters the residual stream, :class:`~deep_delta.designs.probes.EmbeddingProbe`) and the
model's design's; ``format_analysis`` and ``plot_analysis`` dispatch on the probes the report names. The probes of
the built-in designs: the state through the depth (additive and delta,
:class:`~deep_delta.designs.probes.StateProbe`), DDL's gates, directions and erasure
(:mod:`deep_delta.designs.delta.probe`), the hyper-connections' coefficients and streams
(:mod:`deep_delta.designs.hyper.probe`), Attention Residuals' weights over depth (:mod:`deep_delta.designs.attnres`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from deep_delta.designs.probes import EmbeddingProbe, Probe


def probe_classes() -> dict[str, type[Probe]]:
    """Every probe a report may name, by name: the backbone's and those of every design known (the built-in ones and
    any registered), so that a report written by any of them formats and plots."""
    from deep_delta.designs.registry import design_names, get_design

    found: dict[str, type[Probe]] = {EmbeddingProbe.name: EmbeddingProbe}
    for name in design_names():
        for probe in get_design(name).probes:
            found.setdefault(probe.name, probe)
    return found


def _probes_of(report: dict[str, Any]) -> list[type[Probe]]:
    known = probe_classes()
    names = report.get("probes", ["delta"])  # reports written before probes: DDL
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"analyze: the report names the probe(s) {unknown}, which no design known here has; allowed: "
                         f"{', '.join(sorted(known))} (a design of your own: import its module first)")
    return [known[n] for n in names]


@torch.no_grad()
def analyze_model(model: torch.nn.Module, batches, *, device: torch.device | str = "cpu",
                  progress: bool = False) -> dict[str, Any]:
    """The analysis of ``model`` over ``batches`` of token ids ((B, T) tensors, or (x, y) pairs)."""
    model.eval()
    design = getattr(getattr(model, "config", None), "design", None)
    candidates = [EmbeddingProbe, *(design.probes if design is not None else
                                    [p for p in probe_classes().values() if p is not EmbeddingProbe])]
    found = [(cls, mods) for cls in candidates if (mods := cls.find(model))]
    if not any(cls is not EmbeddingProbe for cls, _ in found):
        raise ValueError("analyze: the model has no residual its design's probes know (the design names them: "
                         "`ResidualDesign.probes`)")
    probes: list[Probe] = []
    windows = 0
    try:
        for cls, mods in found:
            probes.append(cls(model, mods))
        it = batches
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(batches, desc="analyze", unit="batch")
        for batch in it:
            ids = batch[0] if isinstance(batch, (tuple, list)) else batch
            model(ids.to(device), use_cache=False)
            windows += ids.shape[0]
    finally:
        for p in probes:
            p.close()
    if not windows:
        raise ValueError("analyze: `batches` is empty; allowed: at least one batch of token ids")
    cfg = getattr(model, "config", None)
    report: dict[str, Any] = {"variant": getattr(cfg, "variant", None), "windows": windows,
                              "probes": [p.name for p in probes]}
    for p in probes:
        report.update(p.sections())
    return report


def plot_analysis(report: dict[str, Any], out_dir: str | os.PathLike) -> list[Path]:
    """The figures of every probe in the report (PNG), written to ``out_dir``; returns their paths."""
    out = Path(out_dir)
    return [path for probe in _probes_of(report) for path in probe.plot(report, out)]


def format_analysis(report: dict[str, Any]) -> str:
    """Markdown: each probe's table (one row per sublayer)."""
    return "\n\n".join(probe.format(report) for probe in _probes_of(report))
