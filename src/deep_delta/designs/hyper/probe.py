"""What ``ddl analyze`` reports of hyper-connections (HC / mHC; report key ``hyper``), per sublayer over the tokens:
the read weights a (HC A_m, mHC H_pre), the mixing matrix M with row i the weights of new stream i over the old
streams (mHC: H_res; HC: A_r^T), its distance from the identity and its worst row / column sum error (how doubly
stochastic it is), the write weights b (HC B, mHC H_post), and how far the n streams of a token have drifted apart
after the sublayer (their mean pairwise cosine and ``|H - mean_j H_j| / |H|``)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from deep_delta.designs.probes import Probe, first, pyplot, short
from deep_delta.fsutil import save_figure
from deep_delta.layers.hyper_connections import HyperResidual


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
            cos, spread = stream_drift(first(out).detach())
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
            lines.append(f"| {short(name)} | {vec(r['read']['mean'])} | {max(r['read']['sd']):.3f} "
                         f"| {vec(r['write']['mean'])} | {max(r['write']['sd']):.3f} | {mx['identity_distance']:.3f} "
                         f"| {mx['row_sum_error']:.1e} / {mx['column_sum_error']:.1e} | {st['cosine']:.3f} "
                         f"| {st['spread']:.3f} |")
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """Sublayer x stream heat maps of the read and write weights, the mean mixing matrix of each
        sublayer, and the streams' cosine and spread per sublayer."""
        plt = pyplot()
        hy = report["hyper"]
        names, n = list(hy["sublayers"]), hy["streams"]
        label = f"{report.get('variant') or hy['kind']}"
        fig, axes = plt.subplots(1, 2, figsize=(2.0 + 1.1 * n, 0.35 * len(names) + 1.8), squeeze=False)
        for ax, key, title in zip(axes[0], ("read", "write"), ("read a", "write b")):
            grid = [hy["sublayers"][s][key]["mean"] for s in names]
            im = ax.imshow(grid, aspect="auto", cmap="viridis")
            ax.set_xticks(range(n), [str(j) for j in range(n)])
            ax.set_xlabel("stream")
            ax.set_yticks(range(len(names)), [short(s) for s in names] if key == "read" else [])
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
            ax.set_title(f"{short(s)}\n|M-I| {hy['sublayers'][s]['mixing']['identity_distance']:.2f}", fontsize=7)
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


__all__ = ["HyperProbe", "hyper_sublayer_report", "stream_drift"]
