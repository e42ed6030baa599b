"""``ddl generate``: complete a prompt with a trained model (greedy, or sampled with temperature/top-k/top-p)."""

from __future__ import annotations

import argparse
import sys

from deep_delta.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a trained model",
        description="Complete PROMPT with the model at PATH (an exported HF directory, a training checkpoint, "
        "or a training run: its checkpoints/LATEST). Decoding uses the attention KV cache and DDL's token "
        "history. Without --greedy it samples with --temperature, --top-k and --top-p.",
    )
    options.add_model(p)
    p.add_argument("--prompt", dest="prompts", action="append", required=True, metavar="TEXT",
                   help="prompt text; repeat for a batch (left-padded). An empty prompt starts from end-of-text")
    p.add_argument("--max-new-tokens", type=options.integer, default=64, metavar="N", help="tokens to generate (default 64)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (argmax); ignores the sampling options")
    p.add_argument("--temperature", type=options.real, default=1.0, metavar="T",
                   help="sampling temperature (default 1.0; 0 = greedy)")
    p.add_argument("--top-k", type=options.integer, default=None, metavar="K",
                   help="sample among the K most likely tokens (default: all)")
    p.add_argument("--top-p", type=options.real, default=None, metavar="P", help="nucleus sampling: smallest set with mass P (default: off)")
    options.add_seed(p, "random seed for sampling (default: not seeded)")
    options.add_device(p)
    options.add_dtype(p, weights=True)
    options.add_threads(p, default=None)
    p.add_argument("--tokenizer", default=None, choices=["byte", "gpt2"],
                   help="override the tokenizer saved with the model")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at every step (slow; for checks)")
    p.add_argument("--compile", action="store_true",
                   help="decode with the fixed-shape cache and one compiled step (deep_delta.hf.StaticDecoder; CUDA "
                   "graphs on CUDA): faster for long generations on a GPU, after a compilation of tens of seconds; "
                   "every prompt must have the same number of tokens")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from deep_delta.hf.generation import SamplingOptions, check_prompts, generate_text
    from deep_delta.hf.loading import load_model, quiet_transformers

    quiet_transformers()
    options.apply_threads(args.threads)
    opts = SamplingOptions(
        max_new_tokens=args.max_new_tokens,
        greedy=args.greedy,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        use_cache=not args.no_cache,
        compile=args.compile,
    )
    opts.check()  # before loading the model: bad options fail fast
    check_prompts(args.prompts)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer)
    gens, max_new = generate_text(loaded.model, loaded.tokenizer, args.prompts, opts)
    if max_new < args.max_new_tokens:
        print(f"note: generating {max_new} tokens, not {args.max_new_tokens}: the context is "
              f"{loaded.model.config.max_position_embeddings} tokens", file=sys.stderr)
    for i, g in enumerate(gens):
        if len(gens) > 1:
            print(f"--- [{i + 1}] ({g.prompt_tokens} prompt + {g.new_tokens} new tokens)")
        print(g.prompt + g.text)
    return 0
