"""Moved to :mod:`deep_delta.experiments.compare` (kept importable from here)."""

from deep_delta.experiments.compare import *  # noqa: F401,F403
from deep_delta.experiments.compare import COMPARE_DEFAULTS, DEFAULT_VARIANTS, run_compare, summarize  # noqa: F401
