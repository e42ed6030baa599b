"""Old public names kept as aliases: a module ``__getattr__`` that warns when one is looked up.

The warning comes once per lookup (an import or an attribute access), not per call, so an alias costs
nothing in a loop or under ``torch.compile``.
"""

from __future__ import annotations

import warnings
from typing import Any


def deprecated_names(module: str, renamed: dict[str, tuple[str, Any]]):
    """``__getattr__`` for ``module``: ``renamed[old] = (what to use instead, the object)``."""

    def __getattr__(name: str):
        if name in renamed:
            new, obj = renamed[name]
            warnings.warn(f"{module}.{name} is deprecated; use {new}", DeprecationWarning, stacklevel=2)
            return obj
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
