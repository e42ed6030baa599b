"""Errors of the data package.

:class:`DataError` is a file whose content cannot be used (an undecodable text source, a corrupt parquet file,
a bad ``meta.json`` value); its message names the file, the place in it, what was found and what is allowed.
It is a ``ValueError``, so ``ddl`` prints it as one line. :class:`DataUnavailableError` is a resource that must
be fetched and cannot be reached.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file that exists but cannot be used; the message names the file and what is wrong in it."""


class DataUnavailableError(RuntimeError):
    """A resource that must be fetched (a tokenizer file, a Hub data set) cannot be reached.

    The message says how to provide it locally instead.
    """
