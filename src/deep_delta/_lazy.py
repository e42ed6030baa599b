"""Packages whose public names load on first use (PEP 562), so that importing the package is cheap.

The ``ddl`` parser imports the light modules under :mod:`deep_delta`; each package on the way runs its
``__init__``, which must not import PyTorch or transformers. A package lists its public names and the module
that defines each; :func:`lazy_names` returns the ``__getattr__`` and ``__dir__`` that import them when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``public[name]`` is the module that defines ``name``.

    A name is imported from its module the first time it is looked up, then kept in the package's namespace.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__
