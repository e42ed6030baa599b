"""How text becomes a setting, in one place: numbers (finite, typed, scientific notation) and ``--set KEY=VALUE``.

Every numeric command-line option parses through :func:`parse_number` (``deep_delta.cli.options.integer`` and
``real``), and every ``--set`` through :func:`parse_assignments`, so ``1e-3`` is a number and ``nan`` is refused
the same way in every command. No import of PyTorch: the command line's parser uses this module.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

# A decimal number, with an optional exponent: 3, -2, 0.5, .5, 1e-3, 2.5E+4 (not nan, inf, 0x10 or 1_000)
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def parse_number(text: str, *, integer: bool = False) -> int | float:
    """``text`` as a finite number: an int for ``integer`` (``1000`` or ``1e3``; ``1.5`` is refused), else a
    float. ``ValueError`` saying what was got and what is allowed (without a name: the caller adds it)."""
    allowed = "an integer, e.g. 1000 or 1e3" if integer else "a finite number, e.g. 0.5 or 1e-3"
    s = text.strip() if isinstance(text, str) else ""
    if not NUMBER.fullmatch(s):
        raise ValueError(f"got {text!r}; allowed: {allowed}")
    if integer:
        if re.fullmatch(r"[-+]?\d+", s):
            return int(s)
        value = float(s)
        if not (math.isfinite(value) and value.is_integer()):
            raise ValueError(f"got {text!r}; allowed: {allowed}")
        return int(value)
    value = float(s)
    if not math.isfinite(value):  # 1e999 overflows to inf
        raise ValueError(f"got {text!r}; allowed: {allowed}")
    return value


def _numbers(value: Any, item: str) -> Any:
    """A parsed YAML value with number-like strings read as numbers (YAML 1.1 reads ``1e-3``, without a dot,
    as a string) and non-finite floats (``.nan``, ``.inf``) refused."""
    if isinstance(value, str) and NUMBER.fullmatch(value.strip()):
        number = parse_number(value)
        return int(number) if "." not in value and number.is_integer() else number  # 1e3: an int
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


def parse_assignments(assignments: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``ddl ... --set``) as settings (:func:`parse_assignment`); ``model.FIELD=VALUE``
    goes into ``values["model"]`` (DDLConfig fields). Checking the keys is the caller's."""
    values: dict[str, Any] = {}
    for item in assignments:
        key, value = parse_assignment(item)
        if key.startswith("model."):
            values.setdefault("model", {})[key[len("model."):]] = value
        else:
            values[key] = value
    return values
