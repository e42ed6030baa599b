"""``ddl info``: print a variant's configuration and parameter count."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from deep_delta.variants import PRESETS, VARIANTS

    p = sub.add_parser(
        "info",
        help="print a variant's configuration and parameter count",
        description="Build the model of VARIANT at PRESET (on the meta device: no memory is used) and print "
        "its configuration and parameter count (tied embeddings counted once).",
    )
    p.add_argument("--variant", default="baseline", metavar="VARIANT",
                   help=f"model variant: {', '.join(VARIANTS)}, or a variant a design of your own registers (with "
                   "--design-module; docs/designs.md) (default: baseline)")
    p.add_argument("--design-module", metavar="MODULE", default=None,
                   help="import path or .py file of a design of your own, imported first (default: none)")
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model size (default: tiny)")
    p.add_argument("--json", action="store_true", help="print the configuration as JSON only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from deep_delta.models import DDLConfig, DDLForCausalLM, count_parameters
    from deep_delta.variants import paper_name

    module = {"design_module": args.design_module} if args.design_module else {}
    cfg = DDLConfig.from_variant(args.variant, args.preset, **module)
    with torch.device("meta"):
        model = DDLForCausalLM(cfg)
    n = count_parameters(model)
    if args.json:
        print(json.dumps({**cfg.to_diff_dict(), "parameters": n}, indent=2, sort_keys=True))
        return 0
    base_cfg = DDLConfig.from_variant("baseline", args.preset)
    with torch.device("meta"):
        base = count_parameters(DDLForCausalLM(base_cfg))
    print(f"variant   {args.variant} ({paper_name(args.variant)})")
    print(f"preset    {args.preset}")
    design = cfg.design
    print(f"residual  {design.describe(cfg)}")
    # the backbone's fields, then the design's own settings (each design names them: deep_delta.designs)
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
            "intermediate_size", "max_position_embeddings", "residual", *design.info_fields(cfg), "delta_backend"]
    mine, base_fields = cfg.to_dict(), base_cfg.to_dict()
    # every field in which the variant differs from the baseline is shown, those of the table above included
    keys += sorted(k for k in mine if k not in keys and k != "variant" and mine[k] != base_fields.get(k))
    for k in keys:
        print(f"  {k:<24} {getattr(cfg, k)}")
    extra = n - base
    print(f"parameters {n:,} ({n / 1e6:.2f}M; {extra:+,} = {100 * extra / base:+.3f}% vs baseline)")
    return 0
