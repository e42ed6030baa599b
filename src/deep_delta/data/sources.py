"""Where documents come from: the embedded default text, a named corpus of pinned package files
(:mod:`deep_delta.data.corpora`), local files, or FineWeb-Edu on the Hugging Face Hub.

Every source is turned into a :class:`Source`: an iterable of document strings plus a description for
``meta.json``. Records of any tabular source (jsonl lines, parquet rows, Hub rows) go through one function,
:func:`iter_texts`, which reads their ``"text"`` field.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from deep_delta.data.corpora import CORPORA, check_source_dir, corpus_documents, named_corpus
from deep_delta.data.errors import DataError, DataUnavailableError
from deep_delta.extras import require

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_DEFAULT_CONFIG = "sample-10BT"
LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")
TEXT_FIELD = "text"


@dataclass
class Source:
    """Documents (an iterable of str, possibly a one-shot stream) and what ``meta.json`` says about them; ``parts``:
    the named sources the documents come from, ``(name, number of documents)`` in order (a named corpus: its
    packages), or None (text without named sources: nothing recorded)."""

    documents: Iterable[str]
    info: dict = field(default_factory=dict)
    parts: list[tuple[str, int]] | None = None


def default_texts() -> list[str]:
    """The embedded default corpus: CPython's ``pydoc_data.topics`` (~465 KB of English), in sorted key order."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def texts_sha256(texts: Iterable[str]) -> str:
    """Fingerprint of a list of documents (changes with the Python version that ships ``pydoc_data``)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def iter_texts(records: Iterable, origin: str, *, located: bool = False) -> Iterator[str]:
    """The ``"text"`` of each record (a mapping), skipping empty ones; ``origin`` names the source in errors.

    With ``located=True`` the items are ``(where, record)`` pairs and errors name ``where`` (e.g. "line 3")
    instead of the record's index.
    """
    for i, item in enumerate(records):
        where, record = item if located else (None, item)
        prefix = f"{origin}, {where}: record" if located else f"{origin}: record {i}"
        try:
            text = record[TEXT_FIELD]
        except (KeyError, TypeError, IndexError):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"{prefix} has no {TEXT_FIELD!r} field (got {keys})") from None
        if text is None or text == "":
            continue
        if not isinstance(text, str):
            raise DataError(
                f"{prefix} has a {TEXT_FIELD!r} field of type {type(text).__name__}; allowed: a string "
                f"(null or empty to skip the record)"
            )
        yield text


def utf8_error(path: Path, error: UnicodeDecodeError, offset: int, line: int) -> DataError:
    """The error for bytes of ``path`` that are not UTF-8: ``error`` is from decoding the bytes that start at
    byte ``offset`` of the file, on line ``line``."""
    bad = error.object[error.start : min(error.end, error.start + 4)]
    return DataError(
        f"{path}, line {line}: not valid UTF-8 at byte {offset + error.start} (got 0x{bad.hex()}: "
        f"{error.reason}); allowed: UTF-8 text (convert the file, e.g. `iconv -f latin1 -t utf-8`)"
    )


# ---------------------------------------------------------------------------------------------- local files
def check_text_suffixes(text_suffixes: Iterable[str]) -> tuple[str, ...]:
    """The extra plain-text suffixes, checked: each a dot and at least one more character, none of the
    structured ones (``.jsonl``, ``.parquet``, whose records are read instead)."""
    out = tuple(text_suffixes)
    for suffix in out:
        if not isinstance(suffix, str) or len(suffix) < 2 or not suffix.startswith(".") or "/" in suffix:
            raise ValueError(f"`text_suffixes` got {suffix!r}; allowed: file suffixes such as '.py' or '.md'")
        if suffix in (".jsonl", ".parquet"):
            raise ValueError(f"`text_suffixes` got {suffix!r}; allowed: a plain-text suffix ({suffix} files are "
                             "always read as records)")
    return out


# What marks a directory as an output of ours, by the content of a file in it (a user's file of the same name, which
# does not hold what ours hold, marks nothing): prepared data (meta.json of this format family), a training run
# (run.json: its identity and settings, train/run_dir.py), a checkpoint (train_meta.json: its step and settings,
# train/run_dir.py), a comparison (compare.json: its rows, reference and machine, experiments/compare_report.py) or an
# exported model (config.json with our model_type). A preparation in progress is marked by its lock or progress
# record, whose dotted names are ours alone.
_OUTPUT_NAMES = {".prepare.lock": "a data preparation in progress",
                 ".prepare-progress.json": "a data preparation in progress"}
_OUTPUT_FILES = {
    "meta.json": ("prepared token data", lambda d: isinstance(d.get("format"), str)
                  and d["format"].startswith("deep_delta.tokens/")),
    "config.json": ("an exported model", lambda d: d.get("model_type") == "deep_delta"),
    "run.json": ("a training run", lambda d: isinstance(d.get("identity"), dict)
                 and isinstance(d.get("train_config"), dict)),
    "train_meta.json": ("a checkpoint", lambda d: isinstance(d.get("train_config"), dict)
                        and isinstance(d.get("step"), int)),
    "compare.json": ("a comparison", lambda d: isinstance(d.get("rows"), list) and isinstance(d.get("reference"), str)
                     and isinstance(d.get("machine"), dict)),
}
_MARKER_LIMIT = 64 << 20  # a file this large is read to see whether it is ours only up to here: it is not


def output_kind(directory: Path) -> str | None:
    """What output of ours ``directory`` is ("a training run (run.json)", ...), recognised by the content of its
    marker files (see ``_OUTPUT_FILES``), or None: then it is not ours, whatever its files are named."""
    for name, what in _OUTPUT_NAMES.items():
        if (directory / name).is_file():
            return f"{what} ({name})"
    for name, (what, ours) in _OUTPUT_FILES.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size > _MARKER_LIMIT:
            continue
        try:
            record = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and ours(record):
            return f"{what} ({name})"
    return None


def is_output_dir(directory: Path) -> bool:
    """Whether ``directory`` was written by one of our commands (:func:`output_kind`): such a directory is never
    read as a source, so that ``--out`` inside ``--source`` (or an earlier output there) does not feed our own
    metadata back in as text."""
    return output_kind(directory) is not None


def _outside_outputs(files: list[Path], root: Path | None,
                     exclude: Iterable[Path]) -> tuple[list[Path], dict[str, str]]:
    """``files`` without those inside an output directory of ours (below ``root``, the source directory, when
    given) or inside one of ``exclude``; and the output directories of ours that held some of them, with what each
    is (what was skipped, to be said)."""
    excluded = [Path(os.path.abspath(p)) for p in exclude]
    verdict: dict[Path, str | None] = {}

    def ours(d: Path) -> str | None:
        if d not in verdict:
            verdict[d] = "the output being written" if any(d == e for e in excluded) else output_kind(d)
        return verdict[d]

    keep, skipped = [], {}
    for f in files:
        absolute = Path(os.path.abspath(f))
        parents = list(absolute.parents)
        if root is not None:
            top = Path(os.path.abspath(root))
            parents = parents[: parents.index(top) + 1] if top in parents else parents
        owner = next((d for d in reversed(parents) if ours(d)), None)
        if owner is None and not any(e in absolute.parents for e in excluded):
            keep.append(f)
        elif owner is not None and owner not in excluded:
            skipped[str(owner)] = verdict[owner]
    return keep, skipped


def _no_files(what: str, kinds: str, found: list[Path], candidates: list[Path]) -> FileNotFoundError:
    """The error for a directory or pattern with no source files (of ``found``, the ``candidates`` had a source
    suffix but lie in output directories of ours), naming the other suffixes it holds and `text_suffixes`, which
    would read them."""
    others: dict[str, int] = {}
    for p in found:
        if p.suffix and p not in candidates:
            others[p.suffix] = others.get(p.suffix, 0) + 1
    listed = ", ".join(f"{s} ({n})" for s, n in sorted(others.items(), key=lambda x: -x[1])[:5])
    hint = (f" (it holds {listed} files: to read other text files, one document each, name their suffixes with "
            f"`text_suffixes`, e.g. {' '.join(sorted(others, key=lambda s: -others[s])[:2])})") if others else ""
    where = " outside output directories of ours" if candidates else ""
    return FileNotFoundError(f"{what} no {kinds} files{where}{hint}")


def local_files(spec: str | os.PathLike, text_suffixes: Iterable[str] = (),
                exclude: Iterable[str | os.PathLike] = ()) -> tuple[list[Path], dict[str, str]]:
    """Files named by ``spec``: one file, a directory (searched recursively), or a glob pattern; and the output
    directories of ours that were skipped ({directory: what it is}).

    From a directory or glob only ``.txt``, ``.jsonl`` and ``.parquet`` files are used, and files ending in one
    of ``text_suffixes`` (read as plain text: any UTF-8 text, source code say); an explicit file must have one of
    these suffixes. Files inside an output directory of ours (:func:`output_kind`) or inside one of ``exclude``
    (the output being written) are left out.
    """
    suffixes = LOCAL_SUFFIXES + check_text_suffixes(text_suffixes)
    kinds = "/".join(suffixes)
    exclude = [Path(os.path.expanduser(str(p))) for p in exclude]
    text = str(spec)
    if any(c in text for c in "*?["):
        found = sorted(Path(p) for p in glob.glob(os.path.expanduser(text), recursive=True) if Path(p).is_file())
        candidates = [p for p in found if p.suffix in suffixes]
        files, skipped = _outside_outputs(candidates, None, exclude)
        if not files:
            raise _no_files(f"source {text!r}: the pattern matches", kinds, found, candidates)
        return files, skipped
    path = Path(os.path.expanduser(text))
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file())
        candidates = [p for p in found if p.suffix in suffixes]
        files, skipped = _outside_outputs(candidates, path, exclude)
        if not files:
            raise _no_files(f"source directory {path} holds", kinds, found, candidates)
        return files, skipped
    if path.is_file():
        if path.suffix not in suffixes:
            raise ValueError(f"source file {path}: unsupported suffix {path.suffix!r}; allowed: {', '.join(suffixes)}")
        return [path], {}
    raise FileNotFoundError(
        f"source {text!r} is neither 'default', a named corpus ({', '.join(CORPORA)}), 'fineweb-edu[:CONFIG]', nor "
        "an existing file, directory or glob"
    )


def _read_text(path: Path) -> str:
    """The text of ``path`` with universal newlines (as ``Path.read_text``), decoded from the bytes so that an
    error can name the byte."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise utf8_error(path, e, 0, data.count(b"\n", 0, e.start) + 1) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict]]:
    """``("line N", record)`` for each non-blank line; read as bytes so a decoding error names its byte."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise utf8_error(path, e, start, lineno) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {lineno}: invalid JSON ({e.msg} at column {e.colno}); allowed: "
                                f"one JSON object per line") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}, line {lineno}: expected a JSON object, got {type(record).__name__}")
            yield f"line {lineno}", record


def _parquet_failure(path: Path, error: Exception, what: str) -> Exception:
    """pyarrow's error for ``path`` as one naming the file: an OS error (it has an errno) stays one; anything
    else (``ArrowInvalid``, pyarrow's errno-less ``OSError`` "Couldn't deserialize thrift") is corruption."""
    if isinstance(error, OSError) and error.errno is not None:
        return type(error)(error.errno, error.strerror, str(path))
    return DataError(f"{path}: {what} ({str(error).strip()[:200]}); allowed: a parquet file with a "
                     f"{TEXT_FIELD!r} column of strings")


def _parquet_records(path: Path) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    broken = (pa.ArrowException, OSError)
    with open(path, "rb") as f:  # opened here: a missing or unreadable file is an OSError naming it
        try:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
        except broken as e:
            raise _parquet_failure(path, e, "not a readable parquet file") from None
        if TEXT_FIELD not in names:
            raise DataError(f"{path}: parquet file has no {TEXT_FIELD!r} column (columns: {names})")
        batches = pf.iter_batches(batch_size=1024, columns=[TEXT_FIELD])
        row = 0
        while True:
            try:
                texts = next(batches).column(0).to_pylist()
            except StopIteration:
                return
            except broken as e:
                raise _parquet_failure(path, e, f"corrupted parquet data after row {row}") from None
            for text in texts:
                yield {TEXT_FIELD: text}
            row += len(texts)


def iter_local_documents(files: Iterable[Path]) -> Iterator[str]:
    """Documents of local files in order: ``.jsonl`` lines and ``.parquet`` rows are one document each (their
    ``"text"``); any other file (``.txt``, or a suffix the caller chose to read as text) is one document. Text
    that is not UTF-8, invalid JSON and corrupt parquet data raise :class:`DataError` naming the file and the
    line and byte, or the row."""
    for path in files:
        if path.suffix == ".jsonl":
            yield from iter_texts(_jsonl_records(path), str(path), located=True)
        elif path.suffix == ".parquet":
            yield from iter_texts(_parquet_records(path), str(path))
        else:
            text = _read_text(path)
            if text:
                yield text


# ---------------------------------------------------------------------------------------------- FineWeb-Edu
def _hub_help(config: str) -> str:
    return (
        f"To work offline, download the parquet files of {FINEWEB_REPO} (config {config}) on a machine with "
        f"access, e.g. `huggingface-cli download {FINEWEB_REPO} --repo-type dataset --include "
        f"'sample/10BT/*.parquet' --local-dir fineweb-edu`, and pass them as a local source: "
        f"--source 'fineweb-edu/sample/10BT/*.parquet' (same 'text' column)."
    )


def fineweb_records(config: str = FINEWEB_DEFAULT_CONFIG, *, data_files=None) -> Iterator[dict]:
    """Stream the rows of FineWeb-Edu ``config`` with Hugging Face ``datasets`` (``streaming=True``).

    ``data_files`` (parquet paths) loads local files through the same ``load_dataset(..., streaming=True)``
    path instead of the Hub. A Hub that cannot be reached, at the start or mid-stream, raises
    :class:`DataUnavailableError` saying how to use local parquet files instead.
    """
    require("datasets", "FineWeb-Edu")
    from datasets import load_dataset

    where = "local parquet files" if data_files is not None else f"the Hugging Face Hub ({FINEWEB_REPO}, {config})"
    try:
        if data_files is not None:
            ds = load_dataset("parquet", data_files=data_files, split="train", streaming=True)
        else:
            ds = load_dataset(FINEWEB_REPO, name=config, split="train", streaming=True)
        it = iter(ds)
    except Exception as e:
        if data_files is not None:
            raise
        raise DataUnavailableError(
            f"cannot open {where}: the Hub is unreachable or the config does not exist "
            f"({type(e).__name__}: {e}). {_hub_help(config)}"
        ) from e
    count = 0
    while True:
        try:
            record = next(it)
        except StopIteration:
            return
        except Exception as e:
            if data_files is not None:
                raise
            raise DataUnavailableError(
                f"streaming from {where} failed after {count} records ({type(e).__name__}: {e}). {_hub_help(config)}"
            ) from e
        count += 1
        yield record


def parse_fineweb(spec: str) -> str | None:
    """The config named by a ``fineweb-edu[:CONFIG]`` source, or None if ``spec`` is not one."""
    if spec == "fineweb-edu":
        return FINEWEB_DEFAULT_CONFIG
    if spec.startswith("fineweb-edu:"):
        config = spec.split(":", 1)[1]
        if not config:
            raise ValueError(f"source {spec!r}: empty config; use e.g. fineweb-edu:sample-10BT or fineweb-edu:sample-100BT")
        return config
    return None


# ---------------------------------------------------------------------------------------------- dispatch
def resolve_source(spec: str | os.PathLike, text_suffixes: Iterable[str] = (),
                   exclude: Iterable[str | os.PathLike] = (), source_dir: str | os.PathLike | None = None) -> Source:
    """The :class:`Source` for ``spec``: "default", a named corpus (``prose-v1``; ``source_dir``: a directory of
    its pre-downloaded package files), "fineweb-edu[:CONFIG]", or a local file / directory / glob
    (``text_suffixes``: more suffixes of files to read as plain text, e.g. ``(".py", ".md")``; ``exclude``:
    directories never read, the output being written)."""
    text_suffixes = check_text_suffixes(text_suffixes)
    text = str(spec)
    if not text:
        raise ValueError("source must not be empty; use 'default', 'fineweb-edu[:CONFIG]' or a local path")
    corpus = named_corpus(text)
    if text_suffixes and (text == "default" or corpus is not None or parse_fineweb(text) is not None):
        raise ValueError(f"`text_suffixes` {list(text_suffixes)} apply to local files only, got source {text!r}")
    check_source_dir(text, source_dir)
    if corpus is not None:
        documents, info = corpus_documents(corpus, source_dir)
        return Source(documents, info, [(p["name"], p["documents"]) for p in info["packages"]])
    if text == "default":
        texts = default_texts()
        return Source(
            texts,
            {"source": "default", "source_detail": "pydoc_data.topics", "source_sha256": texts_sha256(texts)},
        )
    config = parse_fineweb(text)
    if config is not None:
        return Source(iter_texts(fineweb_records(config), f"{FINEWEB_REPO}:{config}"),
                      {"source": f"fineweb-edu:{config}", "source_detail": f"{FINEWEB_REPO} (config {config})"})
    files, skipped = local_files(text, text_suffixes, exclude)
    if any(p.suffix == ".parquet" for p in files):  # before any file is read: one line naming the extra
        require("pyarrow", "reading parquet sources")
    info = {"source": text, "source_files": [str(p) for p in files]}
    if skipped:
        info["skipped_outputs"] = skipped
    if text_suffixes:
        info["text_suffixes"] = list(text_suffixes)
    return Source(iter_local_documents(files), info)
