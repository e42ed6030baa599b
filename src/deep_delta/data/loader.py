"""``TokenLoader``: deterministic, resumable, rank-aware batches from memory-mapped token shards."""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from deep_delta.data.meta import META_FILE, SPLIT_NAME, has_shard_records, read_meta, require_data_dir
from deep_delta.data.shards import ShardError, max_token_id, open_shard, read_header

if TYPE_CHECKING:  # imported where a batch is made, so that `import deep_delta.data` needs no PyTorch
    import torch


def split_shards(data_dir: str | os.PathLike, split: str) -> list[Path]:
    """The shard files ``<split>_<number>.bin`` of ``data_dir`` in numeric order (possibly empty)."""
    pattern = re.compile(rf"{re.escape(split)}_(\d+)\.bin")
    found = []
    for p in Path(data_dir).iterdir():
        m = pattern.fullmatch(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def available_splits(data_dir: str | os.PathLike) -> list[str]:
    """Names of the splits that have at least one shard in ``data_dir``."""
    names = {m.group(1) for p in Path(data_dir).iterdir() if (m := re.fullmatch(r"(.+)_\d+\.bin", p.name))}
    return sorted(names)


def missing_split_hint(split: str, meta: dict | None) -> str:
    """How to get a split that ``meta`` (None: no meta.json) does not have shards for."""
    if split == "test":
        return ("this data has no test split; prepare it again with `ddl data prepare --test-fraction F` (F > 0, "
                "e.g. 0.02) to get one")
    if split != "val":
        return "prepare the data with `ddl data prepare` (it writes the splits train and val, and test if asked)"
    why = " (it was prepared with --val-fraction 0)" if meta is not None and meta.get("val_fraction") == 0 else ""
    return (f"this data has no validation split{why}; prepare it again with `ddl data prepare --val-fraction F` "
            f"(F > 0, e.g. 0.01) to get one, or train without validation")


def token_id_error(path: Path, top: int, model_vocab: int | None, meta: dict | None,
                   meta_path: Path | None) -> ShardError | None:
    """The error for shard ``path`` whose largest token id is ``top``: beyond the model's vocabulary
    (``model_vocab``) or beyond the tokenizer's recorded in ``meta`` (``meta_path``); None when it fits both."""
    if model_vocab is not None and top >= model_vocab:
        return ShardError(
            f"token shard {path} holds token id {top}, but the model's vocabulary has {model_vocab} ids "
            f"(0..{model_vocab - 1}); prepare the data with the model's tokenizer or use a model with "
            f"vocab_size > {top}"
        )
    if meta is not None and top >= meta["vocab_size"]:
        vocab = meta["vocab_size"]
        return ShardError(
            f"token shard {path} holds token id {top}, but the {meta['tokenizer']} tokenizer of {meta_path} has "
            f"vocab_size {vocab} (ids 0..{vocab - 1}); allowed: ids below {vocab}. The shard is corrupted or "
            f"was not made with this tokenizer: prepare the data again with `ddl data prepare`"
        )
    return None


EVAL_WINDOWS = ("spread", "first")  # which windows an evaluation of part of a split reads (eval_windows)


def eval_windows(num_windows: int, count: int, windows: str) -> np.ndarray:
    """The indices, in the order read, of ``count`` of a split's ``num_windows`` windows: ``"first"`` its first
    ``count``; ``"spread"`` ``floor(i * num_windows / count)`` for ``i`` in ``0 .. count - 1``, evenly over the
    whole split (a split made of documents in source order is read in every part of it), the same for every run.
    ``count >= num_windows``: every window in file order, for either."""
    if windows not in EVAL_WINDOWS:
        raise ValueError(f"`windows` got {windows!r}; allowed: {' | '.join(EVAL_WINDOWS)}")
    count = min(count, num_windows)
    i = np.arange(count, dtype=np.int64)
    if windows == "first" or count == num_windows:
        return i
    q, r = divmod(num_windows, count)  # i * num_windows // count without the product (r < count)
    return i * q + (i * r) // count


def split_sources(meta: dict | None, split: str) -> list[tuple[int, str]] | None:
    """Where each named source's tokens lie in ``split`` of a data directory's ``meta``
    (``splits.<split>.sources``): ``(first token, name)`` runs in stream order, or None where it records none."""
    runs = ((meta or {}).get("splits", {}).get(split) or {}).get("sources")
    return None if not runs else [(int(start), str(name)) for start, name in runs]


def no_sources_reason(meta: dict | None) -> str:
    """Why data with ``meta`` records no source runs, in a few words: a named corpus prepared before they were
    recorded (and how to add them), or a source without named sources."""
    from deep_delta.data.corpora import named_corpus

    source = (meta or {}).get("source")
    if named_corpus(source) is not None:
        return (f"it was prepared from {source} before `ddl data prepare` recorded where each source's tokens lie; "
                f"the same `ddl data prepare --source {source} ...` command again adds them")
    return f"its source ({source or 'unknown'}) names no sources"


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"TokenLoader: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class TokenLoader:
    """Batches of next-token prediction from the shards of one split of a prepared data directory.

    The split's shards are read as one token stream (memory-mapped, headers checked) and cut into
    ``num_windows = (num_tokens - 1) // seq_len`` windows of ``seq_len + 1`` tokens with stride ``seq_len``
    (window ``i`` covers tokens ``[i*T, i*T + T + 1)``; windows may cross shard boundaries).

    Training order (:meth:`next_batch`): an endless stream of epochs, epoch ``e`` being a permutation of all
    windows drawn from ``numpy.random.default_rng([seed, e])``. Each optimizer step consumes the next
    ``batch_size * world_size`` windows of that stream; rank ``r`` takes the ``r``-th contiguous block of
    ``batch_size`` of them, so ranks read disjoint windows and the ranks' batches stacked in rank order are
    exactly the batch a single process with ``batch_size * world_size`` rows gets. A step may span two epochs.

    The position in the stream (:meth:`state_dict`) counts windows of the global stream, so a restored loader
    continues with exactly the batches an uninterrupted one would have produced.

    Args:
        data_dir: directory with ``<split>_000000.bin``, ... (see :func:`deep_delta.data.prepare`).
        split: split name, e.g. ``"train"`` or ``"val"``.
        batch_size: rows per batch on this rank (B).
        seq_len: tokens per row (T).
        seed: seed of the window order.
        rank, world_size: this process's rank and the number of data-parallel processes.
        vocab_size: the model's vocabulary: a token id ``>= vocab_size`` is an error.

    When ``data_dir`` has a ``meta.json`` it is read (its values checked). A token id ``>=`` its ``vocab_size``
    (the tokenizer's) is an error naming the shard, the id and the vocabulary; so is one ``>= vocab_size`` (the
    model's) when that is given. With shard records in meta.json (size, largest id, checksum; written by
    ``prepare``) the largest ids come from the records and only each shard's 1 KiB header is read at start-up
    (checked against the file size and its record); the tokens are mapped when a batch first needs them (or by
    :meth:`check_tokens_in_background`), and then checked once, in one vectorised pass, against the vocabularies
    and the record's largest id: a shard changed after preparation is an error naming it. Without
    them every shard is opened and scanned, with a warning saying how to add them. The metadata is
    ``self.meta`` (None without one).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str,
        batch_size: int,
        seq_len: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        vocab_size: int | None = None,
    ) -> None:
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.seed = _check_int("seed", seed, 0)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"TokenLoader: rank must be in [0, world_size={world_size}), got {rank}")
        if vocab_size is not None:
            vocab_size = _check_int("vocab_size", vocab_size, 1)
        if not isinstance(split, str) or not SPLIT_NAME.fullmatch(split):
            raise ValueError(f"TokenLoader: split must be a name like 'train' or 'val', got {split!r}")
        self.data_dir = Path(data_dir)
        self.split = split
        require_data_dir(self.data_dir)
        meta_path = self.data_dir / META_FILE
        self.meta = read_meta(self.data_dir) if meta_path.exists() else None
        self.files = split_shards(self.data_dir, split)
        if not self.files:
            have = ", ".join(available_splits(self.data_dir)) or "none"
            raise FileNotFoundError(
                f"no '{split}' shards ({split}_000000.bin, ...) in {self.data_dir}; splits found: {have}; "
                f"{missing_split_hint(split, self.meta)}"
            )
        self._vocab_size, self._meta_path = vocab_size, meta_path
        self._checker: threading.Thread | None = None
        self._check_error: BaseException | None = None
        if has_shard_records(self.meta, split):
            counts = self._from_records(vocab_size, meta_path)
        else:
            counts = self._scan(vocab_size, meta_path)
        self._starts = np.cumsum([0] + counts)
        self.num_tokens = int(self._starts[-1])
        if self.num_tokens < self.seq_len + 1:
            raise ValueError(
                f"split '{split}' of {self.data_dir} has {self.num_tokens} tokens, fewer than seq_len + 1 = "
                f"{self.seq_len + 1} needed for one training window; use a shorter seq_len or more data"
            )
        self.num_windows = (self.num_tokens - 1) // self.seq_len
        self._epoch = 0
        self._position = 0
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    # ------------------------------------------------------------------ opening
    def _from_records(self, vocab_size: int | None, meta_path: Path) -> list[int]:
        """Start from the shard records of meta.json: only each shard's 1 KiB header is read here (magic number,
        version, size, token count against its record); the tokens are mapped when a batch first needs them."""
        records = self.meta["splits"][self.split]["shards"]
        listed = [self.data_dir / r["file"] for r in records]
        if [p.name for p in listed] != [p.name for p in self.files]:
            unlisted = sorted({p.name for p in self.files} - {p.name for p in listed})
            missing = sorted({p.name for p in listed} - {p.name for p in self.files})
            raise ShardError(f"{self.data_dir}: the '{self.split}' shards do not match {meta_path} (not listed: "
                             f"{unlisted or 'none'}; listed but missing: {missing or 'none'}); prepare the data again")
        for path, rec in zip(listed, records):
            size = path.stat().st_size
            if size != rec["bytes"]:
                raise ShardError(f"token shard {path} has {size} bytes, but {meta_path} records {rec['bytes']} "
                                 f"({rec['num_tokens']} tokens): it is truncated or was changed after preparation; "
                                 f"check the directory with `ddl data verify {self.data_dir}`")
            if read_header(path).num_tokens != rec["num_tokens"]:
                raise ShardError(f"token shard {path} has a header of {read_header(path).num_tokens} tokens, but "
                                 f"{meta_path} records {rec['num_tokens']}; check the directory with "
                                 f"`ddl data verify {self.data_dir}`")
            error = token_id_error(path, rec["max_token_id"], vocab_size, self.meta, meta_path)
            if error is not None:
                raise error
        self._records = records
        self._shards = [None] * len(listed)
        self._locks = [threading.Lock() for _ in listed]
        return [r["num_tokens"] for r in records]

    def _scan(self, vocab_size: int | None, meta_path: Path) -> list[int]:
        """Open every shard (headers checked) and, with a vocabulary to check against, read every token."""
        self._records = None
        self._shards = [open_shard(p) for p in self.files]
        self._locks = [threading.Lock() for _ in self.files]
        if self.meta is not None:
            warnings.warn(f"{meta_path} has no shard records, so the '{self.split}' shards are read to check "
                          f"their token ids; add them once with `ddl data verify {self.data_dir} "
                          f"--write-metadata` to start without reading", stacklevel=3)
        if vocab_size is not None or self.meta is not None:
            for path, tokens in zip(self.files, self._shards):
                error = token_id_error(path, max_token_id(tokens), vocab_size, self.meta, meta_path)
                if error is not None:
                    raise error
        return [len(t) for t in self._shards]

    def _shard(self, s: int) -> np.ndarray:
        """Shard ``s``, opened on first use: its header checked against its record and, once, every token against
        the vocabularies (one vectorised pass: the record's largest id is what preparation wrote, the tokens are
        what is there now)."""
        tokens = self._shards[s]
        if tokens is not None:
            return tokens
        with self._locks[s]:  # the background check (check_tokens_in_background) may be mapping it right now
            if self._shards[s] is None:
                path, rec = self.files[s], self._records[s]
                tokens = open_shard(path)
                if len(tokens) != rec["num_tokens"]:
                    raise ShardError(f"token shard {path} has a header of {len(tokens)} tokens, but "
                                     f"{self._meta_path} records {rec['num_tokens']}; check the directory with "
                                     f"`ddl data verify {self.data_dir}`")
                top = max_token_id(tokens)
                error = token_id_error(path, top, self._vocab_size, self.meta, self._meta_path)
                if error is None and top != rec["max_token_id"]:
                    error = ShardError(f"token shard {path} holds ids up to {top}, but {self._meta_path} records "
                                       f"{rec['max_token_id']}: its tokens were changed after preparation; check "
                                       f"the directory with `ddl data verify {self.data_dir}`")
                if error is not None:
                    raise error
                self._shards[s] = tokens
        return self._shards[s]

    def check_tokens_in_background(self) -> None:
        """Map and check every shard not yet mapped (:meth:`_shard`) in a background thread, so that a damaged
        shard is named even by a run whose batches never reach it, without a pass over the data before the first
        step. The first error found is raised by the next :meth:`next_batch` or by :meth:`wait_for_token_check`."""
        if self._checker is not None or all(t is not None for t in self._shards):
            return

        def check() -> None:
            try:
                for s in range(len(self._shards)):
                    self._shard(s)
            except BaseException as e:  # kept for the training thread to raise
                self._check_error = e

        self._checker = threading.Thread(target=check, name=f"check {self.split} shards", daemon=True)
        self._checker.start()

    def wait_for_token_check(self) -> None:
        """Wait for :meth:`check_tokens_in_background` to finish; raise the error it found, if any."""
        if self._checker is not None:
            self._checker.join()
        self._raise_check_error()

    def _raise_check_error(self) -> None:
        if self._check_error is not None:
            raise self._check_error

    # ------------------------------------------------------------------ reading
    def _window(self, index: int) -> np.ndarray:
        """Tokens of window ``index``: (T + 1,) uint16."""
        start = index * self.seq_len
        end = start + self.seq_len + 1
        s = int(np.searchsorted(self._starts, start, side="right")) - 1
        pieces = []
        while start < end:
            shard = self._shard(s)
            lo = start - int(self._starts[s])
            take = min(end - start, len(shard) - lo)
            if take > 0:
                pieces.append(shard[lo : lo + take])
                start += take
            s += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _batch(self, windows) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        buf = np.stack([self._window(int(i)) for i in windows]).astype(np.int64)
        t = torch.from_numpy(buf)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            self._perm_epoch = epoch
        return self._perm

    # ------------------------------------------------------------------ training stream
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next training batch of this rank: ``x, y`` int64 tensors of shape (B, T), ``y[:, t] = x[:, t + 1]``
        in the token stream (the next-token targets)."""
        self._raise_check_error()
        need = self.batch_size * self.world_size
        taken = []
        while need > 0:
            perm = self._permutation(self._epoch)
            k = min(need, self.num_windows - self._position)
            taken.append(perm[self._position : self._position + k])
            self._position += k
            need -= k
            if self._position == self.num_windows:
                self._epoch += 1
                self._position = 0
        step = np.concatenate(taken)
        return self._batch(step[self.rank * self.batch_size : (self.rank + 1) * self.batch_size])

    @property
    def epoch(self) -> int:
        """Epoch of the next window (0-based)."""
        return self._epoch

    def state_dict(self) -> dict:
        """JSON-serialisable position in the training stream (the same on every rank)."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_windows": self.num_windows,
            "split": self.split,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict`). Batch size and world size may differ from the
        run that saved it; the data (window count), ``seq_len`` and ``seed`` must match."""
        if not isinstance(state, dict):
            raise ValueError(f"TokenLoader.load_state_dict: expected a dict, got {type(state).__name__}")
        for key in ("epoch", "position"):
            if key not in state:
                raise ValueError(f"TokenLoader.load_state_dict: missing key {key!r} (got keys {sorted(state)})")
        for key in ("seed", "seq_len", "num_windows"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"TokenLoader.load_state_dict: saved {key}={state[key]!r} but this loader has "
                    f"{key}={getattr(self, key)!r}; the data or settings changed since the state was saved"
                )
        epoch, position = state["epoch"], state["position"]
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"TokenLoader.load_state_dict: epoch must be an integer >= 0, got {epoch!r}")
        if not isinstance(position, int) or not 0 <= position < self.num_windows:
            raise ValueError(
                f"TokenLoader.load_state_dict: position must be an integer in [0, {self.num_windows}), got {position!r}"
            )
        self._epoch, self._position = epoch, position

    # ------------------------------------------------------------------ evaluation pass
    def _eval_plan(self, max_batches: int | None, windows: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The windows an evaluation reads, in order (:func:`eval_windows`), and (first position in that order,
        rows per rank) of each of its batches."""
        if max_batches is not None:
            _check_int("max_batches", max_batches, 1)
        per_step = self.batch_size * self.world_size
        count = self.num_windows if max_batches is None else min(self.num_windows, max_batches * per_step)
        order = eval_windows(self.num_windows, count, windows)
        plan, start = [], 0
        while start < count:
            rows = min(per_step, count - start) // self.world_size
            if rows == 0:
                break
            plan.append((start, rows))
            start += rows * self.world_size
        return order, plan

    def num_eval_batches(self, max_batches: int | None = None) -> int:
        """How many batches :meth:`eval_batches` yields (the same for either choice of windows)."""
        return len(self._eval_plan(max_batches, "first")[1])

    def num_eval_windows(self, max_batches: int | None = None) -> int:
        """How many windows :meth:`eval_batches` reads over all ranks (:attr:`num_windows` for the whole split, but
        for at most ``world_size - 1`` trailing ones)."""
        return sum(rows * self.world_size for _, rows in self._eval_plan(max_batches, "first")[1])

    def eval_batches(self, max_batches: int | None = None, *, windows: str = "spread",
                     sources: bool = False) -> Iterator[tuple[torch.Tensor, ...]]:
        """One deterministic pass over (part of) the split for validation: at most ``max_batches`` steps of
        ``batch_size * world_size`` windows, rank ``r`` taking the ``r``-th block of each step. ``windows``
        (:data:`EVAL_WINDOWS`) says which windows when the steps hold fewer than the split has: ``"spread"``
        evenly over the whole split, ``"first"`` its first ones (:func:`eval_windows`); the whole split is read in
        file order either way. The last step may have fewer rows (the same number on every rank; at most
        ``world_size - 1`` trailing windows are left out). Does not touch the training position.

        With ``sources`` the batches are ``(x, y, source)``: ``source`` (B, T) int64, the index in
        :attr:`source_names` of the source of each target token ``y`` (a split prepared with named sources, see
        :attr:`sources`; an error for one without)."""
        if sources and self.sources is None:
            raise ValueError(f"`sources` got True, but split '{self.split}' of {self.data_dir} records no sources "
                             f"({self.no_sources_reason()}); allowed: sources=False")
        order, plan = self._eval_plan(max_batches, windows)
        for start, rows in plan:
            first = start + self.rank * rows
            picked = order[first : first + rows]
            x, y = self._batch(picked)
            yield (x, y, self._target_sources(picked)) if sources else (x, y)

    # ------------------------------------------------------------------ sources
    @property
    def sources(self) -> list[tuple[int, str]] | None:
        """Where each source's tokens lie in the split, as ``ddl data prepare`` recorded them (meta.json's
        ``splits.<split>.sources``): ``(first token, name)`` runs in stream order; None when the data records
        none (a source without names, or data prepared before sources were recorded)."""
        return split_sources(self.meta, self.split)

    @property
    def source_names(self) -> list[str]:
        """The names of the split's sources, in the order they first appear in it (empty without sources)."""
        return list(dict.fromkeys(name for _, name in self.sources or []))

    def no_sources_reason(self) -> str:
        """Why the split records no sources, in a few words (for the one line that says so)."""
        return no_sources_reason(self.meta)

    def _target_sources(self, windows: np.ndarray) -> torch.Tensor:
        """(len(windows), T) int64: the index in :attr:`source_names` of the source of each window's target
        tokens (positions ``i*T + 1 .. i*T + T`` of the stream)."""
        import torch

        runs = self.sources
        names = self.source_names
        starts = np.array([start for start, _ in runs], dtype=np.int64)
        index = np.array([names.index(name) for _, name in runs], dtype=np.int64)
        positions = np.asarray(windows, dtype=np.int64)[:, None] * self.seq_len + 1 + np.arange(self.seq_len)
        run = np.searchsorted(starts, positions, side="right") - 1
        return torch.from_numpy(index[np.maximum(run, 0)])

    def __repr__(self) -> str:
        return (
            f"TokenLoader({str(self.data_dir)!r}, split={self.split!r}, batch_size={self.batch_size}, "
            f"seq_len={self.seq_len}, seed={self.seed}, rank={self.rank}, world_size={self.world_size}, "
            f"num_tokens={self.num_tokens}, num_windows={self.num_windows})"
        )
