"""SIGINT and SIGTERM while work runs: the first asks it to stop at the next safe point, a second stops it at
once. The trainer stops after its current optimizer step (with a checkpoint when it keeps one); a study of
several runs stops after its current run. One mechanism for both (:class:`StopSignals`), nested as they run:
the innermost handler is the one a signal reaches."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopSignals:
    """While active (main thread only; elsewhere it does nothing), the first SIGINT / SIGTERM is recorded in
    ``requested`` for the work to stop at its next safe point; a second one raises ``KeyboardInterrupt`` at
    once. On exit the previous handlers come back (a signal recorded here is passed on to an enclosing
    :class:`StopSignals`, whose work should stop too)."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopped at once")
        self.requested = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        outer = self._previous.get(signal.SIGINT)
        if self.requested is not None and isinstance(getattr(outer, "__self__", None), StopSignals):
            outer.__self__.requested = outer.__self__.requested or self.requested


__all__ = ["StopSignals"]
