"""``ddl export``: write a training checkpoint or run as a clean Hugging Face model directory."""

from __future__ import annotations

import argparse

from deep_delta.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint or run as a Hugging Face model directory",
        description="Write the model at --model (a training run: its checkpoints/LATEST; a checkpoint directory; "
        "or an HF directory) to --out with config.json, model.safetensors, generation_config.json, the "
        "tokenizer (tokenizer.json), a model card (README.md), checksums.json (verified at every load) and "
        "ddl_export.json (what export wrote). The directory then loads with AutoModelForCausalLM.from_pretrained "
        "after `import deep_delta.models`, and with AutoTokenizer. Code in the source is never run; only safetensors "
        "weights are read.",
    )
    options.add_model(p, dest="source")
    p.add_argument("--out", dest="out_dir", metavar="DIR", required=True,
                   help="directory to write (must not exist, or be empty; see --overwrite)")
    p.add_argument("--tokenizer", default=None, choices=["byte", "gpt2"],
                   help="tokenizer to save (default: the one named in train_meta.json or saved with the model)")
    options.add_dtype(p, weights=True, default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--overwrite", action="store_true",
                   help="replace an --out directory written by an earlier `ddl export` (its ddl_export.json lists "
                   "the files); a directory holding anything else is never deleted")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from deep_delta.hf.export import export_model
    from deep_delta.hf.loading import quiet_transformers

    source, out_dir = args.source, args.out_dir
    quiet_transformers()
    out = export_model(source, out_dir, tokenizer=args.tokenizer, dtype=args.dtype, overwrite=args.overwrite)
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"exported {source} -> {out}")
    print(f"  files: {files}")
    return 0
