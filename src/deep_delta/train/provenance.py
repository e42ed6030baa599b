"""Does a stored result belong to these settings? The one check behind every rerun and resume.

A training checkpoint, a run of ``ddl compare`` and a result of ``ddl tasks run`` are each stored with the
settings that made them and, where they read prepared data, a fingerprint of that data
(:func:`data_fingerprint`: the tokenizer and every shard's name, token count and SHA-256 as ``meta.json`` records
them). Before a stored result is continued or reused, :func:`check_belongs` compares what was stored with what is
asked now and refuses, naming each difference, when any setting that changes the result differs: a rerun never
puts numbers made under other settings, or from other data, beside new ones.

A run also records the code it trained at (:func:`code_record`: the commit of the package's git checkout and
whether its tree was clean), so that a number can be traced to the code that made it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deep_delta.fsutil import sha256_file


class StoredResultMismatch(FileExistsError):
    """A stored result (checkpoint, run, task result) was made with other settings or other data than the ones
    asked for now; the message names each difference and what to do."""


def data_fingerprint(data_dir: str | os.PathLike, meta: dict) -> str:
    """A SHA-256 over what a prepared data directory holds: its tokenizer and vocabulary, and per split each shard's
    name, token count and checksum. The checksums come from ``meta.json``'s shard records (written by ``ddl data
    prepare``); a shard without one is hashed from its file. Two directories prepared from different text differ
    here even when their token counts agree."""
    data_dir = Path(data_dir)
    entries: list[Any] = [meta.get("tokenizer"), meta.get("vocab_size")]
    splits = meta.get("splits")
    if isinstance(splits, dict) and splits:
        for name in sorted(splits):
            for shard in splits[name].get("shards", []):
                digest = shard.get("sha256") or sha256_file(data_dir / shard["file"])
                entries.append([name, shard["file"], shard["num_tokens"], digest])
    else:  # a directory without split records: every shard file as it is
        entries += [[p.name, sha256_file(p)] for p in sorted(data_dir.glob("*.bin"))]
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def differences(stored: dict, wanted: dict, *, skip: Iterable[str] = (), has: str = "stored") -> list[str]:
    """``key: <has> <stored value>, now <wanted value>`` for every key whose values differ (sorted; keys in
    ``skip`` ignored; a key missing on one side counts as None). Where both values are mappings, their entries
    are compared one by one (``settings.steps: ... 3, now 4``, not the two whole mappings)."""
    skip, found = set(skip), []
    for k in sorted(k for k in set(stored) | set(wanted) if k not in skip and stored.get(k) != wanted.get(k)):
        a, b = stored.get(k), wanted.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            found += [f"{k}.{d}" for d in differences(a, b, has=has)]
        else:
            found.append(f"{k}: {has} {a!r}, now {b!r}")
    return found


def check_belongs(stored: dict, wanted: dict, *, what: str, remedy: str, skip: Iterable[str] = (),
                  has: str = "stored") -> None:
    """Refuse (:class:`StoredResultMismatch`) to continue or reuse ``what`` when ``stored`` (its recorded settings)
    and ``wanted`` (the settings asked for now) differ in any key but ``skip``; the message names each difference,
    then ``remedy``."""
    diff = differences(stored, wanted, skip=skip, has=has)
    if diff:
        raise StoredResultMismatch(f"{what} was made with other settings ({'; '.join(diff)}); {remedy}")


def check_same_data(stored: str | None, current: str, *, what: str, data_dir: str | os.PathLike,
                    remedy: str, stored_dir: str | os.PathLike | None = None) -> bool:
    """Refuse to continue or reuse ``what`` (made from data with fingerprint ``stored``, in ``stored_dir`` when
    known) on ``data_dir`` (fingerprint ``current``) when they differ. Returns False when ``what`` has no
    fingerprint (written before fingerprints were recorded): the caller says that the data could not be checked."""
    if stored is None:
        return False
    if stored != current:
        same_dir = stored_dir is None or Path(stored_dir).resolve() == Path(data_dir).resolve()
        why = ("the shards' checksums in meta.json differ, so the directory was prepared again or changed" if same_dir
               else f"it was made from {stored_dir}, another data directory")
        raise StoredResultMismatch(
            f"{what} was made from other data than {data_dir} holds now (data fingerprint {stored[:12]}, now "
            f"{current[:12]}: {why}); {remedy}")
    return True


# seconds each git call may take: a hung git (a network file system, a lock) never holds up a run
GIT_TIMEOUT_S = 10.0


def code_record(source: str | os.PathLike | None = None, timeout: float = GIT_TIMEOUT_S) -> dict[str, Any] | None:
    """The code a run trains at: ``{"commit": <HEAD's sha>, "clean": <no change to a tracked file, no untracked file
    outside .gitignore>}`` of the git checkout holding the package (``source``: its directory, default this
    package's), or None when there is none to name: the package is not tracked by a git checkout (an installed
    wheel; a copy inside another repository's ignored directory), git is missing, fails, or takes longer than
    ``timeout`` seconds for a call."""
    where = str(Path(source) if source is not None else Path(__file__).resolve().parents[1])

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    # the package must be tracked here: a directory inside some other checkout (an ignored venv) names its commit
    if git("ls-files", "--error-unmatch", "--", "__init__.py") is None:
        return None
    commit, status = git("rev-parse", "--verify", "HEAD"), git("status", "--porcelain")
    if commit is None or status is None:
        return None
    return {"commit": commit.strip(), "clean": not status.strip()}


__all__ = ["StoredResultMismatch", "check_belongs", "check_same_data", "code_record", "data_fingerprint",
           "differences"]
