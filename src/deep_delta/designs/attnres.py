"""The attnres design: Attention Residuals (AttnRes, Kimi Team, arXiv 2603.15031), a residual whose state is the
list of what came before, and whose sublayer reads a softmax over depth of it instead of the running sum.

The state is a tuple of sources (B, T, d), the embedding first (:class:`~deep_delta.layers.attention_residuals.
DepthSources`); each sublayer reads a softmax-weighted sum of the sources by its pseudo-query and appends its output
as a new source (Full AttnRes, and the first sublayer of a block) or adds it into the last one (the running sum of
the current block: Block AttnRes; :class:`~deep_delta.layers.attention_residuals.AttnResidual`); a last depth
attention reads the state out before the final norm (:class:`~deep_delta.layers.attention_residuals.DepthReadout`).

Settings (a flat field of :class:`~deep_delta.models.ddl.configuration_ddl.DDLConfig`): attnres_blocks (None: Full
AttnRes; N: Block AttnRes, the 2 x num_hidden_layers sublayers in min(N, 2 x num_hidden_layers) contiguous blocks of
near-equal size; the paper's N is 8). ``ddl analyze`` reports each sublayer's weights over its sources.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn

from deep_delta.designs.base import ResidualDesign
from deep_delta.designs.probes import Probe, fmt, pyplot, short
from deep_delta.designs.registry import register_design
from deep_delta.fsutil import save_figure
from deep_delta.layers.attention_residuals import AttnResidual, DepthReadout, DepthSources, block_starts


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
            return [short(name), str(r["sources"]), *map(fmt, (r["embedding"], r["newest"], evenness,
                                                                 r["read_norm"], r["output_norm"]))]

        lines += ["| " + " | ".join(cells(name, r)) + " |" for name, r in report["depth"].items()]
        return "\n".join(lines)

    @staticmethod
    def plot(report, out):
        """A sublayer x source heat map of the mean weights (sources the sublayer does not have left blank)."""
        plt = pyplot()
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
        ax.set_yticks(range(len(names)), [short(n) for n in names])
        fig.colorbar(im, ax=ax, label="mean weight")
        ax.set_title(f"depth weights ({report.get('variant') or 'model'})")
        fig.tight_layout()
        return [save_figure(fig, out / "depth_weights.png", dpi=120)]


def _bad(field: str, got, allowed: str) -> ValueError:
    return ValueError(f"DDLConfig: `{field}` got {got!r}; allowed: {allowed}")


class AttnResDesign(ResidualDesign):
    name = "attnres"
    about = "Attention Residuals: each sublayer reads a softmax over depth of the earlier outputs"
    fields = ("attnres_blocks",)
    probes = (DepthProbe,)

    def check(self, config) -> None:
        if config.attnres_blocks is not None and config.attnres_blocks < 1:
            raise _bad("attnres_blocks", config.attnres_blocks, "None (Full AttnRes) or an integer >= 1 (Block AttnRes)")

    def expander(self, config) -> nn.Module:
        return DepthSources()  # the embedding, the first source

    def residual(self, config, branch: nn.Module, sublayer: int) -> nn.Module:
        starts = block_starts(2 * config.num_hidden_layers, config.attnres_blocks)
        return AttnResidual(config.hidden_size, branch, starts_block=starts[sublayer], norm_eps=config.rms_norm_eps,
                            backend=config.delta_backend)

    def readout(self, config) -> nn.Module:
        return DepthReadout(config.hidden_size, norm_eps=config.rms_norm_eps, backend=config.delta_backend)

    def graphs_per_block(self, config) -> int:
        return 2  # the sources' tuple grows at every sublayer: the blocks' shared forward is traced for each

    def init_module(self, module: nn.Module, config, std: float) -> bool:
        if isinstance(module, (AttnResidual, DepthReadout)):  # the pseudo-query at zero: uniform weights
            from transformers import initialization as init

            init.zeros_(module.query)
            return True
        return False

    def mup_readouts(self, module: nn.Module) -> dict[str, nn.Parameter]:
        # the pseudo-queries, d -> one logit per source: like DDL's gate they train at lr / m under muP (docs/mup.md)
        return {"query": module.query} if isinstance(module, (AttnResidual, DepthReadout)) else {}

    def describe(self, config) -> str:
        sublayers = 2 * config.num_hidden_layers
        if config.attnres_blocks is None:
            return f"Attention Residuals, Full ({sublayers} sublayers, each output a source of its own)"
        blocks = min(config.attnres_blocks, sublayers)
        same = self.caveat(config)
        return f"Attention Residuals, Block ({blocks} blocks of the {sublayers} sublayers{'; ' + same if same else ''})"

    def caveat(self, config) -> str | None:
        sublayers = 2 * config.num_hidden_layers
        if config.attnres_blocks is None or config.attnres_blocks < sublayers:
            return None
        return "as many blocks as sublayers: this is Full AttnRes, the same model"

    def info_fields(self, config) -> list[str]:
        return ["attnres_blocks"]


DESIGN = register_design(AttnResDesign())
