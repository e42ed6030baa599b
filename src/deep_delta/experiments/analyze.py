"""What a trained model does with its residual: ``ddl analyze``.

Each kind of residual module has its own probe (:data:`PROBES`): it finds its modules in a model, watches
them with forward hooks while a sample of token windows runs through the unchanged model, and turns what it
saw into report sections, a Markdown table and figures. ``analyze_model`` runs every probe that finds
something; ``format_analysis`` and ``plot_analysis`` dispatch on the probes the report names. A model
without any (the additive baseline) is refused.

**Delta sublayers** (:class:`~deep_delta.layers.delta_residual.DeltaResidual`, ``model.layers.i.attn`` /
``.mlp``; report keys ``sublayers``, ``compressor_drift``):

- the gate beta: mean, quantiles, and the share of tokens in each regime of the paper's spectral reading
  (identity beta < 0.1, projection 0.9 <= beta <= 1.1, reflection beta > 1.9);
- how much of the state's k-component each update erases: ``|k^T X|`` before and after the update (the norm
  over the value channels), their mean ratio after/before, and the share of tokens whose ``k^T X`` changes
  sign (a reflection flips it);
- the cosine between the directions k of successive sublayers at the same token;
- the values v (mean, sd, min, max);
- for d_v > 1, how far each block's compressor has moved from the plain mean read of the state:
  ``|read(X) - mean_j X_j| / |mean_j X_j|`` over the tokens.

**Hyper-connections** (:class:`~deep_delta.layers.hyper_connections.HyperResidual`, HC and mHC; report key
``hyper``), per sublayer over the tokens: the read weights a (HC A_m, mHC H_pre), the mixing matrix M with
row i the weights of new stream i over the old streams (mHC: H_res; HC: A_r^T), its distance from the
identity and its worst row / column sum error (how doubly stochastic it is), the write weights b (HC B, mHC
H_post), and how far the n streams of a token have drifted apart after the sublayer (their mean pairwise
cosine and ``|H - mean_j H_j| / |H|``).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from deep_delta.fsutil import save_figure
from deep_delta.layers.attention_residuals import AttnResidual, DepthReadout
from deep_delta.layers.delta_residual import DeltaResidual
from deep_delta.layers.hyper_connections import HyperResidual

REGIMES = {"identity": (0.0, 0.1), "projection": (0.9, 1.1), "reflection": (1.9, 2.0)}
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _stats(x: torch.Tensor) -> dict[str, float]:
    x = x.flatten().double()
    return {"mean": float(x.mean()), "sd": float(x.std()) if x.numel() > 1 else 0.0, "min": float(x.min()),
            "max": float(x.max())}


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _short(name: str) -> str:
    return name.removeprefix("model.")


def _pyplot():
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


# ---------------------------------------------------------------------------------------------- delta rule


def sublayer_report(raw: dict[str, list[torch.Tensor]], k_eps: float,
                    rule: str = "delta") -> tuple[dict[str, Any], torch.Tensor]:
    """The figures of one delta sublayer from its recorded tensors; also returns its unit directions (N, d).
    ``erased``: the mean share of the state an update removes along k, ``beta |k^T X| / |X|`` per token (the
    delta rule's erase term ``beta k k^T X``); the write-only control (``rule="write"``) erases nothing, and
    ``delta_would_erase`` says what the delta rule would have on its states. With the untied gates
    (``rule="untied"``) ``beta`` is the erase gate (the one in the operator ``I - beta k k^T``, whose regimes the
    shares read) and ``write_gate`` the write gate's figures. For the write-only control the figures of the delta
    rule's regimes (the shares of beta in identity / projection / reflection) and of its action on the k-component
    (after / before, sign flipped) are None: its update projects and reflects nothing."""
    gates = torch.cat([b.reshape(-1, b.shape[-1]) for b in raw["beta"]]).double()  # (N, 1), untied (N, 2)
    beta = gates[:, 0]
    k_raw = torch.cat([k.reshape(-1, k.shape[-1]) for k in raw["k_raw"]]).double()
    k = k_raw / torch.sqrt((k_raw * k_raw).sum(-1, keepdim=True) + k_eps ** 2)
    d = k.shape[-1]
    x = torch.cat([s.reshape(-1, d, 1) if s.shape[-1] == d else s.reshape(-1, d, s.shape[-1]) for s in raw["x"]])
    x_new = torch.cat([s.reshape(-1, d, 1) if s.shape[-1] == d else s.reshape(-1, d, s.shape[-1])
                       for s in raw["x_new"]])
    before = torch.einsum("nd,ndv->nv", k, x.double())
    after = torch.einsum("nd,ndv->nv", k, x_new.double())
    nb, na = before.norm(dim=-1), after.norm(dim=-1)
    ok = nb > 1e-12
    flipped = ((before * after).sum(-1) < 0).double()
    size = x.double().flatten(1).norm(dim=-1).clamp_min(1e-30)
    would = float((beta * nb / size).mean())
    delta = rule != "write"  # the regimes and the k-component's change are the erasing rules' figures
    report = {
        "tokens": int(beta.numel()),
        "rule": rule,
        "erased": 0.0 if rule == "write" else would,
        "delta_would_erase": would,
        "beta": {**_stats(beta), "quantiles": {str(q): float(torch.quantile(beta, q)) for q in QUANTILES},
                 **{f"share_{name}": float(((beta >= lo) & (beta <= hi) if name != "identity" else beta < hi)
                                            .double().mean()) if delta else None
                    for name, (lo, hi) in REGIMES.items()}},
        "k_component": {"before": float(nb.mean()), "after": float(na.mean()),
                        "ratio_after_before": float((na[ok] / nb[ok]).mean()) if ok.any() and delta else None,
                        "share_sign_flipped": float(flipped[ok].mean()) if ok.any() and delta else None},
        "v": _stats(torch.cat([v.flatten() for v in raw["v"]])),
    }
    if rule == "untied":
        report["write_gate"] = {**_stats(gates[:, 1]),
                                "quantiles": {str(q): float(torch.quantile(gates[:, 1], q)) for q in QUANTILES}}
    return report, k


class DeltaProbe(Probe):
    """DDL's delta sublayers: beta, the direction k, v and the state before / after each update; the
    compressors' drift from the plain mean read."""

    name, watched = "delta", DeltaResidual

    @staticmethod
    def reports_on(module: DeltaResidual) -> bool:
        return not module.additive  # the baseline's sublayers have no delta rule to report

    def __init__(self, model, modules):
        super().__init__(model, modules)
        # the hooks watch each sublayer's forward and its modules (the gate's, the norm's): the unfused plan (no
        # update computes the next sublayer's read or inputs; deep_delta.models.ddl.fusion) and the modules in
        # place of the fused norm + gate + value op (Triton backend) while probing; the same values
        self.fused = [(m, attr, getattr(m, attr)) for m in model.modules() for attr in ("fuse_updates", "fuse_inputs")
                      if hasattr(m, attr)]
        for m, attr, _ in self.fused:
            setattr(m, attr, False)
        self.raw: dict[str, dict[str, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
        for name, m in modules:
            self._watch(name, m)
        self.drift: dict[str, list[float]] = defaultdict(list)
        for name, block in model.named_modules():
            comp = getattr(block, "compressor", None)
            if comp is not None and hasattr(block, "attn"):
                self.handles.append(block.register_forward_pre_hook(self._drift_hook(name, comp)))

    def _watch(self, name: str, m) -> None:
        rec = self.raw[name]
        keep = lambda key: (lambda mod, args, out: rec[key].append(_first(out).detach().float()))  # noqa: E731
        self.handles.append(m.register_forward_pre_hook(lambda mod, args: rec["x"].append(args[0].detach().float())))
        self.handles.append(m.register_forward_hook(keep("x_new")))
        self.handles.append(m.gate.register_forward_hook(keep("beta")))
        direction = m.branch if m.residual_map == "k" else m.key_up
        self.handles.append(direction.register_forward_hook(keep("k_raw")))
        value = m.value_proj
        if m.residual_map == "k" or m.value_channels == 1:
            self.handles.append(value.register_forward_hook(
                lambda mod, args, out: rec["v"].append(m.value_scale * torch.sigmoid(out.detach().float()))))
        else:
            self.handles.append(value.register_forward_hook(keep("v")))

    def _drift_hook(self, name: str, comp):
        """|compressor(X) - mean_j X_j| / |mean_j X_j| over the state entering the block."""

        def pre(mod, args):
            state = args[0]
            if state.dim() == 4:
                with torch.no_grad():
                    read, plain = comp(state)[0].double(), state.double().mean(-1)
                self.drift[name].append(float((read - plain).norm() / plain.norm().clamp_min(1e-30)))

        return pre

    def close(self) -> None:
        super().close()
        for m, attr, flag in self.fused:
            setattr(m, attr, flag)

    def sections(self):
        layers, directions = {}, []
        for name, m in self.modules:
            layers[name], k = sublayer_report(self.raw[name], m.k_eps, m.update_rule)
            directions.append(k)
        for (name, _), k0, k1 in zip(self.modules[1:], directions, directions[1:]):
            cos = (k0 * k1).sum(-1)
            layers[name]["cos_previous_k"] = {"mean": float(cos.mean()), "mean_abs": float(cos.abs().mean())}
        return {"sublayers": layers, "compressor_drift": {n: sum(v) / len(v) for n, v in self.drift.items()}}

    @staticmethod
    def format(report):
        lines = ["| sublayer | beta mean | beta median | identity | projection | reflection | k^T X after/before "
                 "| sign flipped | cos(k, previous k) | v mean | erased | the delta rule would erase |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        twins = False
        for name, r in report["sublayers"].items():
            b, kc = r["beta"], r["k_component"]
            cos = r.get("cos_previous_k", {}).get("mean")
            write = r.get("rule") == "write"  # the delta rule's regimes and k-component figures: not its update's
            twins |= write
            rule = (lambda x, spec=".3f": "n/a") if write else _fmt
            lines.append(f"| {_short(name)} | {_fmt(b['mean'])} | {_fmt(b['quantiles']['0.5'])} "
                         f"| {rule(b['share_identity'], '.2f')} | {rule(b['share_projection'], '.2f')} "
                         f"| {rule(b['share_reflection'], '.2f')} | {rule(kc['ratio_after_before'])} "
                         f"| {rule(kc['share_sign_flipped'], '.2f')} | {_fmt(cos)} | {_fmt(r['v']['mean'])} "
                         f"| {_fmt(r.get('erased'))} | {_fmt(r.get('delta_would_erase'))} |")
        lines += ["", "erased: the mean share of the state an update removes along k, beta |k^T X| / |X| per token "
                  "(0 for the write-only control, which removes nothing; the last column is what the delta rule "
                  "would remove from the same states)"]
        if twins:
            lines += ["", "n/a: the write-only update x + beta k v^T reads nothing and erases nothing, so beta's "
                      "identity / projection / reflection regimes and the change of k^T X, which are the delta "
                      "rule's, do not apply to it"]
        untied = {n: r for n, r in report["sublayers"].items() if "write_gate" in r}
        if untied:
            lines += ["", "Untied gates: beta above is the erase gate; both gates started at the same value "
                      "(beta_init). Per sublayer, the erase gate's and the write gate's means:", "",
                      "| sublayer | erase gate mean | write gate mean | erase / write |", "| --- | ---: | ---: | ---: |"]
            for name, r in untied.items():
                e, w = r["beta"]["mean"], r["write_gate"]["mean"]
                lines.append(f"| {_short(name)} | {_fmt(e)} | {_fmt(w)} | {_fmt(e / w if w else None)} |")
        drift = report.get("compressor_drift") or {}
        if drift:
            lines += ["", "compressor read vs plain mean (relative difference): "
                      + ", ".join(f"{_short(k)} {v:.3f}" for k, v in drift.items())]
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """A sublayer x regime heat map and beta quantiles per sublayer."""
        plt = _pyplot()
        names = list(report["sublayers"])
        shares = [[report["sublayers"][n]["beta"][f"share_{r}"] for r in REGIMES] for n in names]
        if any(None in row for row in shares):  # the write-only control: the delta rule's regimes do not apply
            return [_quantile_plot(plt, report, names, out)]
        fig, ax = plt.subplots(figsize=(5.5, 0.35 * len(names) + 1.5))
        im = ax.imshow(shares, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_xticks(range(len(REGIMES)), list(REGIMES))
        ax.set_yticks(range(len(names)), [_short(n) for n in names])
        for i, row in enumerate(shares):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=7)
        fig.colorbar(im, ax=ax, label="share of tokens")
        ax.set_title(f"beta regimes ({report.get('variant') or 'model'})")
        fig.tight_layout()
        heat = save_figure(fig, out / "beta_regimes.png", dpi=120)
        return [heat, _quantile_plot(plt, report, names, out)]


def _quantile_plot(plt, report: dict[str, Any], names: list[str], out: Path) -> Path:
    """beta's 5-25-50-75-95% quantiles per delta sublayer: ``beta_quantiles.png``."""
    fig, ax = plt.subplots(figsize=(max(5.0, 0.4 * len(names) + 2), 3.8))
    for i, n in enumerate(names):
        q = report["sublayers"][n]["beta"]["quantiles"]
        ax.plot([i, i], [q["0.05"], q["0.95"]], color="C0", linewidth=1)
        ax.plot([i, i], [q["0.25"], q["0.75"]], color="C0", linewidth=5)
        ax.plot(i, q["0.5"], "o", color="C1", markersize=4)
    ax.set_xticks(range(len(names)), [n.removeprefix("model.layers.") for n in names], rotation=60, fontsize=7)
    ax.set_ylim(0, 2)
    ax.set_ylabel("beta (5-25-50-75-95% quantiles)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out / "beta_quantiles.png", dpi=120)


# ---------------------------------------------------------------------------------------- hyper-connections


def stream_drift(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How far the n streams of each token have drifted apart, for a state h (..., d, n), in fp64.

    Returns the mean cosine over the n(n-1)/2 pairs of streams (1 for one stream) and the relative spread
    ``|H - mean_j H_j|_F / |H|_F``, each of shape (...). Identical streams give (1, 0).
    """
    h = h.double()
    n = h.shape[-1]
    spread = (h - h.mean(-1, keepdim=True)).flatten(-2).norm(dim=-1) / h.flatten(-2).norm(dim=-1).clamp_min(1e-300)
    if n == 1:
        return torch.ones_like(spread), spread
    unit = h / h.norm(dim=-2, keepdim=True).clamp_min(1e-300)
    gram = unit.transpose(-1, -2) @ unit
    off = gram.sum((-2, -1)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return off / (n * (n - 1)), spread


def hyper_sublayer_report(a: torch.Tensor, mix: torch.Tensor, b: torch.Tensor, cos: torch.Tensor,
                          spread: torch.Tensor) -> dict[str, Any]:
    """The figures of one hyper-connection sublayer from its per-token coefficients: read a (N, n), mixing
    M (N, n, n) (row i: new stream i's weights over the old streams), write b (N, n), and the streams after it
    (cosine and spread, (N,))."""
    a, mix, b = a.double(), mix.double(), b.double()
    n = a.shape[-1]
    eye = torch.eye(n, dtype=mix.dtype)
    sd = lambda t: t.std(0) if t.shape[0] > 1 else torch.zeros_like(t[0])  # noqa: E731
    mean = mix.mean(0)
    row_err, col_err = (mix.sum(-1) - 1).abs().amax(-1), (mix.sum(-2) - 1).abs().amax(-1)
    return {
        "tokens": int(a.shape[0]),
        "read": {"mean": a.mean(0).tolist(), "sd": sd(a).tolist(), "sum": float(a.sum(-1).mean())},
        "mixing": {
            "mean": mean.tolist(), "sd": sd(mix).tolist(), "min": float(mix.min()),
            "identity_distance": float((mean - eye).norm()),  # Frobenius, of the mean matrix
            "identity_distance_tokens": float((mix - eye).flatten(-2).norm(dim=-1).mean()),  # mean per token
            # the worst token's largest |sum - 1| of a row / a column, and its mean over tokens
            "row_sum_error": float(row_err.max()), "column_sum_error": float(col_err.max()),
            "row_sum_error_mean": float(row_err.mean()), "column_sum_error_mean": float(col_err.mean()),
        },
        "write": {"mean": b.mean(0).tolist(), "sd": sd(b).tolist()},
        "streams_after": {"cosine": float(cos.double().mean()), "cosine_min": float(cos.double().min()),
                          "spread": float(spread.double().mean())},
    }


class HyperProbe(Probe):
    """Hyper-connections (HC / mHC): each sublayer's read, mixing and write coefficients per token (from the
    module's own ``coefficients`` of the state entering it) and the streams' drift after it."""

    name, watched = "hyper", HyperResidual

    def __init__(self, model, modules):
        super().__init__(model, modules)
        self.raw: dict[str, dict[str, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
        for name, m in modules:
            self.handles.append(m.register_forward_pre_hook(self._coefficients_hook(self.raw[name])))
            self.handles.append(m.register_forward_hook(self._drift_hook(self.raw[name])))

    @staticmethod
    def _coefficients_hook(rec):
        def pre(mod, args):
            h = args[0].detach()
            with torch.no_grad():
                a, r, b = mod.coefficients(h)
            lead, n = h.shape[:-2], mod.streams
            rec["a"].append(a.float().expand(*lead, n).reshape(-1, n))
            rec["mix"].append(r.float().transpose(-1, -2).expand(*lead, n, n).reshape(-1, n, n))
            rec["b"].append(b.float().expand(*lead, n).reshape(-1, n))

        return pre

    @staticmethod
    def _drift_hook(rec):
        def post(mod, args, out):
            cos, spread = stream_drift(_first(out).detach())
            rec["cos"].append(cos.flatten())
            rec["spread"].append(spread.flatten())

        return post

    def sections(self):
        first = self.modules[0][1]
        layers = {name: hyper_sublayer_report(*(torch.cat(self.raw[name][k]) for k in ("a", "mix", "b", "cos",
                                                                                          "spread")))
                  for name, _ in self.modules}
        return {"hyper": {"kind": first.kind, "dynamic": first.dynamic, "streams": first.streams,
                          "mixing_matrix": "H_res" if first.kind == "mhc" else "A_r^T", "sublayers": layers}}

    @staticmethod
    def format(report):
        hy = report["hyper"]
        vec = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        lines = [f"{hy['kind'].upper()} ({'dynamic' if hy['dynamic'] else 'static'}), {hy['streams']} streams; "
                 f"mixing M = {hy['mixing_matrix']} (row i: new stream i over the old streams)", "",
                 "| sublayer | read a (mean per stream) | read sd | write b (mean per stream) | write sd | |M - I| "
                 "| row / column sum error | stream cosine | stream spread |",
                 "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in hy["sublayers"].items():
            mx, st = r["mixing"], r["streams_after"]
            lines.append(f"| {_short(name)} | {vec(r['read']['mean'])} | {max(r['read']['sd']):.3f} "
                         f"| {vec(r['write']['mean'])} | {max(r['write']['sd']):.3f} | {mx['identity_distance']:.3f} "
                         f"| {mx['row_sum_error']:.1e} / {mx['column_sum_error']:.1e} | {st['cosine']:.3f} "
                         f"| {st['spread']:.3f} |")
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """Sublayer x stream heat maps of the read and write weights, the mean mixing matrix of each
        sublayer, and the streams' cosine and spread per sublayer."""
        plt = _pyplot()
        hy = report["hyper"]
        names, n = list(hy["sublayers"]), hy["streams"]
        label = f"{report.get('variant') or hy['kind']}"
        fig, axes = plt.subplots(1, 2, figsize=(2.0 + 1.1 * n, 0.35 * len(names) + 1.8), squeeze=False)
        for ax, key, title in zip(axes[0], ("read", "write"), ("read a", "write b")):
            grid = [hy["sublayers"][s][key]["mean"] for s in names]
            im = ax.imshow(grid, aspect="auto", cmap="viridis")
            ax.set_xticks(range(n), [str(j) for j in range(n)])
            ax.set_xlabel("stream")
            ax.set_yticks(range(len(names)), [_short(s) for s in names] if key == "read" else [])
            mid = (min(map(min, grid)) + max(map(max, grid))) / 2
            for i, row in enumerate(grid):
                for j, v in enumerate(row):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < mid else "k")
            fig.colorbar(im, ax=ax)
            ax.set_title(f"{title} ({label})", fontsize=9)
        fig.tight_layout()
        weights = save_figure(fig, out / "stream_weights.png", dpi=120)

        cols = min(4, len(names))
        rows = math.ceil(len(names) / cols)
        mats = [hy["sublayers"][s]["mixing"]["mean"] for s in names]
        lo = min(0.0, min(min(map(min, m)) for m in mats))
        hi = max(1.0, max(max(map(max, m)) for m in mats))
        fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols + 1.0, 2.0 * rows + 0.5), squeeze=False,
                                 layout="constrained")
        for ax in axes.flat[len(names):]:
            ax.axis("off")
        for ax, s, m in zip(axes.flat, names, mats):
            im = ax.imshow(m, vmin=lo, vmax=hi, cmap="viridis")
            if n <= 6:
                for i, row in enumerate(m):
                    for j, v in enumerate(row):
                        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                                color="w" if v < (lo + hi) / 2 else "k")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{_short(s)}\n|M-I| {hy['sublayers'][s]['mixing']['identity_distance']:.2f}", fontsize=7)
        fig.colorbar(im, ax=list(axes.flat), shrink=0.8)
        fig.suptitle(f"mean mixing matrix {hy['mixing_matrix']} ({label}); row: new stream", fontsize=9)
        mixing = save_figure(fig, out / "stream_mixing.png", dpi=120)

        fig, ax = plt.subplots(figsize=(max(5.0, 0.4 * len(names) + 2), 3.6))
        xs = range(len(names))
        ax.plot(xs, [hy["sublayers"][s]["streams_after"]["cosine"] for s in names], "o-", label="mean pairwise cosine")
        ax.plot(xs, [hy["sublayers"][s]["streams_after"]["spread"] for s in names], "s-",
                label="|H - mean stream| / |H|")
        ax.set_xticks(list(xs), [s.removeprefix("model.layers.") for s in names], rotation=60, fontsize=7)
        ax.set_ylabel("streams after the sublayer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"stream drift ({label})", fontsize=9)
        fig.tight_layout()
        drift = save_figure(fig, out / "stream_drift.png", dpi=120)
        return [weights, mixing, drift]


# ---------------------------------------------------------------------------------------- attention residuals


class DepthProbe(Probe):
    """Attention Residuals: each sublayer's (and the readout's) weights over its sources per token (from the
    module's own query and key norm over the sources entering it): their mean, the share on the embedding and on
    the newest source, the weights' entropy (in nats; log n is uniform), and the norm of what the sublayer reads
    and of its output."""

    name, watched = "depth", (AttnResidual, DepthReadout)

    def __init__(self, model, modules):
        super().__init__(model, modules)
        self.raw: dict[str, dict[str, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
        for name, m in modules:
            self.handles.append(m.register_forward_hook(self._hook(self.raw[name])))

    @staticmethod
    def _hook(rec):
        def post(mod, args, out):
            sources = args[0]
            w = mod.weights(sources).double()
            rec["weights"].append(w.reshape(-1, w.shape[-1]))
            read = mod.attend(sources).double()
            rec["read_norm"].append(read.reshape(-1, read.shape[-1]).norm(dim=-1))
            if isinstance(mod, AttnResidual):  # its output: the new source, or what it added into the last one
                delta = out[-1] if len(out) > len(sources) else out[-1] - sources[-1]
                rec["out_norm"].append(delta.double().reshape(-1, delta.shape[-1]).norm(dim=-1))

        return post

    def sections(self):
        layers = {}
        for name, _ in self.modules:
            rec = self.raw[name]
            w = torch.cat(rec["weights"])
            entropy = -(w * w.clamp_min(1e-300).log()).sum(-1)
            layers[name] = {"sources": int(w.shape[-1]), "weights_mean": w.mean(0).tolist(),
                            "embedding": float(w[:, 0].mean()), "newest": float(w[:, -1].mean()),
                            "entropy": float(entropy.mean()), "uniform_entropy": math.log(w.shape[-1]),
                            "read_norm": float(torch.cat(rec["read_norm"]).mean()),
                            "output_norm": float(torch.cat(rec["out_norm"]).mean()) if rec["out_norm"] else None}
        return {"depth": layers}

    @staticmethod
    def format(report):
        lines = ["Attention Residuals: each sublayer's softmax weights over its sources (the embedding first, the "
                 "newest last), mean over tokens", "",
                 "| sublayer | sources | on the embedding | on the newest | entropy / log n | read norm | output norm |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        def cells(name: str, r: dict) -> list[str]:
            evenness = r["entropy"] / r["uniform_entropy"] if r["uniform_entropy"] else None
            return [_short(name), str(r["sources"]), *map(_fmt, (r["embedding"], r["newest"], evenness,
                                                                 r["read_norm"], r["output_norm"]))]

        lines += ["| " + " | ".join(cells(name, r)) + " |" for name, r in report["depth"].items()]
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """A sublayer x source heat map of the mean weights (sources the sublayer does not have left blank)."""
        plt = _pyplot()
        names = list(report["depth"])
        width = max(r["sources"] for r in report["depth"].values())
        grid = [[math.nan] * width for _ in names]
        for i, n in enumerate(names):
            for j, v in enumerate(report["depth"][n]["weights_mean"]):
                grid[i][j] = v
        fig, ax = plt.subplots(figsize=(1.5 + 0.45 * width, 0.35 * len(names) + 1.5))
        im = ax.imshow(grid, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_xticks(range(width), ["emb"] + [str(j) for j in range(1, width)])
        ax.set_xlabel("source (embedding, then outputs or block sums in order)")
        ax.set_yticks(range(len(names)), [_short(n) for n in names])
        fig.colorbar(im, ax=ax, label="mean weight")
        ax.set_title(f"depth weights ({report.get('variant') or 'model'})")
        fig.tight_layout()
        return [save_figure(fig, out / "depth_weights.png", dpi=120)]


# The probes ``analyze_model`` tries, by the name a report lists them under. A new residual kind adds its
# probe here; the command and the report functions need no change.
class StateProbe(Probe):
    """The residual state through the depth, for every variant with a ``DeltaResidual`` (the additive baseline,
    DDL, the write-only control): per sublayer the state's mean norm per token entering and leaving it and the
    update's (``|X' - X|``, and relative to ``|X|``), so that the variants' states can be set side by side."""

    name, watched = "state", DeltaResidual

    def __init__(self, model, modules):
        super().__init__(model, modules)
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for name, m in modules:
            self.handles.append(m.register_forward_hook(self._hook(self.sums[name], m.value_channels)))

    @staticmethod
    def _hook(acc: dict[str, float], dv: int):
        def hook(mod, args, out):
            x, new = args[0].detach().double(), _first(out).detach().double()
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
            lines.append(f"| {_short(name)} | {_fmt(r['norm_before'])} | {_fmt(r['norm_after'])} "
                         f"| {_fmt(r['update_norm'])} | {_fmt(r['update_relative'])} |")
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """The state's norm through the depth (entering each sublayer, then leaving the last)."""
        plt = _pyplot()
        names = list(report["states"])
        norms = [report["states"][n]["norm_before"] for n in names] + [report["states"][names[-1]]["norm_after"]]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(norms) + 2), 3.5))
        ax.plot(range(len(norms)), norms, "o-")
        ax.set_xticks(range(len(norms)), [_short(n) for n in names] + ["out"], rotation=60, fontsize=7)
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
        cells = [f"embedding {_fmt(found['embed_tokens'])}"]
        if "embed_norm" in found:
            cells.append(f"after the embedding norm {_fmt(found['embed_norm'])}")
        return "What enters the residual stream (mean norm per token): " + "; ".join(cells) + "."

    @staticmethod
    def plot(report, out):
        return []


PROBES: dict[str, type[Probe]] = {p.name: p for p in (EmbeddingProbe, StateProbe, DeltaProbe, HyperProbe, DepthProbe)}


def _probes_of(report: dict[str, Any]) -> list[type[Probe]]:
    return [PROBES[name] for name in report.get("probes", ["delta"])]  # reports written before probes: DDL


@torch.no_grad()
def analyze_model(model: torch.nn.Module, batches, *, device: torch.device | str = "cpu",
                  progress: bool = False) -> dict[str, Any]:
    """The analysis of ``model`` over ``batches`` of token ids ((B, T) tensors, or (x, y) pairs)."""
    model.eval()
    found = [(cls, mods) for cls in PROBES.values() if (mods := cls.find(model))]
    if not any(cls is not EmbeddingProbe for cls, _ in found):
        raise ValueError("analyze: the model has no residual this analysis knows (DeltaResidual, additive or "
                         "delta, HyperResidual or AttnResidual)")
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
