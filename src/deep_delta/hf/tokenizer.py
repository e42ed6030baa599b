"""Hugging Face tokenizers for the project's tokenizers, built offline and saved beside the weights.

- "byte": ids are the raw UTF-8 bytes (0..255) plus ``<|endoftext|>`` = 256 (vocab 257).
- "gpt2": tiktoken's GPT-2 encoding (vocab 50257, ``<|endoftext|>`` = 50256) converted to a byte-level
  BPE ``tokenizer.json`` whose ids equal tiktoken's ranks.

Both are plain :class:`transformers.PreTrainedTokenizerFast` objects backed by a ``tokenizer.json``, so a
saved directory loads with ``AutoTokenizer.from_pretrained(dir)`` without importing this package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from transformers import PreTrainedTokenizerFast

TOKENIZER_NAMES = ("byte", "gpt2")
EOT = "<|endoftext|>"


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the one the ByteLevel pre-tokenizer uses).

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to chars 256, 257, ... in order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _to_symbol(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def _wrap(tok, *, eot: str, model_max_length: int | None) -> PreTrainedTokenizerFast:
    # decoder-only generation pads on the left
    # split_special_tokens: the text "<|endoftext|>" is encoded as plain text, as the training tokenizer does;
    # only the id itself (256 / 50256) is the end-of-text token
    kwargs = dict(tokenizer_object=tok, eos_token=eot, bos_token=eot, pad_token=eot, unk_token=None,
                  padding_side="left", split_special_tokens=True)
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(**kwargs)


def byte_tokenizer(model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """Byte tokenizer: ``encode(text) == list(text.encode("utf-8"))``; ``<|endoftext|>`` is id 256."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    vocab = {sym: b for b, sym in byte_to_unicode().items()}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], fuse_unk=False))
    # no regex split: every byte becomes its own token, whitespace included
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    if tok.token_to_id(EOT) != 256:
        raise RuntimeError(f"byte tokenizer: {EOT} got id {tok.token_to_id(EOT)}, expected 256")
    return _wrap(tok, eot=EOT, model_max_length=model_max_length)


def _merges_from_ranks(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every pair (a, b) with a, b and a + b in the vocabulary, ordered by the rank of a + b.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank; a BPE model whose merge
    priority is the rank of the merged token, with every split listed, makes the same choices.
    """
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            a, b = token[:i], token[i:]
            if a in ranks and b in ranks:
                merges.append((rank, ranks[a], ranks[b], a, b))
    merges.sort()
    return [(a, b) for _, _, _, a, b in merges]


def tokenizer_from_tiktoken(encoding, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE HF tokenizer with the same ids as a ``tiktoken.Encoding`` (e.g. "gpt2")."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    ranks: dict[bytes, int] = encoding._mergeable_ranks
    specials: dict[str, int] = encoding._special_tokens
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(
            f"tiktoken encoding {encoding.name!r}: every single byte must be a token for a byte-level BPE; "
            f"missing {len(missing)} (first: {missing[:5]})"
        )
    vocab = {_to_symbol(t): r for t, r in ranks.items()}
    merges = [(_to_symbol(a), _to_symbol(b)) for a, b in _merges_from_ranks(ranks)]
    # ignore_merges: a pre-token that is itself in the vocabulary is one token, as in tiktoken
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(encoding._pat_str), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for text, idx in sorted(specials.items(), key=lambda kv: kv[1]):
        tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        if tok.token_to_id(text) != idx:
            raise ValueError(
                f"tiktoken encoding {encoding.name!r}: special token {text!r} has id {idx}, but the next free "
                f"HF id is {tok.token_to_id(text)} (special ids must follow the ranks contiguously)"
            )
    eot = EOT if EOT in specials else next(iter(specials), None)
    if eot is None:
        raise ValueError(f"tiktoken encoding {encoding.name!r} has no special end-of-text token")
    return _wrap(tok, eot=eot, model_max_length=model_max_length)


def gpt2_encoding():
    """tiktoken's "gpt2" encoding, through the training-side tokenizer so both use the same ranks.

    Offline, tiktoken needs its BPE file in a local cache (see docs/data.md); the error says how.
    """
    from deep_delta.data import get_tokenizer

    train_tok = get_tokenizer("gpt2")
    enc = getattr(train_tok, "encoding", None)
    if enc is None or not hasattr(enc, "_mergeable_ranks"):
        raise RuntimeError(
            f"deep_delta.data.get_tokenizer('gpt2') returned {type(train_tok).__name__} without a tiktoken "
            "Encoding in `.encoding`; cannot build the Hugging Face tokenizer"
        )
    return enc


def build_tokenizer(name: str, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """The HF tokenizer of the training tokenizer ``name`` ("byte" | "gpt2"); ids agree with
    ``deep_delta.data.get_tokenizer(name)``."""
    if name == "byte":
        return byte_tokenizer(model_max_length)
    if name == "gpt2":
        return tokenizer_from_tiktoken(gpt2_encoding(), model_max_length)
    raise ValueError(f"tokenizer: got {name!r}; allowed: {' | '.join(TOKENIZER_NAMES)}")


def save_tokenizer(name: str, out_dir: str | os.PathLike, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """Write the HF tokenizer files of ``name`` into ``out_dir`` (tokenizer.json, tokenizer_config.json)."""
    tok = build_tokenizer(name, model_max_length)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok
