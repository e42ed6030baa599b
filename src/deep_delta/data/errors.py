"""Errors of the data package that are neither bad arguments nor bad files."""

from __future__ import annotations


class DataUnavailableError(RuntimeError):
    """A resource that must be fetched (a tokenizer file, a Hub data set) cannot be reached.

    The message says how to provide it locally instead.
    """
