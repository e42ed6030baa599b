"""How much a few AdamW steps change the logits, against width, under sp and muP (issue 25).

For each variant, parametrization and width (the tiny preset: 4 blocks, vocabulary 512, heads of --head-dim,
base width 256), train a fresh model --steps AdamW steps at a constant learning rate (no warm-up) with the
package's trainer (its step: clipping at 1.0; the optimizer ``ddl train`` builds: the model's muP groups), on random windows of the embedded text (byte tokens). After
every step, take the mean |logits_t - logits_0| on one fixed batch (not a training batch). muP promises this
change flat in width; under sp it grows about like the width. Prints the log-log slopes over the widths.

The change is also split by where it comes from: the logits with only the token embedding moved (``emb``;
tied, the embedding is the LM head), and with everything but the embedding moved (``body``); and by token:
the tokens some training batch has as a target (``seen``) and the rest of the vocabulary (``unseen``; the
byte text uses about 90 of the 512 ids). ``logp`` is the change of the log-probabilities.

Candidates for a width-dependent update, each switched on its own:
    --eps E                Adam's epsilon in every group (default: AdamW's 1e-8)
    --weight-decay W       (default 0.1, as ``ddl train``)
    --grad-clip C          (default 1.0, as ``ddl train``; 0 disables)
    --readout-lr-mult R    the DDL readouts' (gate and value projections) lr multiplier replaced by R (muP: 1/m)
    --untie                ``tie_word_embeddings=False``: the LM head its own weight (under muP zero at init)

    PYTHONPATH=src python benchmarks/tools/mup_logit_change.py \
        --out benchmarks/records/YYYY-MM-DD-mup-logit-change-cpu/tied.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from deep_delta.experiments.coord_check import text_batches
from deep_delta.models import DDLConfig, DDLForCausalLM

PARTS = ("emb", "body", "seen", "unseen", "body_seen", "body_unseen", "logp")


def slope(widths: list[int], values: list[float]) -> float:
    xs = [math.log(w) for w in widths]
    ys = [math.log(max(v, 1e-30)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def config(variant: str, width: int, param: str, a: argparse.Namespace) -> DDLConfig:
    return DDLConfig.from_variant(variant, "tiny", hidden_size=width, num_attention_heads=width // a.head_dim,
                                  num_hidden_layers=a.layers, parametrization=param,
                                  mup_base_width=a.base_width, max_position_embeddings=max(a.seq_len, 16),
                                  tie_word_embeddings=not a.untie)


@torch.no_grad()
def logits_with(model: DDLForCausalLM, x: torch.Tensor, swap: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The logits on ``x``, with the parameters named in ``swap`` replaced for this one forward."""
    params = dict(model.named_parameters())
    kept = {}
    for name, value in (swap or {}).items():
        kept[name] = params[name].detach().clone()
        params[name].copy_(value)
    try:
        return model(x).logits.float()
    finally:
        for name, value in kept.items():
            params[name].copy_(value)


class LogitChange:
    """The trainer's callbacks of one run: Adam's epsilon set once the optimizer exists, the median |gradient|
    entries before each update (after clipping), and after each step the change of the logits on the probe
    batch, whole and by part."""

    def __init__(self, model: DDLForCausalLM, probe: torch.Tensor, seen: torch.Tensor, eps: float | None):
        self.model, self.probe, self.seen, self.eps = model, probe, seen, eps
        self.params0 = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.logits0 = logits_with(model, probe)
        self.rows: list[dict] = []
        self.grads: dict[str, float] = {}
        self.after1 = None

    def on_train_start(self, trainer) -> None:
        if self.eps is not None:
            for group in trainer.optimizer.param_groups:
                group["eps"] = self.eps

    def on_before_update(self, trainer) -> None:
        self.grads = {n: p.grad.abs().median().item() for n, p in self.model.named_parameters() if p.grad is not None}

    def on_step_end(self, trainer, record: dict) -> None:
        model, probe, logits0, seen = self.model, self.probe, self.logits0, self.seen
        now = logits_with(model, probe)
        emb_only = logits_with(model, probe, {n: v for n, v in self.params0.items() if n != EMB})
        body_only = logits_with(model, probe, {EMB: self.params0[EMB]})
        self.after1 = now if self.after1 is None else self.after1
        grads = self.grads
        self.rows.append({"change": (now - logits0).abs().mean().item(),
                          "emb": (emb_only - logits0).abs().mean().item(),
                          "body": (body_only - logits0).abs().mean().item(),
                          "body_seen": (body_only - logits0)[..., seen].abs().mean().item(),
                          "body_unseen": (body_only - logits0)[..., ~seen].abs().mean().item(),
                          "seen": (now - logits0)[..., seen].abs().mean().item(),
                          "unseen": (now - logits0)[..., ~seen].abs().mean().item(),
                          "size": now.abs().mean().item(),
                          "logp": (now.log_softmax(-1) - logits0.log_softmax(-1)).abs().mean().item(),
                          # the median |gradient| entry (after clipping) of the embedding, and the smallest over
                          # layers of q_proj's: what Adam's epsilon would have to rival
                          "median_grad_emb": grads.get(EMB, 0.0),
                          "median_grad_q": min(v for n, v in grads.items() if n.endswith("q_proj.weight"))})


EMB = "model.embed_tokens.weight"


def run_one(variant: str, width: int, param: str, a: argparse.Namespace) -> dict:
    """One model through the package's trainer (a run kept in memory): constant lr (no warm-up, no decay of it),
    weight decay ``a.weight_decay``, betas (0.9, 0.95), clipping at ``a.grad_clip``, on ``text_batches``."""
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.data import BatchList
    from deep_delta.train.trainer import Trainer

    torch.manual_seed(a.seed)
    model = DDLForCausalLM(config(variant, width, param, a)).train()
    rule = model.lr_multipliers
    readouts = [n for n in rule() if n.endswith(("gate.proj.weight", "value_proj.weight"))]
    if a.readout_lr_mult is not None:
        model.lr_multipliers = lambda: rule() | {n: a.readout_lr_mult for n in readouts}
    batches = text_batches(a.batch_size, a.seq_len, a.steps + 1, a.seed)
    probe = batches[0][0]  # the fixed batch the logits are read on; the steps train on batches[1:]
    seen = torch.zeros(model.config.vocab_size, dtype=torch.bool)  # the tokens some training batch has as a target
    for _, y in batches[1:]:
        seen[y.flatten()] = True
    watch = LogitChange(model, probe, seen, a.eps)
    run = TrainConfig(variant=variant, out="runs/mup_logit_change/unused", steps=a.steps, batch_size=a.batch_size,
                      seq_len=a.seq_len, lr=a.lr, warmup_steps=0, min_lr_ratio=1.0, weight_decay=a.weight_decay,
                      betas=(0.9, 0.95), grad_clip=a.grad_clip, eval_every=0, save_every=0, log_every=0, seed=a.seed,
                      device="cpu", dtype="float32")
    Trainer(run, model=model, batches=BatchList(batches[1:]), callbacks=[watch], persist=False, progress=False,
            quiet=True).run()
    return {"size0": watch.logits0.abs().mean().item(), "steps": watch.rows,
            "change_1_to_last": (logits_with(model, probe) - watch.after1).abs().mean().item()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["baseline", "ddl-cc"])
    p.add_argument("--parametrizations", nargs="+", default=["sp", "mup"])
    p.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--base-width", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eps", type=float, default=None)
    p.add_argument("--readout-lr-mult", type=float, default=None)
    p.add_argument("--untie", action="store_true", help="tie_word_embeddings=False (muP: the head starts at zero)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write the record as JSON here")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    record = {"settings": vars(a), "runs": {}, "slopes": {}}
    for param in a.parametrizations:
        for variant in a.variants:
            t0 = time.time()
            runs = {w: run_one(variant, w, param, a) for w in a.widths}
            key = f"{variant}/{param}"
            record["runs"][key] = runs
            per_step = [slope(a.widths, [runs[w]["steps"][t]["change"] for w in a.widths]) for t in range(a.steps)]
            last = [runs[w]["steps"][-1] for w in a.widths]
            c1 = [runs[w]["change_1_to_last"] for w in a.widths]
            record["slopes"][key] = {"change": per_step, "change_1_to_last": slope(a.widths, c1)} | {
                k: slope(a.widths, [r[k] for r in last]) for k in PARTS + ("size",)}
            print(f"{key:18s} change after step {a.steps}: " + " ".join(f"{r['change']:.4f}" for r in last)
                  + "  step 1 to last: " + " ".join(f"{c:.4f}" for c in c1)
                  + f" ({record['slopes'][key]['change_1_to_last']:+.2f})"
                  + "  slope per step " + " ".join(f"{v:+.2f}" for v in per_step)
                  + "".join(f"  {k} {record['slopes'][key][k]:+.2f}" for k in PARTS)
                  + "  |g| emb " + " ".join(f"{r['median_grad_emb']:.1e}" for r in last)
                  + "  |g| q " + " ".join(f"{r['median_grad_q']:.1e}" for r in last)
                  + f"  ({time.time() - t0:.0f}s)", flush=True)
    write_record(a.out, record)


def write_record(path: str | None, record: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
