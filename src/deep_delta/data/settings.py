"""What ``ddl data prepare`` and :func:`deep_delta.data.prepare` take: :class:`PrepareSettings`, each field with the
help of its flag, the defaults (stated here once) and their checks. No PyTorch: the command line's parser reads it.

    from deep_delta.data import PrepareSettings, prepare_from

    meta = prepare_from(PrepareSettings(source="corpus.jsonl", tokenizer="gpt2", out="data/corpus"))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deep_delta.data.corpora import check_source_dir
from deep_delta.data.shards import MAX_TOKENS
from deep_delta.data.sources import check_text_suffixes
from deep_delta.data.tokenizers import TOKENIZERS
from deep_delta.settings import check_count, check_fields, setting

DEFAULT_VAL_FRACTION = 0.01
DEFAULT_SHARD_TOKENS = 100_000_000  # as modded-nanogpt's FineWeb shards


@dataclass(kw_only=True)
class PrepareSettings:
    """How :func:`deep_delta.data.prepare` tokenizes a source into shards; each field's metadata holds the help
    of its ``ddl data prepare`` flag (``--field-name``). ``out`` has no default: it is required."""

    source: str = setting("default", "'default' (CPython's pydoc_data.topics text, embedded), 'prose-v1' (English "
                          "documentation prose from 13 pinned Debian packages, fetched once with apt-get; docs/data.md), "
                          "'fineweb-edu[:CONFIG]' (Hugging Face Hub, CONFIG e.g. sample-10BT (default) or "
                          "sample-100BT), or a local .txt / .jsonl / .parquet file, directory or glob")
    source_dir: str | None = setting(None, "with a named corpus (prose-v1): a directory holding its package files, "
                                     "downloaded beforehand, read instead of fetching them (default: fetched once "
                                     "with apt-get into ~/.cache/deep_delta/sources/NAME, or $DDL_CACHE_DIR/sources)",
                                     metavar="DIR")
    text_suffixes: tuple[str, ...] = setting((), "with a local directory or glob: also read files ending in these "
                                             "suffixes as plain text, one document per file (e.g. --text-suffixes "
                                             ".py .md .rst; every such file must be UTF-8) (default: only .txt / "
                                             ".jsonl / .parquet)", metavar="SUFFIX")
    tokenizer: str = setting("byte", "byte: UTF-8 bytes + EOT (vocab 257); gpt2: tiktoken GPT-2 BPE (vocab 50257)",
                             choices=TOKENIZERS)
    out: str = setting(help="output directory (created)", metavar="DIR")
    val_fraction: float = setting(DEFAULT_VAL_FRACTION, "share of tokens in the validation split (val, the "
                                  "selection split), in [0, 1)", metavar="F", parse="fraction")
    test_fraction: float = setting(0.0, "share of tokens in the test split (test_*.bin: whole documents apart from "
                                   "train and val), in [0, 1), 0 for none; val and test fractions must add up to "
                                   "less than 1", metavar="F", parse="fraction")
    shard_tokens: int = setting(DEFAULT_SHARD_TOKENS, "tokens per shard file", metavar="N", parse="count")
    max_tokens: int | None = setting(None, "stop after N tokens in all, every split counted (train + val + test, "
                                     "split by the fractions); the last document is cut (default: no cap)",
                                     metavar="N", parse="count")
    bpe_file: str | None = setting(None, "local GPT-2 BPE for --tokenizer gpt2: vocab.bpe (+ encoder.json beside it), "
                                   "a directory with vocab.bpe + encoder.json or merges.txt + vocab.json, or a "
                                   ".tiktoken file (default: $DDL_GPT2_BPE, else tiktoken's download cache)",
                                   metavar="PATH")
    overwrite: bool = setting(False, "replace OUT if it is not empty (only if it holds nothing but shards and "
                              "meta.json)")
    num_proc: int | None = setting(None, "tokenizing processes; the shards are the same for any N (default: the "
                                   "CPUs available)", metavar="N", parse="count")
    progress: bool = setting(True, "a progress bar while tokenizing (shown on a terminal only)")

    def __post_init__(self):
        check_fields(self)  # the types, from the annotations (a path becomes a string, a list a tuple)
        check_sharding(self.val_fraction, self.shard_tokens, self.max_tokens, self.test_fraction,
                       owner="PrepareSettings")
        check_optional_count("num_proc", self.num_proc, "the CPUs available", owner="PrepareSettings")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"PrepareSettings: `tokenizer` got {self.tokenizer!r}; allowed: {' | '.join(TOKENIZERS)}")
        if self.bpe_file is not None and self.tokenizer != "gpt2":
            raise ValueError(f"PrepareSettings: `bpe_file` got {self.bpe_file!r} with `tokenizer` {self.tokenizer!r}; "
                             "allowed: a BPE file only with `tokenizer` gpt2")
        check_text_suffixes(self.text_suffixes)
        check_source_dir(self.source, self.source_dir, owner="PrepareSettings")


def check_sharding(val_fraction: Any, shard_tokens: Any, max_tokens: Any, test_fraction: Any = 0.0, *,
                   owner: str = "") -> None:
    """The checks of what shapes the shards, :class:`PrepareSettings`' and ``write_dataset``'s: ``val_fraction``
    and ``test_fraction`` in [0, 1) with a sum below 1, ``shard_tokens`` in [1, MAX_TOKENS] (a shard's header
    holds its count in an int32), ``max_tokens`` >= 1 or None. A ``ValueError`` names ``owner`` (a class, or
    nothing), the field, what it got, what is allowed."""
    prefix = owner + ": " if owner else ""
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{prefix}`{name}` got {value!r}; allowed: a number in [0, 1)")
    if val_fraction + test_fraction >= 1:
        raise ValueError(f"{prefix}`val_fraction` {val_fraction!r} and `test_fraction` {test_fraction!r} add up to "
                         f"{val_fraction + test_fraction:g}; allowed: a sum below 1 (the rest is the train split)")
    check_count("shard_tokens", shard_tokens, 1, MAX_TOKENS, owner=owner)
    check_optional_count("max_tokens", max_tokens, "no cap", owner=owner)


def check_optional_count(name: str, value: Any, none: str, *, owner: str = "") -> Any:
    """``value`` as an integer >= 1 or None (meaning ``none``); else a ``ValueError`` naming ``owner``, the field
    ``name``, what it got and what is allowed."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{owner + ': ' if owner else ''}`{name}` got {value!r}; allowed: an integer >= 1, or None "
                         f"({none})")
    return value
