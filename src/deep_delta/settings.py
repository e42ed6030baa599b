"""Settings, in one place: how a settings field states its command-line flag, how text becomes a number, how
``--set KEY=VALUE`` is read, and how a settings dataclass checks its fields against their annotations.

Every field of a settings dataclass is made by :func:`setting`, which keeps its flag's help (and metavar or
choices) beside its default; ``deep_delta.cli.options.add_settings`` builds every command's setting flags from
them.

Every numeric command-line option parses through :func:`parse_number` (``deep_delta.cli.options.integer`` and
``real``), and every ``--set`` through :func:`parse_assignments`, so ``1e-3`` is a number and ``nan`` is refused
the same way in every command. :func:`check_fields` is the type check of every settings dataclass
(``TrainConfig``, ``TaskSettings``, the bench and coord-check settings, and ``DDLConfig``'s own fields): the
annotation says what a field takes, the error names the class, the field, what it got and what is allowed. No
import of PyTorch: the command line's parser uses this module.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

# A decimal number, with an optional exponent: 3, -2, 0.5, .5, 1e-3, 2.5E+4 (not nan, inf, 0x10 or 1_000)
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
# Every integer a setting holds fits in 64 bits (what torch and numpy take): 1e300 is a typo, not a number of
# steps or a seed.
MAX_INT = 2**63 - 1
# The bound of every count (steps, batches, sizes, repeats, tokens to decode): far above any real run, low
# enough that a typo is an error instead of a loop that never ends or a list that fills the memory.
MAX_COUNT = 10**9
# The most seeds of one study: each is a complete training run of every variant.
MAX_SEEDS = 1000


def parse_number(text: str, *, integer: bool = False) -> int | float:
    """``text`` as a finite number: an int for ``integer`` (``1000`` or ``1e3``; ``1.5`` is refused), else a
    float. ``ValueError`` saying what was got and what is allowed (without a name: the caller adds it)."""
    allowed = "an integer, e.g. 1000 or 1e3" if integer else "a finite number, e.g. 0.5 or 1e-3"
    s = text.strip() if isinstance(text, str) else ""
    if not NUMBER.fullmatch(s):
        raise ValueError(f"got {text!r}; allowed: {allowed}")
    if integer:
        if re.fullmatch(r"[-+]?\d+", s):
            value = int(s)
        else:
            number = float(s)
            if not (math.isfinite(number) and number.is_integer()):
                raise ValueError(f"got {text!r}; allowed: {allowed}")
            value = int(number)
        if abs(value) > MAX_INT:
            raise ValueError(f"got {text!r}; allowed: an integer of at most 64 bits (|value| <= 2**63 - 1)")
        return value
    value = float(s)
    if not math.isfinite(value):  # 1e999 overflows to inf
        raise ValueError(f"got {text!r}; allowed: {allowed}")
    return value


def _numbers(value: Any, item: str) -> Any:
    """A parsed YAML value with number-like strings read as numbers (YAML 1.1 reads ``1e-3``, without a dot,
    as a string) and non-finite floats (``.nan``, ``.inf``) refused."""
    if isinstance(value, str) and NUMBER.fullmatch(value.strip()):
        number = parse_number(value)
        # 1e3: an int (1e300 stays a float, which no integer setting takes)
        return int(number) if "." not in value and number.is_integer() and abs(number) <= MAX_INT else number
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"`assignments` got {item!r}; allowed: finite numbers (not nan or inf)")
    if isinstance(value, list):
        return [_numbers(v, item) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v, item) for k, v in value.items()}
    return value


def parse_assignment(item: str) -> tuple[str, Any]:
    """One ``KEY=VALUE`` string (``ddl ... --set``) as ``(key, value)``: dashes in the key read as underscores,
    the value parsed as YAML (an empty value is None; ``1e-3`` a number; nan and inf refused)."""
    key, sep, raw = item.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"`assignments` got {item!r}; allowed: KEY=VALUE, e.g. model.hidden_size=64")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ValueError(f"`assignments` got {item!r}: the value is not valid YAML: {e}") from e
    return key, _numbers(value, item)


def parse_assignments(assignments: list[str], groups: Sequence[str] = ("model",)) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``ddl ... --set``) as settings (:func:`parse_assignment`); ``GROUP.NAME=VALUE``
    for a GROUP of ``groups`` goes into ``values[GROUP][NAME]`` (``model.FIELD``: DDLConfig fields). Checking
    the keys is the caller's."""
    values: dict[str, Any] = {}
    for item in assignments:
        key, value = parse_assignment(item)
        group, dot, name = key.partition(".")
        if dot and group in groups:
            entries = values.setdefault(group, {})
            if not isinstance(entries, dict):
                raise ValueError(f"`assignments` got {item!r} after {group}={entries!r}; allowed: one of "
                                 f"{group}=MAPPING or {group}.NAME=VALUE")
            entries[name] = value
        else:
            values[key] = value
    return values


# ---------------------------------------------------------------------------------------- typed fields
def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **flag: Any) -> Any:
    """A settings dataclass field: its ``default`` (or ``factory``, for a mutable one; neither: a required field and
    flag) and, in its metadata, the ``help`` of its command-line flag ``--field-name`` with any ``metavar``,
    ``choices`` or ``parse`` (``flag``).

    The flag's type comes from the annotation, or from ``parse``: the name of another grammar of
    ``deep_delta.cli.options`` (``"count"``: ``500k``, ``10M``, ``2B``; ``"fraction"``: a number in [0, 1)). A
    ``dict`` field has no flag of its own (``--set GROUP.NAME=VALUE`` fills it) and its help says so. A field named
    as a shared option (``device``, ``dtype``, ``variants``, ``seeds``) gets that option of
    ``deep_delta.cli.options``: its text, ``help`` a note after it (``seeds``: ``help`` is the text, the option's
    grammar the shared one)."""
    metadata = {"help": help, **flag}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping",
          type(None): "null"}


def check_fields(settings: Any, declared_in: type | None = None) -> None:
    """Check every field of the dataclass instance ``settings`` against its annotation and store the value in
    its canonical form (an int where a float is annotated becomes a float, ``"1e-3"`` a number, a list a tuple
    where a tuple is annotated, a path a string). A ``ValueError`` names the class, the field, what it got and
    what is allowed; ranges and choices are the class's own checks, after this one.

    ``declared_in``: check only the fields this class declares itself, not those it inherits (``DDLConfig``
    over transformers' ``PreTrainedConfig``, whose own fields are the library's to check)."""
    owner = type(settings).__name__
    if declared_in is None:
        hints = typing.get_type_hints(type(settings))
    else:
        hints = inspect.get_annotations(declared_in, eval_str=True)
    for f in dataclasses.fields(settings):
        if f.name not in hints:
            continue
        value = getattr(settings, f.name)
        try:
            setattr(settings, f.name, _check(value, hints[f.name]))
        except TypeError as e:
            choices = f.metadata.get("choices")  # a field with choices names them, not only their type
            allowed = " | ".join(map(str, choices)) if choices else e
            raise ValueError(f"{owner}: `{f.name}` got {value!r}; allowed: {allowed}") from None


def check_count(name: str, value: Any, low: int, high: int = MAX_COUNT, *, owner: str = "") -> int:
    """``value`` as a count in [``low``, ``high``] (default :data:`MAX_COUNT`); else a ``ValueError`` naming
    ``owner`` (a class, or nothing), the field, what it got and the bounds."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        prefix = f"{owner}: " if owner else ""
        raise ValueError(f"{prefix}`{name}` got {value!r}; allowed: an integer >= {low} and <= {high:,}")
    return value


def _check(value: Any, kind: Any) -> Any:
    """``value`` as ``kind`` (an annotation); ``TypeError(what is allowed)`` when it is not one."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check(value, option)
            except TypeError:
                pass
        raise TypeError(" or ".join(_describe(a) for a in args))
    if kind is Any:
        return value
    if kind is type(None):
        if value is None:
            return None
        raise TypeError("null")
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise TypeError(_describe(kind))
    if kind in (int, float):
        if isinstance(value, str) and NUMBER.fullmatch(value.strip()):  # YAML 1.1 reads "1e-3" as a string
            try:
                value = parse_number(value, integer=kind is int)
            except ValueError:
                raise TypeError(_describe(kind)) from None
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise TypeError(_describe(kind))
        if kind is int and abs(value) > MAX_INT:
            raise TypeError("an integer of at most 64 bits (|value| <= 2**63 - 1)")
        if kind is float and not math.isfinite(value):
            raise TypeError("a finite number")
        return float(value) if kind is float else value
    if kind is str:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, str):
            return value
        raise TypeError(_describe(kind))
    if kind is dict or origin is dict:
        if isinstance(value, dict):
            return value
        raise TypeError(_describe(kind))
    if origin in (tuple, list, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise TypeError(_describe(kind))
        fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        if fixed and len(value) != len(args):
            raise TypeError(_describe(kind))
        try:
            if fixed:
                return tuple(_check(v, a) for v, a in zip(value, args))
            items = [_check(v, args[0]) for v in value] if args else list(value)
        except TypeError:  # an element: the whole list is what is wrong
            raise TypeError(_describe(kind)) from None
        return tuple(items) if origin is tuple or (origin is Sequence and isinstance(value, tuple)) else items
    raise NotImplementedError(f"check_fields: no check for the annotation {kind!r}")


def _describe(kind: Any) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple and args and args[-1] is not Ellipsis:
        element = {_describe(a) for a in args}
        if len(element) == 1:
            return f"a list of {len(args)} {_plural(element.pop())}"
        return f"a list of {', '.join(_describe(a) for a in args)}"
    if origin in (tuple, list, Sequence):
        return f"a list of {_plural(_describe(args[0]))}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return _NAMES.get(kind, getattr(kind, "__name__", str(kind)))


def _plural(name: str) -> str:
    """ "a number" -> "numbers", "an integer" -> "integers", "a string" -> "strings" """
    return name.split(" ", 1)[1] + "s" if name.startswith(("a ", "an ")) else name
