"""What ``ddl analyze`` reports of the delta design: its sublayers' gates, directions, values and what each update
erases, and the compressors' drift from the plain mean read.

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
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from deep_delta.designs.probes import Probe, first, fmt, pyplot, short, stats
from deep_delta.fsutil import save_figure
from deep_delta.layers.delta_residual import DeltaResidual

REGIMES = {"identity": (0.0, 0.1), "projection": (0.9, 1.1), "reflection": (1.9, 2.0)}
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


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
        "beta": {**stats(beta), "quantiles": {str(q): float(torch.quantile(beta, q)) for q in QUANTILES},
                 **{f"share_{name}": float(((beta >= lo) & (beta <= hi) if name != "identity" else beta < hi)
                                            .double().mean()) if delta else None
                    for name, (lo, hi) in REGIMES.items()}},
        "k_component": {"before": float(nb.mean()), "after": float(na.mean()),
                        "ratio_after_before": float((na[ok] / nb[ok]).mean()) if ok.any() and delta else None,
                        "share_sign_flipped": float(flipped[ok].mean()) if ok.any() and delta else None},
        "v": stats(torch.cat([v.flatten() for v in raw["v"]])),
    }
    if rule == "untied":
        report["write_gate"] = {**stats(gates[:, 1]),
                                "quantiles": {str(q): float(torch.quantile(gates[:, 1], q)) for q in QUANTILES}}
    return report, k


class DeltaProbe(Probe):
    """DDL's delta sublayers: beta, the direction k, v and the state before / after each update; the
    compressors' drift from the plain mean read."""

    name, watched = "delta", DeltaResidual

    def __init__(self, model, modules):
        super().__init__(model, modules)
        # the hooks watch each sublayer's forward and its modules (the gate's, the norm's): the unfused plan (no
        # update computes the next sublayer's read or inputs; deep_delta.designs.delta.fusion) and the modules in
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
        keep = lambda key: (lambda mod, args, out: rec[key].append(first(out).detach().float()))  # noqa: E731
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
            rule = (lambda x, spec=".3f": "n/a") if write else fmt
            lines.append(f"| {short(name)} | {fmt(b['mean'])} | {fmt(b['quantiles']['0.5'])} "
                         f"| {rule(b['share_identity'], '.2f')} | {rule(b['share_projection'], '.2f')} "
                         f"| {rule(b['share_reflection'], '.2f')} | {rule(kc['ratio_after_before'])} "
                         f"| {rule(kc['share_sign_flipped'], '.2f')} | {fmt(cos)} | {fmt(r['v']['mean'])} "
                         f"| {fmt(r.get('erased'))} | {fmt(r.get('delta_would_erase'))} |")
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
                lines.append(f"| {short(name)} | {fmt(e)} | {fmt(w)} | {fmt(e / w if w else None)} |")
        drift = report.get("compressor_drift") or {}
        if drift:
            lines += ["", "compressor read vs plain mean (relative difference): "
                      + ", ".join(f"{short(k)} {v:.3f}" for k, v in drift.items())]
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """A sublayer x regime heat map and beta quantiles per sublayer."""
        plt = pyplot()
        names = list(report["sublayers"])
        shares = [[report["sublayers"][n]["beta"][f"share_{r}"] for r in REGIMES] for n in names]
        if any(None in row for row in shares):  # the write-only control: the delta rule's regimes do not apply
            return [_quantile_plot(plt, report, names, out)]
        fig, ax = plt.subplots(figsize=(5.5, 0.35 * len(names) + 1.5))
        im = ax.imshow(shares, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_xticks(range(len(REGIMES)), list(REGIMES))
        ax.set_yticks(range(len(names)), [short(n) for n in names])
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


__all__ = ["DeltaProbe", "QUANTILES", "REGIMES", "sublayer_report"]
