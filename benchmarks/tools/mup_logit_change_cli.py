"""The logits' change from outside the library's own checks (issue 25): ``ddl train`` a few steps, reload two
checkpoints with ``AutoModelForCausalLM``, compare their logits on one fixed batch.

For each width (tiny preset, heads of 64, base width 256) and each --arm, run ``ddl train`` for --steps AdamW
steps at a constant lr 2e-4 (no warm-up, --min-lr-ratio 1), a checkpoint after every step, then take the mean |logits_last -
logits_first| of the step-1 and step-N checkpoints on one fixed batch of the embedded text. Prints the values
and the log-log slope against width. An arm is a name and ``--set`` assignments, e.g. the default arms:

    sp:             model.parametrization=sp
    mup:            model.parametrization=mup                 (the tied LM head)
    mup-untied:     model.parametrization=mup model.tie_word_embeddings=false

    PYTHONPATH=src python benchmarks/tools/mup_logit_change_cli.py --variant ddl-cc --work /tmp/mup_cli
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from mup_logit_change import slope, write_record  # benchmarks/tools/ is this script's directory

ARMS = {
    "sp": ["model.parametrization=sp"],
    "mup": ["model.parametrization=mup"],
    "mup-untied": ["model.parametrization=mup", "model.tie_word_embeddings=false"],
}


def train(variant: str, width: int, arm: str, a: argparse.Namespace) -> Path:
    out = Path(a.work) / f"{variant}-{arm}-{width}"
    sets = ARMS[arm] + [f"model.hidden_size={width}", f"model.num_attention_heads={width // 64}",
                        "model.mup_base_width=256"]
    cmd = [sys.executable, "-m", "deep_delta.cli.main", "train", "--variant", variant, "--preset", "tiny",
           "--out", str(out), "--overwrite", "--steps", str(a.steps), "--warmup-steps", "0", "--lr", str(a.lr),
           "--min-lr-ratio", "1.0", "--save-every", "1", "--keep", str(a.steps), "--eval-every", str(a.steps),
           "--eval-batches", "1", "--seed", "0", "--threads", "1", "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out / "checkpoints"


@torch.no_grad()
def logits(path: Path, x: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    import deep_delta.models  # noqa: F401  (registers the Auto classes)

    return AutoModelForCausalLM.from_pretrained(path).eval()(x).logits.float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="ddl-cc")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--work", default="runs/mup_logit_change_cli")
    p.add_argument("--out", default=None, help="write the record as JSON here")
    a = p.parse_args()
    torch.set_num_threads(1)
    from deep_delta.experiments.coord_check import text_batches

    x = text_batches(4, 128, 1, 12345)[0][0]  # the fixed batch
    record = {"settings": vars(a), "change": {}, "slope": {}}
    for arm in a.arms:
        changes = []
        for width in a.widths:
            ckpt = train(a.variant, width, arm, a)
            last, first = logits(ckpt / f"step_{a.steps:07d}", x), logits(ckpt / "step_0000001", x)
            changes.append((last - first).abs().mean().item())
        record["change"][arm] = dict(zip(map(str, a.widths), changes))
        record["slope"][arm] = slope(a.widths, changes)
        print(f"{a.variant} {arm:11s} |logits_{a.steps} - logits_1|: " + " ".join(f"{c:.4f}" for c in changes)
              + f"  slope {record['slope'][arm]:+.2f}", flush=True)
    write_record(a.out, record)


if __name__ == "__main__":
    main()
