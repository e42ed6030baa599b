"""Runtime switches of the kernel paths that have not yet passed their tests on a GPU (issue 47).

A fast path is the default on the hardware it targets only after a run on that hardware has passed its tests.
Each path below was built and tested on CPU (under the Triton interpreter, and counted on fake tensors) but has
not run on a GPU, so it is **off** by default; off means the path as it was at a603936, the last kernels a GPU
ran. The switches are the fields of one settings object, :class:`KernelSwitches`, read from the environment when
this module is first imported; the ops read it at every call through :func:`get`, so one process can time a path
on and off:

==========================  =====================  =================================================================
field (recorded as)         environment variable   on: / off:
==========================  =====================  =================================================================
``inkernel_reduce``         ``DDL_INKERNEL_REDUCE``  weight gradients summed by reducer programs in the launch that
(``INKERNEL_REDUCE``)                              computes the partials (:mod:`deep_delta.ops.partials`) /
                                                   the launch writes its partial rows and torch sums them
``fuse_next_norm``          ``DDL_FUSE_NEXT_NORM``   the next sublayer's norm, gate and value computed inside the
(``FUSE_NEXT_NORM``)                               update (d_v = 1, and CC through its read;
                                                   :mod:`deep_delta.ops.delta.triton_norm`) / the next sublayer
                                                   runs its own norm kernel
``tc_one_pass``             ``DDL_TC_ONE_PASS``      the fused update + TC read's backward sums the first four
(``TC_ONE_PASS``)                                  taps' gradient in the update's backward pass / a second
                                                   kernel sums every tap's gradient from the saved new state
``fused_rules``             ``DDL_FUSED_RULES``      the write-only and untied update rules run the delta rule's
(``FUSED_RULES``)                                  fused kernels (a mode of each: the update, with the next CC or
                                                   TC read, with the next norm; the untied sublayer's norm, gate
                                                   and value kernel with its two gates) and fuse where the delta
                                                   rule does / their lean path, never fused (as before issue 59)
==========================  =====================  =================================================================

Values: ``1``, ``true``, ``on``, ``yes`` / ``0``, ``false``, ``off``, ``no`` (any case); anything else is an
error at import naming the variable. In code::

    from deep_delta.ops import switches
    switches.get().tc_one_pass                 # the value now
    with switches.override(tc_one_pass=True):  # inside the block only
        ...

:func:`current` is what records keep (run.json, checkpoints, reports: ``kernel_switches``), by the recorded names.
Under ``torch.compile`` the model's choice of fusion (``fuse_next_norm``, ``fused_rules``) is read while tracing: set
it before compiling. The docs (docs/kernels.md, "Switches") say what each path measured and when its default changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def env_flag(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """The boolean environment variable ``name`` (unset or empty: ``default``); ``ValueError`` naming it for any
    other value than the ones listed in this module's docstring."""
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"environment variable {name}: got {environ[name]!r}; allowed: "
                     f"{', '.join(_TRUE)} (on) or {', '.join(_FALSE)} (off)")


@dataclasses.dataclass(frozen=True)
class KernelSwitches:
    """The switches of the kernel paths not yet run on a GPU (module docstring), each off by default. A field's
    recorded name is its name in capitals (:meth:`record`), its environment variable that name after ``DDL_``."""

    inkernel_reduce: bool = False
    fuse_next_norm: bool = False
    tc_one_pass: bool = False
    fused_rules: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool):
                raise ValueError(f"KernelSwitches: `{field.name}` must be True or False, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> KernelSwitches:
        """The switches set by the ``DDL_*`` environment variables (:data:`VARIABLES`), the others off."""
        return cls(**{name: env_flag(variable, field.default, environ)
                      for (name, variable), field in zip(VARIABLES.items(), dataclasses.fields(cls))})

    def record(self) -> dict[str, bool]:
        """Every switch by its recorded name (``INKERNEL_REDUCE``, ...): what run.json and checkpoints keep."""
        return {name.upper(): value for name, value in dataclasses.asdict(self).items()}


# each field's environment variable
VARIABLES = {field.name: f"DDL_{field.name.upper()}" for field in dataclasses.fields(KernelSwitches)}

_now = KernelSwitches.from_env()


def get() -> KernelSwitches:
    """The switches now: the one place the ops and the layers read them."""
    return _now


def current() -> dict[str, bool]:
    """Every switch's value now, by its recorded name (recorded by runs and benchmarks beside their figures)."""
    return _now.record()


@contextlib.contextmanager
def override(**values: bool) -> Iterator[KernelSwitches]:
    """Set switches by their field names inside the block (``override(fused_rules=True)``), restoring them after
    it; yields the switches in force inside."""
    global _now
    unknown = sorted(set(values) - set(VARIABLES))
    if unknown:
        raise ValueError(f"switches.override: unknown switch {unknown[0]!r}; allowed: {', '.join(VARIABLES)}")
    before = _now
    _now = dataclasses.replace(before, **values)
    try:
        yield _now
    finally:
        _now = before
