"""The muP coordinate check: how the size of each activation moves with the width during the first steps.

For every parametrization ("sp", "mup"), variant and width, a fresh model (fixed head size, fixed depth, the
width ``hidden_size`` varying) trains a few AdamW steps on the embedded text. At initialisation and after each
update, forward hooks record each activation type (:data:`ACTIVATIONS`) on one fixed probe batch: its size,
the mean |x_t|, and its change since initialisation, the mean |x_t - x_0|. Under muP both should keep their
width exponent (the log-log slope against width near the muP order, :data:`MUP_ORDER`); under the standard
parametrization the outputs of layers whose updates sum over the width (the logits, the attention and MLP
outputs) grow with it. The pass criterion reads the changes: a size can look flat while the update shrinks,
when the part set at initialisation dominates it. docs/mup.md reads the result.

``run_coord_check`` returns a JSON-able dict; ``slopes`` fits the log-log slopes; ``plot`` draws them.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from deep_delta.experiments.settings import MUP_SLOPE_BOUND, CoordCheckSettings
from deep_delta.layers.additive import AdditiveResidual
from deep_delta.layers.attention_residuals import AttnResidual, DepthReadout
from deep_delta.layers.delta_residual import DeltaResidual
from deep_delta.layers.gate import BetaGate
from deep_delta.layers.hyper_connections import HyperResidual
from deep_delta.models.ddl.configuration_ddl import DDLConfig
from deep_delta.models.ddl.modeling_ddl import Attention, DDLForCausalLM, SwiGLU
from deep_delta.ops.delta.naive import unit_direction
from deep_delta.ops.hyper import stream_read_reference

# What is recorded, in plot order. Every one is a mean |value| over batch, tokens (and layers, channels):
#   embedding  the token embeddings (B, T, d)
#   attn_out   the attention sublayer's output h = o_proj(...) (B, T, d)
#   mlp_out    the MLP sublayer's output (B, T, d)
#   update     what a residual adds to its state, x_new - x ((B, T, d), (B, T, d, d_v) or HC's (B, T, d, n))
#   state      the state X after each residual ((B, T, d), (B, T, d, d_v) or HC's streams (B, T, d, n))
#   read       the sublayer's input before its norm: x for d_v = 1, the compressed read x_in for d_v > 1,
#              the streams' read h a for HC / mHC
#   kTx        u^T X with u = k / |k| the unit direction (B, T, d_v)           (DDL only)
#   v          the value, (B, T, d_v)                                             (DDL only)
#   v_logit    the value's pre-activation W_v src + b (B, T, d_v), 0 at init up to W_v's noise (DDL k-Map)
#   beta       the gate, (B, T, 1); the untied rule's erase gate                  (DDL only)
#   beta_logit the gate's pre-activation minus its initial bias (B, T, 1)         (DDL only)
#   beta_write the untied rule's write gate, (B, T, 1), and its pre-activation minus its initial bias
#   beta_write_logit                                                              (the untied rule only)
#   depth_read the softmax over depth of the sources that a sublayer's pseudo-query reads, and the readout's
#              before the final norm (B, T, d)                                    (AttnRes only)
#   coef_logit the dynamic hyper-connection's projection of the state before its squashing: HC's
#              norm(H_i)^T W (B, T, n, n+2) before tanh, mHC's RMS(vec H) phi (B, T, 2n+n^2) before alpha
#   logits     the LM head's output (B, T, vocab)
# The sigmoids bound v and beta, so a readout that grows with the width shows in the logits first.
ACTIVATIONS = ("embedding", "attn_out", "mlp_out", "update", "state", "read", "kTx", "v", "v_logit", "beta",
               "beta_logit", "beta_write", "beta_write_logit", "depth_read", "coef_logit", "logits")
# The width exponent muP aims for: 0 (a coordinate of a width-sized vector stays Theta(1)), except the two
# scalars along the unit direction u, whose coordinates are O(1/sqrt d): u^T X and v must grow like sqrt(d) for
# the write u (v - u^T X)^T to change X by Theta(1) per coordinate (docs/mup.md).
MUP_ORDER = {name: 0.0 for name in ACTIVATIONS} | {"kTx": 0.5, "v": 0.5}


def model_config(variant: str, width: int, parametrization: str, s: CoordCheckSettings) -> DDLConfig:
    fields = dict(hidden_size=width, num_hidden_layers=s.layers, num_attention_heads=width // s.head_dim,
                  vocab_size=257, max_position_embeddings=max(s.seq_len, 16), parametrization=parametrization)
    return DDLConfig.from_variant(variant, "tiny", **{**fields, **s.model})


# Bytes per parameter while a model trains here: fp32 weight, gradient and AdamW's two moments.
TRAIN_BYTES_PER_PARAMETER = 16


def memory_needed(cfg: DDLConfig, s: CoordCheckSettings) -> int:
    """A lower bound on the bytes one model of ``cfg`` needs in :func:`measure`: its parameters (counted on the
    meta device: nothing is allocated) at :data:`TRAIN_BYTES_PER_PARAMETER`, plus one fp32 activation of
    (batch, seq_len, width) per block."""
    with torch.device("meta"):
        params = sum(p.numel() for p in DDLForCausalLM(cfg).parameters())
    return params * TRAIN_BYTES_PER_PARAMETER + 4 * s.batch_size * s.seq_len * cfg.hidden_size * s.layers


def device_memory(device: str) -> int | None:
    """The total memory of ``device`` in bytes (a GPU's, or the machine's RAM for the CPU); None if unknown."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(s: CoordCheckSettings) -> None:
    """Refuse, before anything is allocated, a width whose model cannot fit in the device's memory."""
    total = device_memory(s.device)
    if total is None:
        return
    width = max(s.widths)
    need = max(memory_needed(model_config(v, width, p, s), s) for v in s.variants for p in s.parametrizations)
    if need > total:
        raise ValueError(f"`widths` got {list(s.widths)!r}: a model of width {width} needs at least "
                         f"{need / 2**30:,.1f} GiB (weights, gradients and AdamW state), more than the "
                         f"{total / 2**30:,.1f} GiB of {s.device}; allowed: smaller widths")


def text_batches(batch_size: int, seq_len: int, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (x, y) batches of (batch_size, seq_len) byte tokens from the embedded text, random windows."""
    from deep_delta.data.sources import default_texts

    tokens = torch.tensor(list("\n".join(default_texts()).encode("utf-8")), dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch_size,), generator=g)
        window = torch.stack([tokens[s: s + seq_len + 1] for s in starts.tolist()])
        out.append((window[:, :-1], window[:, 1:]))
    return out


class ActivationRecorder:
    """Forward hooks that keep each activation (detached, fp32) under its type in ``seen`` while ``on``, in the
    order the forward meets them (so two forwards of one batch pair up call by call)."""

    def __init__(self, model: DDLForCausalLM):
        self.seen: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.on = False
        self.handles = [model.model.embed_tokens.register_forward_hook(self._plain("embedding")),
                        model.lm_head.register_forward_hook(self._plain("logits"))]
        for module in model.modules():
            if isinstance(module, Attention):
                self.handles.append(module.register_forward_hook(self._plain("attn_out")))
            elif isinstance(module, SwiGLU):
                self.handles.append(module.register_forward_hook(self._plain("mlp_out")))
            elif isinstance(module, BetaGate):
                self.handles.append(module.register_forward_hook(self._gate))
            elif isinstance(module, (AdditiveResidual, DeltaResidual)):
                # every update is a forward call, the fused ones too (``emit``: the output is (x_new, Carry))
                self.handles.append(module.register_forward_hook(self._residual, with_kwargs=True))
            elif isinstance(module, HyperResidual):
                self.handles.append(module.register_forward_hook(self._hyper))
            elif isinstance(module, (AttnResidual, DepthReadout)):
                self.handles.append(module.register_forward_hook(self._depth))

    def _add(self, name: str, t: torch.Tensor) -> None:
        self.seen[name].append(t.detach().float().clone())

    def _plain(self, name: str) -> Callable:
        def hook(module, args, output):
            if self.on:
                self._add(name, output)
        return hook

    @torch.no_grad()
    def _gate(self, module: BetaGate, args, output) -> None:
        if not self.on:
            return
        logit = torch.log(output) - torch.log(module.beta_max - output) - module.bias_init  # beta_max sigmoid(.)'s inverse
        # one gate; or the untied rule's two, erase then write (BetaGate outputs=2), each its own row
        self._add("beta", output[..., :1])
        self._add("beta_logit", logit[..., :1])
        if module.outputs > 1:
            self._add("beta_write", output[..., 1:2])
            self._add("beta_write_logit", logit[..., 1:2])

    @torch.no_grad()
    def _depth(self, module: AttnResidual | DepthReadout, args, output) -> None:
        if self.on:  # what the pseudo-query reads: the softmax over depth of the sources entering it
            self._add("depth_read", module.attend(args[0]))

    @torch.no_grad()
    def _residual(self, module: AdditiveResidual | DeltaResidual, args, kwargs, output) -> None:
        if not self.on:
            return
        x = args[0]
        new = output[0] if isinstance(output, tuple) else output
        self._add("update", new - x)
        self._add("state", new)
        if isinstance(module, AdditiveResidual):  # the baseline's update reads the state itself; no k, v or beta
            self._add("read", x)
            return
        src = x if module.value_channels == 1 else (kwargs.get("x_in") if kwargs.get("x_in") is not None
                                                    else x.mean(-1))
        self._add("read", src)
        c = module.norm(src)
        self.on = False  # the branch again, unrecorded: the residual does not hand out its k
        try:
            h = module.branch(c, *args[1:], **{k: v for k, v in kwargs.items() if k not in ("x_in", "prepared", "emit")})
        finally:
            self.on = True
        k = h if module.residual_map == "k" else module.key_up(module.key_down(c))
        u, _ = unit_direction(k, module.k_eps)
        xs = x.unsqueeze(-1) if module.value_channels == 1 else x
        self._add("kTx", torch.einsum("...d,...dv->...v", u, xs.float()))
        if module.residual_map == "k":
            pre = module.value_proj(src).float()
            self._add("v_logit", pre)
            self._add("v", module.value_scale * torch.sigmoid(pre))
        elif module.value_channels == 1:
            self._add("v", module.value_scale * torch.sigmoid(module.value_proj(h).float()))
        else:
            self._add("v", module.value_proj(h))

    @torch.no_grad()
    def _hyper(self, module: HyperResidual, args, output) -> None:
        if not self.on:
            return
        h = args[0]
        self._add("update", output - h)
        self._add("state", output)
        a, _, _ = module.coefficients(h)
        self._add("read", stream_read_reference(h, a))
        if module.dynamic:
            self._add("coef_logit", _coefficient_logits(module, h.float()))

    def take(self) -> dict[str, list[torch.Tensor]]:
        """The activations recorded since the last call, by type, and reset."""
        out = {k: v for k, v in self.seen.items() if v}
        self.seen = defaultdict(list)
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _coefficient_logits(module: HyperResidual, h: torch.Tensor) -> torch.Tensor:
    """The readout of a dynamic hyper-connection (ops/hyper/naive.py), before tanh (HC) or alpha (mHC)."""
    if module.kind == "hc":
        hs = h.transpose(-1, -2)  # one row per stream, RMS-normed over d with the learned weight
        hbar = hs * torch.rsqrt(hs.square().mean(-1, keepdim=True) + module.norm_eps) * module.coef_norm.weight
        return hbar @ module.dynamic_proj
    flat = h.flatten(-2)  # the token's whole state, RMS-normed without a weight
    return (flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + module.norm_eps)) @ module.phi


class ProbeRows:
    """The trainer's callback of a coordinate check: at the start and after every step, the activations on the
    fixed probe batch (``px``, ``py``) through ``recorder``, as :func:`measure`'s rows."""

    def __init__(self, recorder: ActivationRecorder, px: torch.Tensor, py: torch.Tensor):
        self.recorder, self.px, self.py = recorder, px, py
        self.rows: list[dict[str, Any]] = []
        self.first: dict[str, list[torch.Tensor]] | None = None

    def on_train_start(self, trainer) -> None:
        self._row(trainer)

    def on_step_end(self, trainer, record: dict) -> None:
        self._row(trainer)

    def _row(self, trainer) -> None:
        device = trainer.info.device
        self.recorder.on = True
        with torch.no_grad():
            loss = trainer.model(self.px.to(device), shift_labels=self.py.to(device)).loss
        self.recorder.on = False
        now = self.recorder.take()
        self.first = self.first if self.first is not None else now
        self.rows.append({"size": {k: _mean(a.abs() for a in v) for k, v in now.items()},
                          "change": {k: _mean((a - a0).abs() for a, a0 in zip(v, self.first[k]))
                                     for k, v in now.items()},
                          "loss": loss.item()})


def measure(cfg: DDLConfig, s: CoordCheckSettings, seed: int,
            lr_multipliers: Callable[[nn.Module], dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """One model trained ``s.steps`` AdamW steps (constant lr, no decay, no clipping) through the trainer;
    ``s.steps + 1`` rows, at init and after each step: ``{"size": {type: mean |x_t|}, "change": {type: mean
    |x_t - x_0|}, "loss": the probe batch's loss}``, every activation read on one fixed probe batch (means over
    its tokens, layers and channels).

    ``lr_multipliers`` replaces the model's own (a test switches muP's learning-rate scaling off with it).
    """
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.data import BatchList
    from deep_delta.train.trainer import Trainer

    torch.manual_seed(seed)
    model = DDLForCausalLM(cfg)
    if lr_multipliers is not None:
        model.lr_multipliers = lambda: lr_multipliers(model)
    train = TrainConfig(variant=cfg.variant, preset=cfg.preset, out="coord-check", steps=s.steps,
                        batch_size=s.batch_size, seq_len=s.seq_len, lr=s.lr, warmup_steps=0, min_lr_ratio=1.0,
                        weight_decay=0.0, betas=(0.9, 0.95), grad_clip=0.0, eval_every=0, save_every=0,
                        log_every=0, seed=seed, device=s.device, dtype="float32")
    recorder = ActivationRecorder(model)
    px, py = text_batches(s.batch_size, s.seq_len, 1, seed + 7919)[0]  # the probe: not a training batch
    probe = ProbeRows(recorder, px, py)
    try:
        Trainer(train, model=model, batches=BatchList(text_batches(s.batch_size, s.seq_len, s.steps, seed)),
                callbacks=[probe], persist=False, progress=False, quiet=True).run()
    finally:
        recorder.remove()
    return probe.rows


def _mean(tensors) -> float:
    values = [t.mean().item() for t in tensors]
    return sum(values) / len(values)


def run_coord_check(s: CoordCheckSettings, progress: Callable[[str], None] | None = None,
                    lr_multipliers: Callable[[nn.Module], dict[str, float]] | None = None) -> dict[str, Any]:
    """Every (parametrization, variant, width): the per-step means averaged over seeds.

    Returns ``{"settings": ..., "results": {param: {variant: {width: [row per step, init first]}}},
    "slopes": slopes(...)}`` (widths as strings, for JSON; a row as :func:`measure` returns it).
    """
    s.validate()
    check_memory(s)
    results: dict[str, Any] = {}
    for param in s.parametrizations:
        for variant in s.variants:
            for width in s.widths:
                cfg = model_config(variant, width, param, s)
                runs = [measure(cfg, s, seed, lr_multipliers) for seed in s.seeds]
                steps = [{kind: {k: sum(r[t][kind][k] for r in runs) / len(runs) for k in runs[0][t][kind]}
                          for kind in ("size", "change")} | {"loss": sum(r[t]["loss"] for r in runs) / len(runs)}
                         for t in range(s.steps + 1)]
                results.setdefault(param, {}).setdefault(variant, {})[str(width)] = steps
                if progress is not None:
                    progress(f"{param} {variant} width {width}: logits' size "
                             + " ".join(f"{row['size']['logits']:.3g}" for row in steps) + ", change "
                             + " ".join(f"{row['change']['logits']:.3g}" for row in steps[1:]))
    return {"settings": asdict(s) | {"mup_order": MUP_ORDER}, "results": results, "slopes": slopes(results)}


def slopes(results: dict[str, Any]) -> dict[str, Any]:
    """Least-squares slope of log(mean) against log(width), per parametrization, variant, kind and type:
    ``{param: {variant: {"size": {type: [slope at init, after step 1, ...]}, "change": {type: [slope after
    step 1, ...]}}}}`` (the change at init is 0)."""
    out: dict[str, Any] = {}
    for param, by_variant in results.items():
        for variant, by_width in by_variant.items():
            widths = sorted(by_width, key=int)
            lx = [math.log(int(w)) for w in widths]
            rows = {w: by_width[w] for w in widths}
            per: dict[str, Any] = {}
            for kind, start in (("size", 0), ("change", 1)):
                names = [n for n in ACTIVATIONS if n in rows[widths[0]][0][kind]]
                per[kind] = {name: [_slope(lx, [math.log(max(rows[w][t][kind][name], 1e-30)) for w in widths])
                                    for t in range(start, len(rows[widths[0]]))] for name in names}
            out.setdefault(param, {})[variant] = per
    return out


def violations(report: dict[str, Any], bound: float = MUP_SLOPE_BOUND, parametrization: str = "mup") -> list[str]:
    """The types whose change since initialisation, after the last step, has a slope that misses its muP order
    by more than ``bound``, as ``"variant/type: slope"``; [] when ``parametrization`` passes the check. (A type
    that does not move, e.g. the embedding when nothing trains it, has no slope to check.)"""
    out = []
    for variant, per in report["slopes"].get(parametrization, {}).items():
        for name, values in per["change"].items():
            if not abs(values[-1] - MUP_ORDER[name]) <= bound:  # nan (e.g. a saturated gate's logit) fails
                out.append(f"{variant}/{name}: {values[-1]:+.2f} (muP order {MUP_ORDER[name]:+.1f})")
    return out


def coord_table(report: dict[str, Any]) -> str:
    """A Markdown table: per variant and type, the log-log slope against width of the size at init and after
    the last step, and of the change since init after the last step (the checked one), sp and mup side by
    side."""
    slopes_ = report["slopes"]
    params = list(slopes_)
    lines = ["| variant | activation | muP order | "
             + " | ".join(f"{p} size init | {p} size last | {p} change last" for p in params) + " |",
             "| --- | --- | ---: | " + " | ".join("---: | ---: | ---:" for _ in params) + " |"]
    for variant in next(iter(slopes_.values())):
        for name in ACTIVATIONS:
            if name not in slopes_[params[0]][variant]["size"]:
                continue
            cells = " | ".join(f"{slopes_[p][variant]['size'][name][0]:+.2f} | "
                               f"{slopes_[p][variant]['size'][name][-1]:+.2f} | "
                               f"**{slopes_[p][variant]['change'][name][-1]:+.2f}**" for p in params)
            lines.append(f"| {variant} | {name} | {MUP_ORDER[name]:+.1f} | {cells} |")
    return "\n".join(lines)


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def plot_coord_check(report: dict[str, Any], path) -> None:
    """One row per (variant, parametrization), one panel per activation type: the change since init, mean
    |a_t - a_0|, against width, a line per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from deep_delta.fsutil import save_figure

    results = report["results"]
    rows = [(v, p) for v in next(iter(results.values())) for p in results]
    names = [n for n in ACTIVATIONS if any(n in results[p][v][w][0]["change"] for v, p in rows for w in results[p][v])]
    fig, axes = plt.subplots(len(rows), len(names), figsize=(2.2 * len(names), 2.1 * len(rows)), squeeze=False)
    for i, (variant, param) in enumerate(rows):
        by_width = results[param][variant]
        widths = sorted(by_width, key=int)
        for j, name in enumerate(names):
            ax = axes[i][j]
            if name not in by_width[widths[0]][0]["change"]:
                ax.axis("off")
                continue
            steps = len(by_width[widths[0]]) - 1
            for t in range(1, steps + 1):
                ax.plot([int(w) for w in widths], [by_width[w][t]["change"][name] for w in widths], marker=".",
                        label=f"step {t}", color=plt.cm.viridis((t - 1) / max(1, steps - 1)))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.tick_params(labelsize=6)
            ax.set_title(f"|{name}_t - {name}_0|", fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{variant}\n{param}", fontsize=8)
    axes[0][0].legend(fontsize=5)
    fig.tight_layout()
    save_figure(fig, path, dpi=72)


def write_coord_check(out, report: dict[str, Any], bound: float) -> tuple[str, list[str]]:
    """coord_check.json, coord_check.md and (with matplotlib installed) coord_check.png in ``out``, each replaced
    atomically (the shared report stack); returns the table and the muP verdict's failures (slopes beyond
    ``bound``; none when mup did not run)."""
    from deep_delta.experiments.report import write_outputs

    settings = report["settings"]
    table = coord_table(report)
    failed = violations(report, bound) if "mup" in settings["parametrizations"] else []
    verdict = verdict_line(settings, bound, failed)
    markdown = ("# ddl coord-check\n\nLog-log slopes against width of each activation's size mean |x_t| and its "
                "change since init mean |x_t - x_0| (the checked one), on a fixed probe batch (widths "
                f"{' '.join(map(str, settings['widths']))}).\n\n{table}\n\n{verdict}\n"
                "\n![coordinate check](coord_check.png)\n")
    write_outputs(out, "coord_check", report, markdown,
                  {"coord_check.png": lambda path: plot_coord_check(report, path)})
    return table, failed


def verdict_line(settings: dict[str, Any], bound: float, failed: list[str]) -> str:
    if "mup" not in settings["parametrizations"]:
        return "mup not run"
    return (f"mup: every change's slope within {bound} of its muP order after the last step" if not failed
            else f"mup: {len(failed)} change slope(s) beyond {bound}: " + "; ".join(failed))
