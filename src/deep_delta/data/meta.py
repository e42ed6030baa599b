"""``meta.json`` of a prepared data directory: reading it and checking every value it holds.

A value that is there but unusable (``"vocab_size": 1e9``, ``"lots"``, an unknown tokenizer, a shard name with
a path in it) is a :class:`DataError` naming the file, the field, the value found and what is allowed, raised
when the file is read: before a model is sized from it or a path is built from it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from deep_delta.data.errors import DataError
from deep_delta.data.shards import HEADER_BYTES, MAX_TOKEN_ID, MAX_TOKENS
from deep_delta.data.tokenizers import TOKENIZERS, ByteTokenizer

META_FILE = "meta.json"
SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")  # also what TokenLoader accepts
SPLIT_BY = ("documents", "tokens", "none")  # how prepare split train/val; absent in older directories
REQUIRED = ("tokenizer", "vocab_size")  # what a model needs; check_data_dir also needs eot_token and splits


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_meta(meta: dict, path: str | os.PathLike) -> dict:
    """Check the values of ``meta`` (read from ``path``); returns ``meta``. Keys the format does not know are
    left alone; the known ones must have usable values."""

    def bad(field: str, value, allowed: str) -> DataError:
        return DataError(f"{path}: field {field!r} got {value!r}; allowed: {allowed}")

    for key in REQUIRED:
        if key not in meta:
            raise DataError(f"{path}: field {key!r} is missing; prepare the data again with `ddl data prepare`")
    tokenizer, vocab = meta["tokenizer"], meta["vocab_size"]
    if not isinstance(tokenizer, str) or tokenizer not in TOKENIZERS:
        raise bad("tokenizer", tokenizer, "one of " + ", ".join(repr(t) for t in TOKENIZERS))
    if not _is_int(vocab) or not 1 <= vocab <= MAX_TOKEN_ID + 1:
        raise bad("vocab_size", vocab, f"an integer in 1..{MAX_TOKEN_ID + 1} (shards store token ids as uint16)")
    if tokenizer == ByteTokenizer.name and vocab != ByteTokenizer.vocab_size:
        raise bad("vocab_size", vocab, f"{ByteTokenizer.vocab_size} for the byte tokenizer")
    if "eot_token" in meta:
        eot = meta["eot_token"]
        if tokenizer == ByteTokenizer.name and eot != ByteTokenizer.eot_token:
            raise bad("eot_token", eot, f"{ByteTokenizer.eot_token} for the byte tokenizer")
        if not _is_int(eot) or not 0 <= eot < vocab:
            raise bad("eot_token", eot, f"an integer in 0..{vocab - 1} (below vocab_size {vocab})")
    if "format" in meta and not isinstance(meta["format"], str):
        raise bad("format", meta["format"], "a string such as 'deep_delta.tokens/2'")
    for key in ("num_tokens", "num_documents"):
        if key in meta and not (_is_int(meta[key]) and meta[key] >= 0):
            raise bad(key, meta[key], "an integer >= 0")
    if "shard_tokens" in meta and not (_is_int(meta["shard_tokens"]) and 1 <= meta["shard_tokens"] <= MAX_TOKENS):
        raise bad("shard_tokens", meta["shard_tokens"], f"an integer in 1..{MAX_TOKENS}")
    if meta.get("max_tokens") is not None and not (_is_int(meta["max_tokens"]) and meta["max_tokens"] >= 1):
        raise bad("max_tokens", meta["max_tokens"], "null or an integer >= 1")
    for key in ("val_fraction", "test_fraction"):
        if key in meta and not (_is_number(meta[key]) and 0 <= meta[key] < 1):
            raise bad(key, meta[key], "a number in [0, 1)")
    if "test_fraction" in meta and meta["test_fraction"] + meta.get("val_fraction", 0) >= 1:
        raise bad("test_fraction", meta["test_fraction"], f"a number below 1 - val_fraction "
                  f"({meta.get('val_fraction', 0)!r})")
    if "truncated" in meta and not isinstance(meta["truncated"], bool):
        raise bad("truncated", meta["truncated"], "true or false")
    if "split_by" in meta and meta["split_by"] not in SPLIT_BY:
        raise bad("split_by", meta["split_by"], "one of " + ", ".join(repr(s) for s in SPLIT_BY))
    if "splits" in meta:
        _validate_splits(meta["splits"], path, bad)
    return meta


def _validate_splits(splits, path, bad) -> None:
    if not isinstance(splits, dict):
        raise bad("splits", splits, "an object mapping split names (train, val) to their shards")
    for name, info in splits.items():
        if not SPLIT_NAME.fullmatch(name):
            raise DataError(f"{path}: field 'splits' got a split named {name!r}; allowed: names like train, val "
                            f"(letters, digits, '.', '-')")
        where = f"splits.{name}"
        if not isinstance(info, dict):
            raise bad(where, info, "an object with num_tokens and shards")
        if not (_is_int(info.get("num_tokens")) and info["num_tokens"] >= 0):
            raise bad(f"{where}.num_tokens", info.get("num_tokens"), "an integer >= 0")
        if "num_documents" in info and not (_is_int(info["num_documents"]) and info["num_documents"] >= 0):
            raise bad(f"{where}.num_documents", info["num_documents"], "an integer >= 0")
        shards = info.get("shards", [])
        if not isinstance(shards, list):
            raise bad(f"{where}.shards", shards, "a list of {file, num_tokens} objects")
        file_name = re.compile(rf"{re.escape(name)}_\d{{6,}}\.bin")
        total = 0
        for i, shard in enumerate(shards):
            if not isinstance(shard, dict):
                raise bad(f"{where}.shards[{i}]", shard, "an object with file and num_tokens")
            file = shard.get("file")
            if not isinstance(file, str) or not file_name.fullmatch(file):
                raise bad(f"{where}.shards[{i}].file", file, f"a name like {name}_000000.bin (no directories)")
            count = shard.get("num_tokens")
            if not (_is_int(count) and 0 <= count <= MAX_TOKENS):
                raise bad(f"{where}.shards[{i}].num_tokens", count, f"an integer in 0..{MAX_TOKENS}")
            _validate_shard_record(shard, f"{where}.shards[{i}]", bad)
            total += count
        if total != info["num_tokens"]:
            raise bad(f"{where}.num_tokens", info["num_tokens"], f"the sum of its shards' num_tokens, {total}")
        if "sources" in info:
            _validate_sources(info["sources"], info["num_tokens"], f"{where}.sources", bad)


def _validate_sources(runs, num_tokens: int, where: str, bad) -> None:
    """``splits.<split>.sources``: where each named source's tokens lie, ``[first token, name]`` runs from token 0,
    their first tokens increasing and inside the split."""
    allowed = (f"[first token, name] runs in stream order: the first at 0, each later one after it and below "
               f"{num_tokens}, a non-empty name")
    if not isinstance(runs, list) or not runs:
        raise bad(where, runs, allowed)
    previous = -1
    for i, run in enumerate(runs):
        ok = (isinstance(run, list) and len(run) == 2 and _is_int(run[0]) and isinstance(run[1], str) and run[1]
              and previous < run[0] < max(num_tokens, 1) and (i or run[0] == 0))
        if not ok:
            raise bad(f"{where}[{i}]", run, allowed)
        previous = run[0]


SHARD_RECORD = ("bytes", "max_token_id", "sha256")  # written by prepare since deep_delta.tokens/3
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _validate_shard_record(shard: dict, where: str, bad) -> None:
    count = shard["num_tokens"]
    if "bytes" in shard and shard["bytes"] != HEADER_BYTES + 2 * count:
        raise bad(f"{where}.bytes", shard["bytes"], f"{HEADER_BYTES + 2 * count} (the header and {count} uint16 tokens)")
    top = shard.get("max_token_id", 0 if count else -1)
    if not (_is_int(top) and -1 <= top <= MAX_TOKEN_ID) or (count and top < 0):
        raise bad(f"{where}.max_token_id", top, f"an integer in {0 if count else -1}..{MAX_TOKEN_ID}")
    if "sha256" in shard and not (isinstance(shard["sha256"], str) and _HEX64.fullmatch(shard["sha256"])):
        raise bad(f"{where}.sha256", shard["sha256"], "64 lowercase hex digits")


def has_shard_records(meta: dict | None, split: str) -> bool:
    """Whether ``meta`` records size, largest id and checksum of every shard of ``split`` (no scan needed)."""
    info = (meta or {}).get("splits", {}).get(split)
    return bool(info and info.get("shards")) and all(all(k in s for k in SHARD_RECORD) for s in info["shards"])


def require_data_dir(data_dir: str | os.PathLike) -> Path:
    """``data_dir`` as a Path when it is a directory; else ``FileNotFoundError`` (nothing there) or
    ``NotADirectoryError`` (a file there) saying that a prepared data directory was expected."""
    d = Path(data_dir)
    if d.is_dir():
        return d
    if d.exists():
        raise NotADirectoryError(f"{d} is a file, not a directory; expected a prepared data directory (made by "
                                 "`ddl data prepare`, holding meta.json and the token shards)")
    raise FileNotFoundError(f"data directory {d} does not exist (prepare one with `ddl data prepare`)")


def read_meta(data_dir: str | os.PathLike) -> dict:
    """``meta.json`` of a prepared data directory, its values checked (:func:`validate_meta`).

    Raises ``FileNotFoundError`` when there is none and :class:`DataError` (a ``ValueError``) naming the file,
    the field, the value and what is allowed when it cannot be used.
    """
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {data_dir} a directory made by `ddl data prepare`?")
    try:
        meta = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise DataError(f"{path} is not valid JSON ({reason}{where})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} must hold a JSON object, got {type(meta).__name__}")
    return validate_meta(meta, path)
