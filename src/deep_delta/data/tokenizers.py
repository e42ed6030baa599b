"""Tokenizers for data preparation: ``byte`` (no download) and ``gpt2`` (tiktoken).

Every tokenizer exposes ``name``, ``vocab_size``, ``eot_token``, ``encode(text) -> list[int]``,
``encode_batch(texts) -> list[list[int]]`` and ``decode(ids) -> str``. ``encode`` treats the text of special
tokens (``<|endoftext|>``) as plain text: only data preparation inserts the end-of-text id, between documents.
"""

from __future__ import annotations

import base64
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from deep_delta.data.errors import DataUnavailableError

TOKENIZERS = ("byte", "gpt2")
EOT_TEXT = "<|endoftext|>"
GPT2_ENV = "DDL_GPT2_BPE"
GPT2_RANKS = 50256  # mergeable tokens of GPT-2; the end-of-text token follows with id 50256
# The GPT-2 pre-tokenisation pattern, as tiktoken writes it (equivalent to the original release's regex).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_token: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus the end-of-text id 256 (``vocab_size`` 257)."""

    name = "byte"
    vocab_size = 257
    eot_token = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes decoded as UTF-8 (invalid sequences become U+FFFD); the end-of-text id becomes ``<|endoftext|>``."""
        out, run = [], bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                run.append(i)
            elif i == self.eot_token:
                out.append(run.decode("utf-8", errors="replace") + EOT_TEXT)
                run = bytearray()
            else:
                raise ValueError(f"ByteTokenizer.decode: token id {i} is outside the vocabulary 0..{self.vocab_size - 1}")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257, eot_token=256)"


class TiktokenTokenizer:
    """A tiktoken ``Encoding`` behind the tokenizer interface."""

    def __init__(self, encoding, name: str | None = None) -> None:
        self.encoding = encoding
        self.name = name or encoding.name
        self.vocab_size = int(encoding.n_vocab)
        self.eot_token = int(encoding.eot_token)
        self.num_threads: int | None = None  # threads of encode_batch; None: os.cpu_count()

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(list(texts), num_threads=self.num_threads or os.cpu_count() or 1)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(i) for i in ids])

    def __repr__(self) -> str:
        return f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size}, eot_token={self.eot_token})"


def get_tokenizer(name: str, *, bpe_file: str | os.PathLike | None = None) -> Tokenizer:
    """The tokenizer called ``name`` ("byte" or "gpt2").

    For "gpt2", the BPE comes from ``bpe_file`` or, when that is None, the file named by the environment
    variable ``DDL_GPT2_BPE``; either may be a ``.tiktoken`` ranks file, a ``vocab.bpe`` (with ``encoder.json``
    beside it), or a directory holding ``vocab.bpe`` + ``encoder.json`` or Hugging Face's ``merges.txt`` +
    ``vocab.json``. Without either, tiktoken's own ``gpt2`` encoding is used (downloaded once into its cache,
    ``$TIKTOKEN_CACHE_DIR``); offline that raises :class:`DataUnavailableError` explaining these options.
    """
    if name == "byte":
        if bpe_file is not None:
            raise ValueError(f"get_tokenizer: bpe_file is only used by the gpt2 tokenizer, got it for {name!r}")
        return ByteTokenizer()
    if name == "gpt2":
        path = bpe_file if bpe_file is not None else os.environ.get(GPT2_ENV) or None
        return _gpt2_from_file(Path(path)) if path is not None else _gpt2_from_tiktoken()
    raise ValueError(f"unknown tokenizer {name!r}; choose one of: {', '.join(TOKENIZERS)}")


def _import_tiktoken():
    from deep_delta.extras import require

    require("tiktoken", "the gpt2 tokenizer")
    import tiktoken

    return tiktoken


def _gpt2_from_tiktoken() -> Tokenizer:
    tiktoken = _import_tiktoken()
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests' ConnectionError, timeouts, a hash mismatch of a partial download
        raise DataUnavailableError(
            f"cannot load the GPT-2 BPE through tiktoken ({type(e).__name__}: {str(e)[:160]}). tiktoken downloads it once "
            f"from openaipublic.blob.core.windows.net; offline, provide it locally in one of these ways: "
            f"(1) point ${GPT2_ENV} (or --bpe-file) at GPT-2's vocab.bpe with encoder.json beside it, at a "
            f"directory holding vocab.bpe + encoder.json (or Hugging Face gpt2's merges.txt + vocab.json), or at "
            f"a gpt2 .tiktoken ranks file; or (2) copy tiktoken's cache from a machine that has it (set "
            f"$TIKTOKEN_CACHE_DIR to a directory and run `python -c \"import tiktoken; "
            f"tiktoken.get_encoding('gpt2')\"` there) and set $TIKTOKEN_CACHE_DIR to it here. See docs/data.md."
        ) from e
    return TiktokenTokenizer(encoding, name="gpt2")


def _gpt2_from_file(path: Path) -> Tokenizer:
    tiktoken = _import_tiktoken()
    ranks = load_bpe_ranks(path)
    if len(ranks) != GPT2_RANKS:
        warnings.warn(
            f"BPE file {path} has {len(ranks)} merge ranks, not GPT-2's {GPT2_RANKS}: the tokenizer works but is "
            f"not the GPT-2 vocabulary (vocab_size {len(ranks) + 1})",
            stacklevel=3,
        )
    encoding = tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={EOT_TEXT: len(ranks)}
    )
    return TiktokenTokenizer(encoding, name="gpt2")


def load_bpe_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Mergeable BPE ranks (token bytes -> rank) from a local file, see :func:`get_tokenizer` for the formats."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"BPE file {path} does not exist")
    if path.is_dir():
        for merges, vocab in (("vocab.bpe", "encoder.json"), ("merges.txt", "vocab.json")):
            if (path / merges).is_file() and (path / vocab).is_file():
                return _data_gym_ranks(path / merges, path / vocab)
        tiktoken_files = sorted(path.glob("*.tiktoken"))
        if len(tiktoken_files) == 1:
            return _tiktoken_ranks(tiktoken_files[0])
        raise FileNotFoundError(
            f"BPE directory {path} holds neither vocab.bpe + encoder.json, merges.txt + vocab.json, nor exactly one "
            f"*.tiktoken file"
        )
    if path.suffix in (".bpe", ".txt"):
        vocab = path.parent / ("encoder.json" if path.suffix == ".bpe" else "vocab.json")
        if not vocab.is_file():
            raise FileNotFoundError(f"BPE merges file {path} needs {vocab.name} beside it: {vocab} does not exist")
        return _data_gym_ranks(path, vocab)
    return _tiktoken_ranks(path)


def _tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse the ``.tiktoken`` format: one ``<base64 token> <rank>`` per line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:
            raise ValueError(
                f"BPE file {path}, line {lineno}: expected '<base64 token> <rank>' (.tiktoken format), got {line[:80]!r}"
            ) from e
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"BPE file {path}: ranks must be 0..{len(ranks) - 1}, each once")
    return ranks


@contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    # tiktoken caches every file it reads, keyed by path only; a local file must be read fresh each time.
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def _data_gym_ranks(merges: Path, vocab: Path) -> dict[bytes, int]:
    """GPT-2's original ``vocab.bpe`` + ``encoder.json`` (same formats as HF's ``merges.txt`` + ``vocab.json``)."""
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    try:
        with _tiktoken_cache_disabled():
            return data_gym_to_mergeable_bpe_ranks(str(merges), str(vocab))
    except (AssertionError, KeyError, ValueError) as e:
        raise ValueError(
            f"BPE files {merges} and {vocab} do not form a GPT-2 style BPE (merges and encoder disagree or are "
            f"malformed: {type(e).__name__}: {e})"
        ) from e
