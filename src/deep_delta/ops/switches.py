"""Runtime switches of the kernel paths that have not yet passed their tests on a GPU (issue 47).

A fast path is the default on the hardware it targets only after a run on that hardware has passed its tests.
Each path below was built and tested on CPU (under the Triton interpreter, and counted on fake tensors) but has
not run on a GPU, so it is **off** by default; off means the path as it was at a603936, the last kernels a GPU
ran. Each is read from an environment variable when this module is first imported, and is a module-level
setting that the ops read at every call, so one process can time a path on and off:

==========================  =====================  =================================================================
setting                     environment variable   on: / off:
==========================  =====================  =================================================================
``INKERNEL_REDUCE``         ``DDL_INKERNEL_REDUCE``  weight gradients summed by reducer programs in the launch that
                                                   computes the partials (:mod:`deep_delta.ops.partials`) /
                                                   the launch writes its partial rows and torch sums them
``FUSE_NEXT_NORM``          ``DDL_FUSE_NEXT_NORM``   the next sublayer's norm, gate and value computed inside the
                                                   update (d_v = 1, and CC through its read;
                                                   :mod:`deep_delta.ops.delta.triton_norm`) / the next sublayer
                                                   runs its own norm kernel
``TC_ONE_PASS``             ``DDL_TC_ONE_PASS``      the fused update + TC read's backward sums the first four
                                                   taps' gradient in the update's backward pass / a second
                                                   kernel sums every tap's gradient from the saved new state
``FUSED_RULES``             ``DDL_FUSED_RULES``      the write-only and untied update rules run the delta rule's
                                                   fused kernels (a mode of each: the update, with the next CC or
                                                   TC read, with the next norm; the untied sublayer's norm, gate
                                                   and value kernel with its two gates) and fuse where the delta
                                                   rule does / their lean path, never fused (as before issue 59)
==========================  =====================  =================================================================

Values: ``1``, ``true``, ``on``, ``yes`` / ``0``, ``false``, ``off``, ``no`` (any case); anything else is an
error at import naming the variable. In code::

    from deep_delta.ops import switches
    switches.INKERNEL_REDUCE = True            # from now on
    with switches.override(TC_ONE_PASS=True):  # inside the block only
        ...

Under ``torch.compile`` the model's choice of fusion (``FUSE_NEXT_NORM``, ``FUSED_RULES``) is read while tracing: set
it before compiling. The docs (docs/kernels.md, "Switches") say what each path measured and when its default changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")
NAMES = {"INKERNEL_REDUCE": "DDL_INKERNEL_REDUCE", "FUSE_NEXT_NORM": "DDL_FUSE_NEXT_NORM",
         "TC_ONE_PASS": "DDL_TC_ONE_PASS", "FUSED_RULES": "DDL_FUSED_RULES"}


def env_flag(name: str, default: bool) -> bool:
    """The boolean environment variable ``name`` (unset or empty: ``default``); ``ValueError`` naming it for any
    other value than the ones listed in this module's docstring."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"environment variable {name}: got {os.environ[name]!r}; allowed: "
                     f"{', '.join(_TRUE)} (on) or {', '.join(_FALSE)} (off)")


INKERNEL_REDUCE: bool = env_flag("DDL_INKERNEL_REDUCE", False)
FUSE_NEXT_NORM: bool = env_flag("DDL_FUSE_NEXT_NORM", False)
TC_ONE_PASS: bool = env_flag("DDL_TC_ONE_PASS", False)
FUSED_RULES: bool = env_flag("DDL_FUSED_RULES", False)


def current() -> dict[str, bool]:
    """Every switch's value now, by its setting's name (recorded by benchmarks beside their figures)."""
    return {name: bool(globals()[name]) for name in NAMES}


@contextlib.contextmanager
def override(**values: bool) -> Iterator[None]:
    """Set switches by their setting's names inside the block, restoring them after it."""
    unknown = sorted(set(values) - set(NAMES))
    if unknown:
        raise ValueError(f"switches.override: unknown switch {unknown[0]!r}; allowed: {', '.join(NAMES)}")
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ValueError(f"switches.override: {name} must be True or False, got {value!r}")
    before = current()
    globals().update(values)
    try:
        yield
    finally:
        globals().update({name: before[name] for name in values})
