"""``verify_data_dir``: read every shard of a data directory and check it against ``meta.json``.

Checked for each shard: the header (magic, version, count against the file size), the size, count, largest
id and SHA-256 recorded in ``meta.json`` (when recorded), and that every token id is below the tokenizer's
``vocab_size``. Every problem is reported once, naming the file and, for a bad id, its position. With
``write_metadata=True`` a directory without shard records (prepared before they existed) gets them, written
atomically into ``meta.json``, when nothing else is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deep_delta.data.loader import available_splits, split_shards
from deep_delta.data.meta import META_FILE, SHARD_RECORD, read_meta, require_data_dir, validate_meta
from deep_delta.data.shards import CHECKSUM, HEADER_BYTES, ShardError, read_header
from deep_delta.fsutil import atomic_write

CHUNK_BYTES = 32 << 20  # read this much of a shard at a time


@dataclass
class VerifyReport:
    """What :func:`verify_data_dir` found: one entry per shard read (``file``, ``num_tokens``, ``bytes``,
    ``max_token_id``, ``sha256``), every problem (a message naming the file), and whether shard records were
    written to ``meta.json``."""

    shards: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    missing_records: bool = False
    wrote_metadata: bool = False


def scan_shard(path: Path, vocab_size: int | None) -> tuple[dict, str | None]:
    """Read the shard at ``path`` in chunks: its record (as ``prepare`` writes it) and the problem of its first
    token id ``>= vocab_size`` (None when all fit)."""
    header = read_header(path)
    digest = hashlib.sha256()
    top, first_bad, n_bad, pos = -1, None, 0, 0
    with open(path, "rb") as f:
        digest.update(f.read(HEADER_BYTES))
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            tokens = np.frombuffer(chunk, dtype="<u2")
            if len(tokens):
                top = max(top, int(tokens.max()))
            if vocab_size is not None and top >= vocab_size:
                bad = np.flatnonzero(tokens >= vocab_size)
                if len(bad) and first_bad is None:
                    first_bad = (pos + int(bad[0]), int(tokens[bad[0]]))
                n_bad += len(bad)
            pos += len(tokens)
    record = {"file": path.name, "num_tokens": header.num_tokens, "bytes": HEADER_BYTES + 2 * header.num_tokens,
              "max_token_id": top, CHECKSUM: digest.hexdigest()}
    if first_bad is None:
        return record, None
    at, token = first_bad
    return record, (f"token shard {path}: token id {token} at position {at} (byte {HEADER_BYTES + 2 * at}) is "
                    f"outside the vocabulary (vocab_size {vocab_size}: ids 0..{vocab_size - 1}); {n_bad} such "
                    f"id(s) in the shard")


def _compare(path: Path, found: dict, listed: dict | None, meta_path: Path) -> list[str]:
    if listed is None:
        return []
    problems = []
    for key in ("num_tokens", *SHARD_RECORD):
        if key in listed and listed[key] != found[key]:
            what = "content differs from its checksum" if key == CHECKSUM else f"{key} is {found[key]}"
            problems.append(f"token shard {path}: {what}, {meta_path} records {key} {listed[key]}")
            if key in ("num_tokens", "bytes"):
                break  # the size is wrong: the checksum and largest id will differ too
    return problems


def verify_data_dir(data_dir: str | os.PathLike, *, write_metadata: bool = False) -> VerifyReport:
    """Read every shard of ``data_dir`` and check it (see the module doc); ``write_metadata`` adds missing shard
    records to ``meta.json`` when no problem was found. Raises ``FileNotFoundError`` when ``data_dir`` is not
    a directory."""
    d = Path(data_dir)
    require_data_dir(d)
    report, meta_path, meta = VerifyReport(), d / META_FILE, None
    try:
        meta = read_meta(d)
    except (ValueError, OSError) as e:
        report.problems.append(f"{e} (token ids are checked only against a usable meta.json)")
    splits = meta.get("splits", {}) if meta else {}
    vocab = meta["vocab_size"] if meta else None
    for split in sorted(set(available_splits(d)) | set(splits)):
        listed = {s["file"]: s for s in splits.get(split, {}).get("shards", [])}
        present = split_shards(d, split)
        for name in sorted(set(listed) - {p.name for p in present}):
            report.problems.append(f"token shard {d / name} is listed in {meta_path} but does not exist")
        for path in present:
            if meta is not None and path.name not in listed:
                report.problems.append(f"token shard {path} is not listed in {meta_path}")
            try:
                found, bad = scan_shard(path, vocab)
            except (ShardError, OSError) as e:
                report.problems.append(str(e))
                continue
            report.shards.append({"split": split, **found})
            report.problems += _compare(path, found, listed.get(path.name), meta_path)
            if bad is not None:
                report.problems.append(bad)
            rec = listed.get(path.name)
            if rec is not None and not all(k in rec for k in SHARD_RECORD):
                report.missing_records = True
    if write_metadata and report.missing_records and not report.problems:
        _write_records(meta, report.shards, meta_path)
        report.wrote_metadata = True
    return report


def _write_records(meta: dict, shards: list[dict], meta_path: Path) -> None:
    found = {s["file"]: s for s in shards}
    for info in meta["splits"].values():
        for shard in info.get("shards", []):
            shard.update({k: found[shard["file"]][k] for k in SHARD_RECORD})
    meta["shard_checksum"] = CHECKSUM
    validate_meta(meta, meta_path)
    atomic_write(meta_path, json.dumps(meta, indent=2) + "\n")
