"""A reactor shutdown trigger a component holds while it has something to let go of."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any


class ShutdownTrigger:
    """Calls *callback* in *phase* ("before", "during") of the reactor's shutdown, unless
    :meth:`disarm` ran first: for what a stop would otherwise abandon (a spider still
    opening, a worker thread that keeps the process alive, a wait to cut short)."""

    def __init__(self, phase: str, callback: Callable[[], Any]) -> None:
        self.phase = phase
        self.callback = callback
        self._handle: Any = None

    def arm(self) -> None:
        from twisted.internet import reactor

        if self._handle is None:
            self._handle = reactor.addSystemEventTrigger(self.phase, "shutdown", self._fire)

    def disarm(self) -> None:
        from twisted.internet import reactor

        if self._handle is not None:
            with contextlib.suppress(ValueError):  # fired and gone already
                reactor.removeSystemEventTrigger(self._handle)
            self._handle = None

    def _fire(self) -> Any:
        self._handle = None
        return self.callback()
