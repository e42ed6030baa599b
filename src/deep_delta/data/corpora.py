"""Named corpora: text this machine can get from a package registry, pinned file by file, as a source of
``ddl data prepare --source NAME``.

``prose-v1`` is English documentation prose from 13 Debian bookworm packages (the Linux kernel's documentation,
Python's, Perl's, PostgreSQL's, Django's, Git's, Debian's own manuals, Sphinx's, Twisted's): each package pinned by
name, version and SHA-256, fetched once into the cache (:func:`deep_delta.data.debian.fetch_packages`), read
without being installed. A document is one file of a package, chosen by the package's patterns (``include``, less
``exclude``), decoded as UTF-8 (a file that is not is skipped and counted), its HTML tags stripped where it is a
web page (:func:`html_text`), in sorted path order within a package and packages in the order listed; a document
whose text is exactly that of an earlier one is dropped and counted (``duplicates``). ``meta.json`` records each
package's name, version, file and SHA-256 with the documents, bytes and duplicates it gave.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import html
import os
import re
from dataclasses import dataclass

from deep_delta.data.cache import sources_cache_dir
from deep_delta.data.debian import DebPackage, deb_files, fetch_packages

KINDS = ("text", "html")  # how a selected file is read: as it is, or with its HTML tags stripped


@dataclass(frozen=True)
class Part:
    """One package of a corpus and which of its files are documents: each file whose path (``usr/share/...``)
    matches a pattern of ``include`` (``fnmatch``: ``*`` crosses ``/``) and none of ``exclude``, read as the kind
    its first matching pattern names; a name ending in ``.gz`` is decompressed first."""

    package: DebPackage
    include: tuple[tuple[str, str], ...]
    exclude: tuple[str, ...] = ()
    about: str = ""

    def kind(self, name: str) -> str | None:
        """How file ``name`` is read (one of :data:`KINDS`), or None when it is not a document of this part."""
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude):
            return None
        return next((kind for pattern, kind in self.include if fnmatch.fnmatchcase(name, pattern)), None)


@dataclass(frozen=True)
class Corpus:
    """A named corpus: its packages (:class:`Part`) and the split its recipe prepares it with."""

    name: str
    about: str
    parts: tuple[Part, ...]
    val_fraction: float
    test_fraction: float

    def pinned(self) -> list[dict]:
        """What fixes the corpus's text: each package's name, version, file and SHA-256."""
        return [part.package.record() for part in self.parts]


# The pinned packages of prose-v1, one a line: name, version, its folder in the pool, SHA-256 of the .deb. The file
# is pool/main/<folder>/<name>_<version without its epoch>_all.deb on any Debian mirror.
_PROSE_V1_PINS = """
linux-doc-6.1 6.1.176-1 l/linux 0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f
python3.11-doc 3.11.2-6+deb12u8 p/python3.11 50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b
perl-doc 5.36.0-7+deb12u3 p/perl e9e3564ff5ade27de0585835f2acad769bcc545c0a0045a9f55d5401f27f7591
postgresql-doc-15 15.18-0+deb12u1 p/postgresql-15 3c598277a463c44d672daa2c335deb8d8252e1852fb025fd4578ea2d9a1b90f0
python-django-doc 3:3.2.25-0+deb12u3 p/python-django 33319c8e45b95693603213442ccf9bcee933ef338488115203ad25a0e01c696f
git-doc 1:2.39.5-0+deb12u3 g/git 3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec
debian-policy 4.6.2.0 d/debian-policy ef9d01b625c3b87c3a845c2cd1b66f1a16e9240b2b9e5bee53472a00e8457a39
debian-handbook 11.20220922 d/debian-handbook 3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa
debian-reference-en 2.100 d/debian-reference 9f31d3a17df505de09689ca255512ea58c1fc47c59bb1b0c7bf1c23362e9743f
developers-reference 12.18 d/developers-reference 0dba82f6fa16e373f2a84ad07e7971aa9264ad2e7d2ae46b37edbc9c5fd57e2e
maint-guide 1.2.53 m/maint-guide 762c8a400a36668d2eb814a3ba356b06488fd889dfce478eb11d5cfb189a47b5
sphinx-doc 5.3.0-4 s/sphinx 1da3d08bb3a0bc82a4b8b8109410e223054bf5fb13904557ec8ea869046f65b4
twisted-doc 22.4.0-4+deb12u1 t/twisted 3bc8d4e8965911289e4fb0efe017a56b48f07f1ae450b7071c432aeb41559142
"""
_PROSE_V1_PACKAGES = {line.split()[0]: line.split()[1:] for line in _PROSE_V1_PINS.strip().splitlines()}


def _pinned(name: str) -> DebPackage:
    version, folder, sha256 = _PROSE_V1_PACKAGES[name]
    return DebPackage(name, version, f"pool/main/{folder}/{name}_{version.split(':')[-1]}_all.deb", sha256)


_SPHINX_SOURCES = (("*/_sources/*.txt", "text"),)  # the reST a Sphinx HTML build ships beside its pages
_LINUX = "usr/share/doc/linux-doc-6.1/"

# Which files of each package are documents, and how they are read (Part: include, exclude, about).
PROSE_V1 = Corpus(
    name="prose-v1",
    about="English documentation prose from 13 Debian bookworm packages (docs/data.md, 'The prose corpus')",
    val_fraction=0.02,
    test_fraction=0.02,
    parts=(
        Part(_pinned("linux-doc-6.1"), exclude=("*/translations/*",),
             include=tuple((_LINUX + pattern, "text") for pattern in (
                 "Documentation/*.rst.gz", "Documentation/*.txt.gz", "Documentation/ABI/*", "html/_sources/*.txt")),
             about="the Linux kernel's Documentation/ (reST and text, English; the HTML build's _sources/ are "
                   "copies of the same files, removed as duplicates)"),
        Part(_pinned("python3.11-doc"), _SPHINX_SOURCES, about="Python 3.11's documentation (reST)"),
        Part(_pinned("perl-doc"), (("*.pod", "text"), ("*.pod.gz", "text")), about="Perl 5.36's manual (pod)"),
        Part(_pinned("postgresql-doc-15"), (("usr/share/doc/postgresql-doc-15/html/*.html", "html"),),
             about="PostgreSQL 15's manual (HTML pages, tags stripped)"),
        Part(_pinned("python-django-doc"), (("usr/share/doc/python-django-doc/html/*.html", "html"),),
             exclude=("*/_modules/*", "*/genindex*.html", "*/py-modindex.html", "*/search.html"),
             about="Django 3.2's documentation (HTML pages, tags stripped; its highlighted source code and "
                   "indexes left out)"),
        Part(_pinned("git-doc"), (("usr/share/doc/git-doc/*.txt", "text"),),
             about="Git's manual pages and guides (AsciiDoc)"),
        Part(_pinned("debian-policy"), (("usr/share/doc/debian-policy/*.txt.gz", "text"),),
             about="the Debian Policy Manual and its companions (plain text)"),
        Part(_pinned("debian-handbook"), (("usr/share/doc/debian-handbook/html/en-US/*.html", "html"),),
             about="The Debian Administrator's Handbook, English (HTML pages, tags stripped)"),
        Part(_pinned("debian-reference-en"), (("usr/share/debian-reference/*.en.html", "html"),),
             about="the Debian Reference, English (HTML pages, tags stripped)"),
        Part(_pinned("developers-reference"), _SPHINX_SOURCES, about="the Debian Developer's Reference (reST)"),
        Part(_pinned("maint-guide"), (("usr/share/doc/maint-guide/html/*.en.html", "html"),),
             about="the Debian New Maintainers' Guide, English (HTML pages, tags stripped)"),
        Part(_pinned("sphinx-doc"), _SPHINX_SOURCES, about="Sphinx 5.3's documentation (reST)"),
        Part(_pinned("twisted-doc"), _SPHINX_SOURCES, about="Twisted 22.4's documentation (reST)"),
    ),
)

CORPORA = {PROSE_V1.name: PROSE_V1}


def named_corpus(spec: object) -> Corpus | None:
    """The corpus ``spec`` names, or None when it names none."""
    return CORPORA.get(spec) if isinstance(spec, str) else None


def check_source_dir(source: object, source_dir: object, *, owner: str = "") -> None:
    """A ``source_dir`` (pre-downloaded package files) is only for a named corpus: else a ``ValueError`` naming
    ``owner``, both fields and what is allowed."""
    if source_dir is not None and named_corpus(str(source)) is None:
        raise ValueError(f"{owner + ': ' if owner else ''}`source_dir` got {str(source_dir)!r} with `source` "
                         f"{str(source)!r}; allowed: a directory of package files only with a named corpus "
                         f"({', '.join(CORPORA)})")


_DROPPED = re.compile(r"<(script|style|head)\b.*?</\1\s*>|<!--.*?-->", re.S | re.I)
_TAG = re.compile(r"<[^>]*>")
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def html_text(page: str) -> str:
    """The text of an HTML page, cheaply: the head, scripts, styles and comments dropped, every tag removed,
    entities decoded, trailing spaces cut and runs of blank lines made one (the line breaks of the page stay)."""
    text = html.unescape(_TAG.sub("", _DROPPED.sub("", page)))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip("\n")


def _document(name: str, data: bytes, kind: str) -> str | None:
    """The text of file ``name`` (its bytes ``data``) as a document, or None when it is not UTF-8."""
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return html_text(text) if kind == "html" else text


def corpus_documents(corpus: Corpus, source_dir: str | os.PathLike | None = None) -> tuple[list[str], dict]:
    """The documents of ``corpus`` (its package files fetched or found, see :func:`fetch_packages`) and what
    ``meta.json`` says of them: per package its pinned record with ``documents``, ``bytes`` (UTF-8 bytes of the
    documents kept), ``duplicates`` (documents dropped as an exact copy of an earlier one), ``not_utf8`` and
    ``empty`` (files skipped)."""
    files = fetch_packages([p.package for p in corpus.parts], sources_cache_dir(corpus.name), corpus=corpus.name,
                           source_dir=source_dir)
    documents: list[str] = []
    seen: set[bytes] = set()
    packages = []
    for part in corpus.parts:
        found = sorted(deb_files(files[part.package.name], part.kind))
        count = {"documents": 0, "bytes": 0, "duplicates": 0, "not_utf8": 0, "empty": 0}
        for name, data in found:
            text = _document(name, data, part.kind(name))
            if text is None or not text.strip():
                count["not_utf8" if text is None else "empty"] += 1
                continue
            encoded = text.encode("utf-8")
            digest = hashlib.sha256(encoded).digest()
            if digest in seen:
                count["duplicates"] += 1
                continue
            seen.add(digest)
            documents.append(text)
            count["documents"] += 1
            count["bytes"] += len(encoded)
        packages.append({**part.package.record(), **count})
    info = {"source": corpus.name, "source_detail": corpus.about, "packages": packages,
            "duplicates_removed": sum(p["duplicates"] for p in packages)}
    if not documents:
        raise ValueError(f"the packages of {corpus.name} gave no documents (none of their files matched)")
    return documents, info


__all__ = ["CORPORA", "PROSE_V1", "Corpus", "Part", "corpus_documents", "html_text", "named_corpus"]
