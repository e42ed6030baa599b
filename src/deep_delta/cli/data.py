"""``ddl data``: prepare token shards from a text source (``prepare``), inspect a data directory (``info``) and
read every shard to check it (``verify``)."""

from __future__ import annotations

import argparse

from deep_delta.cli import options


def add_parser(sub) -> None:
    from deep_delta.data.settings import PrepareSettings

    p = sub.add_parser(
        "data",
        help="prepare token shards and inspect data directories",
        description="Prepare tokenized training data (llm.c / modded-nanogpt .bin shards plus meta.json) and "
        "inspect prepared directories.",
    )
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    data_sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    pp = data_sub.add_parser(
        "prepare",
        help="tokenize a source into train/val(/test) shards",
        description="Tokenize SOURCE into OUT/train_000000.bin, ..., OUT/val_000000.bin, ... and OUT/meta.json.\n"
        "Every document ends with the end-of-text token; the validation split (val, the selection split) is\n"
        "whole documents (about --val-fraction of the tokens, chosen deterministically along the stream), and\n"
        "so is the test split (test_*.bin, about --test-fraction of them, apart from train and val) when asked for.",
        epilog="examples:\n"
        "  ddl data prepare --out data/pydoc\n"
        "  ddl data prepare --source corpus.jsonl --tokenizer gpt2 --out data/corpus\n"
        "  ddl data prepare --source 'fineweb/sample/10BT/*.parquet' --tokenizer gpt2 --max-tokens 1B --out data/fw\n"
        "  ddl data prepare --source fineweb-edu:sample-10BT --tokenizer gpt2 --max-tokens 100M --out data/fw100m\n"
        "  ddl data prepare --source prose-v1 --val-fraction 0.02 --test-fraction 0.02 --num-proc 1 \\\n"
        "      --out ~/.cache/deep_delta/data/prose-v1-byte\n"
        "  ddl data prepare --source /usr/lib/python3/dist-packages --text-suffixes .py .md --out data/code",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_settings(pp, PrepareSettings)
    pp.set_defaults(func=run_prepare)

    pi = data_sub.add_parser(
        "info",
        help="print a data directory's meta.json and shard headers",
        description="Print DIR's meta.json summary and the header of every shard, and check that they agree. "
        "Exit code 1 if a shard is missing, corrupted or disagrees with meta.json.",
    )
    pi.add_argument("dir", metavar="DIR", help="a directory made by `ddl data prepare` (or any llm.c .bin shards)")
    pi.add_argument("--json", action="store_true", help="print meta.json and the shard headers as JSON")
    pi.add_argument("--overlap", action="store_true",
                    help="also the share of each held-out split's aligned 64-token chunks that occur verbatim anywhere "
                    "in train (reads all of train; seconds reported), over the whole split and over the windows a "
                    "`ddl compare` with its defaults evaluates")
    pi.set_defaults(func=run_info)

    pv = data_sub.add_parser(
        "verify",
        help="read every shard and check it against meta.json",
        description="Read every shard of DIR and check its header, size, checksum and largest token id against "
        "meta.json, and that every token id is below the tokenizer's vocab_size. Each problem is printed once, "
        "naming the file (and the position of a bad id). Exit code 1 on any problem.",
    )
    pv.add_argument("dir", metavar="DIR", help="a directory made by `ddl data prepare`")
    pv.add_argument("--write-metadata", action="store_true",
                    help="add the shard records (size, largest id, sha256) to meta.json of a directory prepared "
                    "without them, when nothing is wrong, so that TokenLoader starts without reading the shards")
    pv.add_argument("--json", action="store_true", help="print the shards read and the problems as JSON")
    pv.set_defaults(func=run_verify)


def run_prepare(args: argparse.Namespace) -> int:
    import time
    import warnings

    from deep_delta.cli.main import UsageError
    from deep_delta.data import DataUnavailableError, PrepareSettings, find_prepared, prepare_from
    from deep_delta.data.prepare import has_source_runs, lacks_source_runs

    settings = PrepareSettings(**options.given_settings(args, options.setting_names(PrepareSettings)))
    found = find_prepared(settings)
    if found is not None:
        print(f"{settings.out} already holds {found['source']} prepared with these settings ({found['num_tokens']:,} "
              f"tokens; meta.json and the shard headers agree): nothing to do")
        _print_splits(found)
        return 0
    adding = lacks_source_runs(settings)
    start = time.perf_counter()
    said = []
    try:
        if adding:  # source runs that could not be added (no package files here): one line, the data kept
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                meta = prepare_from(settings)
        else:
            meta = prepare_from(settings)
    except (DataUnavailableError, FileExistsError, ImportError) as e:
        raise UsageError(str(e)) from e
    seconds = time.perf_counter() - start
    for w in said:
        print(f"note: {w.message}")
    if adding and not has_source_runs(meta):
        _print_splits(meta)
        return 0
    if adding:
        print(f"{settings.out} held {meta['source']} prepared with these settings before preparation recorded where "
              f"each source's tokens lie: prepared again beside it, the same shards (their checksums), so only its "
              f"meta.json was rewritten, now with the source runs of each split ({seconds:.1f} s)")
        _print_splits(meta)
        return 0
    print(f"prepared {meta['num_tokens']:,} tokens ({meta['num_documents']:,} documents) from {meta['source']} "
          f"with the {meta['tokenizer']} tokenizer (vocab_size {meta['vocab_size']}, eot {meta['eot_token']})"
          f"{' [cut at --max-tokens]' if meta['truncated'] else ''}")
    _print_splits(meta)
    for p in meta.get("packages") or []:  # a named corpus: what each package gave
        print(f"  from {p['name']} {p['version']}: {p['documents']:,} documents, {p['bytes']:,} bytes; "
              f"{p['duplicates']:,} duplicates removed")
    skipped = meta.get("skipped_outputs") or {}
    if skipped:
        listed = "; ".join(f"{d} ({what})" for d, what in list(skipped.items())[:5])
        more = f"; and {len(skipped) - 5} more (meta.json lists them)" if len(skipped) > 5 else ""
        print(f"  skipped {len(skipped)} folder(s) our commands wrote, never read as text: {listed}{more}")
    val = meta["splits"]["val"]["num_tokens"]
    test = meta["splits"].get("test", {}).get("num_tokens", 0)
    if meta.get("split_by") == "tokens" and test:
        print(f"  split by tokens: whole documents ({meta['num_documents']:,}) cannot give --val-fraction "
              f"{meta['val_fraction']} and --test-fraction {meta['test_fraction']}, so the stream of the train, "
              f"validation and test documents is cut twice: its last {test:,} tokens are the test split and the "
              f"{val:,} before them the validation split (a document at each cut is cut in two)")
    elif meta.get("split_by") == "tokens":
        print(f"  split by tokens: whole documents ({meta['num_documents']:,}) cannot give --val-fraction "
              f"{meta['val_fraction']}, so the last {val:,} tokens of the train documents followed by the validation "
              "ones are the validation split (one document is cut in two)")
    elif val == 0:
        print("  no validation split (--val-fraction 0): train with validation off (--eval-every 0)")
    print(f"  written to {settings.out} in {seconds:.1f} s ({meta['num_tokens'] / max(seconds, 1e-9):,.0f} tokens/s)")
    return 0


def _print_splits(meta: dict) -> None:
    for split, info in meta["splits"].items():
        n = len(info["shards"])
        names = len({name for _, name in info.get("sources", [])})
        print(f"  {split:<6} {info['num_tokens']:>14,} tokens {info['num_documents']:>10,} documents "
              f"{n:>4} shard{'s' if n != 1 else ''}" + (f", {names} sources" if names else ""))


def run_info(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from deep_delta.data import inspect_data_dir

    d = Path(args.dir)
    report = inspect_data_dir(d)
    problems = list(dict.fromkeys(str(p) for p in report.problems))  # each once, in the order found
    overlap = _overlap(d, report.meta) if args.overlap and not problems else None
    if args.json:
        print(json.dumps({"meta": report.raw_meta, "shards": report.shards, "problems": problems,
                          **({"overlap": overlap[0].to_dict()} if overlap else {})}, indent=2))
        return 1 if problems else 0
    meta = report.meta
    if meta is not None and isinstance(meta.get("splits"), dict):
        print(f"{d}: {meta.get('num_tokens', 0):,} tokens from {meta.get('source')} "
              f"(tokenizer {meta['tokenizer']}, vocab_size {meta['vocab_size']}, eot {meta.get('eot_token')})")
        _print_splits(meta)
    print("shards:")
    for s in report.shards:
        status = f"{s['num_tokens']:>14,} tokens" if "num_tokens" in s else "unreadable (see the problem below)"
        print(f"  {s['file']:<22} {status}")
    for p in problems:
        print(f"problem: {p}")
    if not problems:
        print("ok: meta.json and shard headers agree")
    if overlap:
        _print_overlap(*overlap)
    elif args.overlap and problems:
        print("overlap: not measured (fix the problems above first)")
    return 1 if problems else 0


def _overlap(d, meta: dict):
    """:func:`~deep_delta.data.overlap.held_out_overlap` of ``d``, with the windows a ``ddl compare`` of its defaults
    (the recipe ``compare`` over TrainConfig's) evaluates: validation's ``eval_batches`` and the test split's
    default tokens; returns it and those settings."""
    from deep_delta.data.loader import eval_windows
    from deep_delta.data.overlap import held_out_overlap
    from deep_delta.experiments.held_out_split import DEFAULT_TEST_TOKENS, measured_batches
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.recipes import compare

    s = {**TrainConfig.defaults(), **compare()}
    seq, batch, plan = s["seq_len"], s["batch_size"], s["eval_windows"]
    counts = {name: info.get("num_tokens", 0) for name, info in (meta.get("splits") or {}).items()}
    windows = {}
    for split, count in (("val", s["eval_batches"] * batch), ("test", None)):
        total = (counts.get(split, 0) - 1) // seq
        if total < 1:
            continue
        if count is None:  # the test measurement: its default tokens, in whole batches
            count = measured_batches(min(DEFAULT_TEST_TOKENS, total * seq), seq, batch) * batch
        windows[split] = (seq, eval_windows(total, count, plan))
    return held_out_overlap(d, windows=windows), {"seq_len": seq, "batch_size": batch, "eval_batches":
                                                  s["eval_batches"], "eval_windows": plan,
                                                  "test_tokens": DEFAULT_TEST_TOKENS}


def _print_overlap(report, study: dict) -> None:
    print(f"overlap with train: aligned {report.chunk}-token chunks of each held-out split that occur verbatim in "
          f"train ({report.train_positions:,} train positions searched in {report.seconds:.1f} s)")
    for s in report.splits:
        line = f"  {s.split:<6} {s.chunks:>12,} chunks {s.found:>12,} in train ({100 * s.share:.2f}%)"
        if s.windows_chunks:
            line += (f"; in the windows a default `ddl compare` evaluates: {s.windows_chunks:,} chunks, "
                     f"{s.windows_found:,} in train ({100 * s.windows_share:.2f}%)")
        print(line)
    if not report.splits:
        print("  no held-out split (val, test) to compare")
    if any(s.windows_chunks for s in report.splits):
        print(f"  (a default `ddl compare`: windows of {study['seq_len']} tokens, {study['eval_windows']}; validation "
              f"{study['eval_batches']} batches of {study['batch_size']}; the test split's {study['test_tokens']:,} "
              "tokens of `--eval-seeds`, or all of it where it holds fewer)")


def run_verify(args: argparse.Namespace) -> int:
    import json
    import time

    from deep_delta.data import verify_data_dir

    start = time.perf_counter()
    report = verify_data_dir(args.dir, write_metadata=args.write_metadata)
    seconds = time.perf_counter() - start
    problems = list(dict.fromkeys(report.problems))  # each once, in the order found
    if args.json:
        print(json.dumps({"shards": report.shards, "problems": problems,
                          "wrote_metadata": report.wrote_metadata}, indent=2))
        return 1 if problems else 0
    tokens = sum(s["num_tokens"] for s in report.shards)
    print(f"{args.dir}: read {len(report.shards)} shard(s), {tokens:,} tokens, in {seconds:.1f} s")
    for p in problems:
        print(f"problem: {p}")
    if report.wrote_metadata:
        print(f"wrote the shard records (size, largest id, sha256) to {args.dir}/meta.json")
    elif report.missing_records and not problems:
        print(f"note: meta.json has no shard records; add them with `ddl data verify {args.dir} --write-metadata`")
    elif report.missing_records and args.write_metadata:
        print("not writing shard records: fix the problems above first")
    if not problems:
        print("ok: every shard matches meta.json and every token id is in the vocabulary")
    return 1 if problems else 0
