"""Packages whose public names load on first use (PEP 562), so that importing the package is cheap.

The ``ddl`` parser imports the light modules under :mod:`deep_delta`; each package on the way runs its
``__init__``, which must not import PyTorch or transformers. A package lists, for each module, the public names it
defines; :func:`lazy_names` returns the ``__getattr__`` and ``__dir__`` that import them when used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


def lazy_names(package: str, modules: dict[str, tuple[str, ...]]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``: ``modules[m]`` names what module ``m``
    defines for the package.

    A name is imported from its module the first time it is looked up, then kept in the package's namespace.
    """
    public: dict[str, str] = {}
    for module, names in modules.items():
        for name in names:
            if name in public:
                raise ValueError(f"{package}: {name!r} is listed under {public[name]!r} and {module!r}")
            public[name] = module
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__, sorted(public)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Import ``then`` right after ``module`` has been imported for the first time (then step aside)."""

    def __init__(self, module: str, then: str):
        self.module, self.then = module, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # the rest of the search, and every later import, without this hook
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                importlib.import_module(then)

        spec.loader = Loader()
        return spec


def import_after(module: str, then: str) -> None:
    """Import ``then`` as soon as ``module`` is imported: now if it already is, else right after its first import.

    ``import deep_delta`` registers ``model_type="deep_delta"`` with transformers' Auto classes this way
    (``then = "deep_delta.models"``): a user who imports deep_delta and then uses ``AutoModelForCausalLM`` gets the
    registration, while ``ddl --help``, which never imports transformers, stays free of it."""
    if module in sys.modules:
        importlib.import_module(then)
    elif not any(isinstance(f, _AfterImport) and f.module == module for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(module, then))
