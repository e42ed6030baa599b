"""Tiny Debian packages for the corpus tests, written in Python (an ``ar`` archive holding ``debian-binary``,
``control.tar.xz`` and ``data.tar.xz``: the layout ``dpkg-deb -b`` writes), and a tiny corpus of them."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

from deep_delta.data.corpora import Corpus, Part
from deep_delta.data.debian import DebPackage


def _tar(files: dict[str, bytes], compression: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size, info.mtime = len(data), 0
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_deb(path: Path, files: dict[str, bytes], compression: str = "xz") -> Path:
    """Write a .deb at ``path`` whose data member (``data.tar.<compression>``) holds ``files``."""
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", _tar({"control": b"Package: x\n"}, "xz")),
               (f"data.tar.{compression}", _tar(files, compression))]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


DOC_A = "The delta rule writes a value along a direction.\nIt erases what was there first.\n" * 20
DOC_B = "A gate decides how much of the old state is kept. " * 30
PAGE = ("<html><head><title>T</title><style>p {}</style></head><body><h1>Heading &amp; more</h1>\n"
        "<p>A page <b>of</b> prose.</p>\n\n\n<script>var x = 1;</script><!-- a comment -->\n<p>Second &lt;para&gt;.</p>"
        "</body></html>")
PAGE_TEXT = "Heading & more\nA page of prose.\n\nSecond <para>."

# two packages: "alpha" (plain and gzipped text, a file left out, a file that is not UTF-8, an empty one) and
# "beta" (an HTML page, a copy of alpha's document, a file no pattern selects)
FILES = {
    "alpha": {"usr/share/doc/alpha/a.txt": DOC_A.encode(),
              "usr/share/doc/alpha/b.txt.gz": gzip.compress(DOC_B.encode(), mtime=0),
              "usr/share/doc/alpha/skip/c.txt": b"left out by a pattern",
              "usr/share/doc/alpha/latin1.txt": "caf\xe9".encode("latin-1"),
              "usr/share/doc/alpha/empty.txt": b"  \n"},
    "beta": {"usr/share/doc/beta/page.html": PAGE.encode(),
             "usr/share/doc/beta/copy.txt": DOC_A.encode(),
             "usr/share/doc/beta/image.png": b"\x89PNG"},
}


def tiny_corpus(directory: Path, name: str = "tiny-v1", *, val_fraction=0.0, test_fraction=0.0,
                files: dict[str, dict[str, bytes]] | None = None) -> tuple[Corpus, dict[str, Path]]:
    """A corpus of the packages of ``files`` (default :data:`FILES`), written as .deb files into ``directory``
    under their pool names, each pinned by its checksum; returns the corpus and the files."""
    files = FILES if files is None else files
    directory.mkdir(parents=True, exist_ok=True)
    parts, paths = [], {}
    for package, content in files.items():
        path = build_deb(directory / f"{package}_1.0-1_all.deb", content)
        paths[package] = path
        pinned = DebPackage(package, "1:1.0-1", f"pool/main/{package[0]}/{package}/{path.name}",
                            hashlib.sha256(path.read_bytes()).hexdigest())
        parts.append(Part(pinned, include=(("*.txt", "text"), ("*.txt.gz", "text"), ("*.html", "html")),
                          exclude=("*/skip/*",)))
    return Corpus(name, "a tiny test corpus", tuple(parts), val_fraction, test_fraction), paths
