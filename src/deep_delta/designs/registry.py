"""The registry of residual designs: each by the name ``DDLConfig.residual`` gives it.

The built-in designs (``additive``: the baseline and Peri-LN; ``delta``: DDL and its rules; ``hyper``: HC / mHC;
``attnres``: Attention Residuals) are imported on first use. A design of a user's own joins every tool from outside
the package, in any of three ways:

- its module calls :func:`register_design` when imported, and the model config names that module
  (``design_module``: an import path such as ``my_pkg.my_design``, or a ``.py`` file); a saved model keeps the
  name, so loading it imports the module again (a module that is not installed is an error naming it);
- an installed package declares an entry point in the group ``deep_delta.designs`` whose name is the design's
  and whose value is the module (``[project.entry-points."deep_delta.designs"] toy = "my_pkg.my_design"``);
- code imports the module before it builds a model.

Registering a design may add variants (rows of :data:`deep_delta.variants.VARIANTS`, with their names for tables),
so that ``ddl train --variant NAME``, ``ddl compare --variants ...``, export and generation take them by name.
No PyTorch import here: the built-in designs' modules import it when they are first used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deep_delta.designs.base import ResidualDesign

ENTRY_POINTS = "deep_delta.designs"
# the built-in designs, by name: the module that registers each
BUILTIN: dict[str, str] = {
    "additive": "deep_delta.designs.additive",
    "delta": "deep_delta.designs.delta",
    "hyper": "deep_delta.designs.hyper",
    "attnres": "deep_delta.designs.attnres",
}
_DESIGNS: dict[str, ResidualDesign] = {}
_MODULE_OF: dict[str, str] = {}  # a user's design -> the module (import path or file) that registered it
_LOADED: dict[str, Any] = {}  # a design module given as a file path -> the module object


def register_design(design: ResidualDesign, *, variants: dict[str, dict[str, Any]] | None = None,
                    paper_names: dict[str, str] | None = None, replace: bool = False) -> ResidualDesign:
    """Register ``design`` (an instance of a :class:`~deep_delta.designs.base.ResidualDesign` subclass) under its
    ``name``, with ``variants`` ({variant: the config fields in which it differs from the baseline}; ``residual``
    is set to the design's name) and their ``paper_names`` for tables. A name already taken is refused unless
    ``replace`` (re-registering the same design class, e.g. a module imported twice, is allowed). Returns the
    design, so that a module can write ``DESIGN = register_design(MyDesign(), variants={...})``."""
    from deep_delta.designs.base import ResidualDesign
    from deep_delta.variants import PAPER_NAMES, VARIANTS

    if not isinstance(design, ResidualDesign):
        raise ValueError(f"register_design: `design` got a {type(design).__name__}; allowed: an instance of a "
                         "ResidualDesign subclass (deep_delta.designs.ResidualDesign)")
    name = design.name
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(f"register_design: the design's `name` got {name!r}; allowed: a non-empty name")
    old = _DESIGNS.get(name)
    if old is not None and not replace and type(old).__qualname__ != type(design).__qualname__:
        raise ValueError(f"register_design: a design named {name!r} is registered already ({type(old).__name__}); "
                         "allowed: another name, or replace=True")
    for variant in variants or {}:
        taken = VARIANTS.get(variant)
        if taken is not None and taken.get("residual") != name and not replace:
            raise ValueError(f"register_design: the variant {variant!r} exists already (a {taken.get('residual')!r} "
                             "variant); allowed: another name")
    _DESIGNS[name] = design
    module = type(design).__module__
    if name not in BUILTIN:
        _MODULE_OF[name] = _module_names.get(module, module)
    for variant, row in (variants or {}).items():
        VARIANTS[variant] = {**row, "residual": name}
        if paper_names and variant in paper_names:
            PAPER_NAMES[variant] = paper_names[variant]
    return design


_module_names: dict[str, str] = {}  # the module name given to a file -> the file path it was loaded from


def load_design_module(spec: str) -> Any:
    """Import the module ``spec`` (an import path, ``my_pkg.my_design``, or a ``.py`` file), which registers its
    designs; the module. A file is imported once per path. Errors name the module and what to do."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"`design_module` got {spec!r}; allowed: an import path (my_pkg.my_design) or a .py file")
    if spec.endswith(".py"):
        path = Path(spec).expanduser().resolve()
        if str(path) in _LOADED:
            return _LOADED[str(path)]
        if not path.is_file():
            raise FileNotFoundError(f"`design_module` got {spec!r}, which is not a file; allowed: a .py file that "
                                    "registers a design, or an import path")
        name = f"deep_delta_design_{path.stem}_{abs(hash(str(path))) % 10**8}"
        _module_names[name] = spec
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _LOADED[str(path)] = module
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        raise ValueError(f"`design_module` got {spec!r}, which cannot be imported ({e}); allowed: a module that is "
                         "installed or on the Python path (the model's residual design is defined there: install the "
                         "package that provides it)") from None


def get_design(name: str, module: str | None = None) -> ResidualDesign:
    """The design registered as ``name``: a built-in one (imported on first use), one that ``module`` registers
    (imported now), or one an installed entry point of the group ``deep_delta.designs`` names. Unknown: a
    ``ValueError`` naming the designs known and how a design of one's own is found."""
    if name in _DESIGNS:
        return _DESIGNS[name]
    if name in BUILTIN:
        module = importlib.import_module(BUILTIN[name])
        return _DESIGNS.setdefault(name, module.DESIGN)  # its module registers it (DESIGN) when first imported
    if module:
        load_design_module(module)
        if name in _DESIGNS:
            return _DESIGNS[name]
        raise ValueError(f"DDLConfig: `residual` got {name!r}, but the module {module!r} (`design_module`) registers "
                         f"no design of that name; it registers {', '.join(_registered_by(module)) or 'none'}")
    for ep in _entry_points():
        if ep.name == name:
            ep.load()
            if name in _DESIGNS:
                return _DESIGNS[name]
    raise ValueError(f"DDLConfig: `residual` got {name!r}; allowed: {' | '.join(design_names())}, or a design of "
                     "your own registered by its module (`design_module`: an import path or a .py file; or an "
                     f"entry point in the group {ENTRY_POINTS!r}; docs/designs.md)")


def design_module_of(name: str) -> str | None:
    """The module that registered the user's design ``name`` (what a saved config names), None for a built-in."""
    return _MODULE_OF.get(name)


def design_names() -> list[str]:
    """The built-in designs and every one registered so far."""
    return list(BUILTIN) + sorted(n for n in _DESIGNS if n not in BUILTIN)


def _registered_by(module: str) -> list[str]:
    return sorted(n for n, m in _MODULE_OF.items() if m == module)


def _entry_points():
    from importlib.metadata import entry_points

    try:
        return list(entry_points(group=ENTRY_POINTS))
    except Exception:  # a broken distribution's metadata must not hide the built-in designs
        return []


__all__ = ["BUILTIN", "ENTRY_POINTS", "design_module_of", "design_names", "get_design", "load_design_module",
           "register_design"]
