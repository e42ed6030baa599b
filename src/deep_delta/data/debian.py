"""Debian package files as a text source: the pinned packages of a named corpus, fetched once with ``apt-get
download`` (or found in a directory of pre-downloaded files), checked against their SHA-256, and read without
installing or extracting them to disk.

A ``.deb`` is an ``ar`` archive whose ``data.tar.{xz,gz,bz2}`` member holds the package's files; :func:`deb_files`
reads the files a caller selects from it, in the order the archive holds them.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deep_delta.data.errors import DataError, DataUnavailableError
from deep_delta.fsutil import sha256_file

MIRROR = "http://deb.debian.org/debian"
_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60
_TAR_MODES = {"data.tar.xz": "r|xz", "data.tar.gz": "r|gz", "data.tar.bz2": "r|bz2", "data.tar": "r|"}


@dataclass(frozen=True)
class DebPackage:
    """One pinned Debian binary package: its name, version (epoch included), path in a Debian mirror's pool and the
    SHA-256 of the file."""

    name: str
    version: str
    pool: str
    sha256: str

    @property
    def file_name(self) -> str:
        """The file's name in the pool (``git-doc_2.39.5-0+deb12u3_all.deb``), which the cache uses too."""
        return self.pool.rsplit("/", 1)[-1]

    @property
    def url(self) -> str:
        return f"{MIRROR}/{self.pool}"

    def local_names(self) -> tuple[str, ...]:
        """Names the file may have in a directory of downloads: the pool's, and ``apt-get download``'s (the epoch
        written as ``%3a``)."""
        arch = self.file_name.rsplit("_", 1)[-1]
        return tuple(dict.fromkeys((self.file_name, f"{self.name}_{self.version.replace(':', '%3a')}_{arch}")))

    def record(self) -> dict:
        return {"name": self.name, "version": self.version, "file": self.file_name, "sha256": self.sha256}


def deb_files(path: Path, select: Callable[[str], object]) -> Iterator[tuple[str, bytes]]:
    """``(name, content)`` of each regular file of the package ``path`` whose name (``usr/share/doc/...``, no
    leading ``./``) ``select`` accepts (returns a true value for), in archive order. A file that is not a Debian package, or whose data is
    compressed in a way Python cannot read (``data.tar.zst``), is a :class:`DataError` naming it."""
    with open(path, "rb") as f:
        if f.read(len(_AR_MAGIC)) != _AR_MAGIC:
            raise DataError(f"{path}: not a Debian package (no ar archive header); allowed: a .deb file")
        while True:
            header = f.read(_AR_HEADER)
            if len(header) < _AR_HEADER:
                raise DataError(f"{path}: a Debian package without a data.tar member; allowed: a .deb file")
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            try:
                size = int(header[48:58])
            except ValueError:
                raise DataError(f"{path}: a damaged ar member header ({header[:16]!r}); allowed: a .deb file") from None
            if name.startswith("data.tar"):
                break
            f.seek(size + (size & 1), os.SEEK_CUR)
        mode = _TAR_MODES.get(name)
        if mode is None:
            raise DataError(f"{path}: its files are in {name}, which Python cannot read; allowed: a .deb whose data "
                            f"is {', '.join(_TAR_MODES)} (repack it, e.g. `dpkg-deb --fsys-tarfile FILE | xz`)")
        try:
            with tarfile.open(fileobj=f, mode=mode) as archive:
                for member in archive:
                    name = member.name[2:] if member.name.startswith("./") else member.name
                    if member.isreg() and select(name):
                        yield name, archive.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as e:
            if isinstance(e, OSError) and e.errno is not None:
                raise
            raise DataError(f"{path}: damaged package data ({type(e).__name__}: {e}); allowed: an intact .deb (fetch "
                            "it again)") from None


def _check_sha256(path: Path, package: DebPackage, corpus: str) -> Path:
    got = sha256_file(path)
    if got != package.sha256:
        raise DataError(f"{path}: sha256 {got}, but {corpus} pins {package.name} {package.version} with sha256 "
                        f"{package.sha256}; allowed: that exact file ({package.url}); remove this one")
    return path


def _download_help(packages: Iterable[DebPackage], corpus: str) -> str:
    return ("Provide the package files instead: download " + ", ".join(p.url for p in packages) + " (or the same "
            "files from snapshot.debian.org once the mirror has dropped these versions) into a directory and pass it "
            f"as `source_dir` (their names and checksums are in docs/data.md, {corpus})")


def fetch_packages(packages: Iterable[DebPackage], cache: Path, *, corpus: str,
                   source_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """The file of each package, checked against its pinned SHA-256: from ``source_dir`` when given (a directory
    of pre-downloaded files, under the pool's name or ``apt-get download``'s), else from ``cache``, where the files
    missing there are first fetched with ``apt-get download NAME=VERSION`` (into a temporary directory, then
    renamed in). Raises :class:`DataUnavailableError` when apt cannot fetch them, saying how to provide them."""
    packages = list(packages)
    if source_dir is not None:
        where = Path(source_dir).expanduser()
        if not where.is_dir():
            raise FileNotFoundError(f"`source_dir` {where} is not a directory; allowed: a directory holding the "
                                    f"package files of {corpus}")
        found = {}
        for p in packages:
            path = next((where / n for n in p.local_names() if (where / n).is_file()), None)
            if path is None:
                raise FileNotFoundError(f"`source_dir` {where} holds no {p.file_name} ({p.name} {p.version} of "
                                        f"{corpus}); download it from {p.url}")
            found[p.name] = _check_sha256(path, p, corpus)
        return found
    missing = [p for p in packages if not (cache / p.file_name).is_file()]
    if missing:
        _apt_download(missing, cache, corpus)
    return {p.name: _check_sha256(cache / p.file_name, p, corpus) for p in packages}


def _apt_download(packages: list[DebPackage], cache: Path, corpus: str) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    what = ", ".join(f"{p.name} {p.version}" for p in packages)
    try:
        command = ["apt-get", "download", *(f"{p.name}={p.version}" for p in packages)]
        try:
            done = subprocess.run(command, cwd=work, capture_output=True, text=True)
        except FileNotFoundError:
            raise DataUnavailableError(f"cannot fetch {what} for {corpus}: `apt-get` is not installed here. "
                                       f"{_download_help(packages, corpus)}") from None
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("E:")] or done.stderr.splitlines()
            reason = errors[-1].strip() if errors else f"exit code {done.returncode}"
            raise DataUnavailableError(f"cannot fetch {what} for {corpus}: `apt-get download` failed ({reason}). "
                                       f"{_download_help(packages, corpus)}")
        for p in packages:
            got = next((work / n for n in p.local_names() if (work / n).is_file()), None)
            if got is None:
                raise DataUnavailableError(f"cannot fetch {p.name} {p.version} for {corpus}: `apt-get download` "
                                           f"wrote no {p.file_name}. {_download_help([p], corpus)}")
            os.replace(_check_sha256(got, p, corpus), cache / p.file_name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["DebPackage", "deb_files", "fetch_packages"]
