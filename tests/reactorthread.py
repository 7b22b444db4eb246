"""In-process component tests: the Twisted reactor on a thread of its own.

The package's components need a running reactor: the runtime's worker thread
reports back through it, the extension polls with ``callLater``, and their
``async def`` methods await Deferreds turned into asyncio futures of the
reactor's loop. A reactor cannot be restarted, so one runs for the whole test
session on a daemon thread, and a test hands it the code to run::

    result = reactor_thread.run(middleware.process_response, request, response)

``run`` calls the function on the reactor's thread, waits for its coroutine or
Deferred, and returns its result or raises its exception in the test's thread.
Everything a component does then happens on the reactor's thread, as in a
crawl, while the test itself may block (poll Redis, wait for a condition).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest

from .waiting import wait_for


class ReactorThread:
    def __init__(self) -> None:
        from twisted.internet import reactor

        self.reactor: Any = reactor
        self.thread = threading.Thread(target=self._serve, name="test-reactor", daemon=True)

    def _serve(self) -> None:
        # No signal handlers: those belong to the main thread (pytest's).
        self.reactor.run(installSignalHandlers=False)

    def start(self) -> None:
        self.thread.start()
        wait_for(lambda: self.reactor.running, "the reactor to run", timeout=10)

    def stop(self) -> None:
        if self.reactor.running:
            self.reactor.callFromThread(self.reactor.stop)
        self.thread.join(10)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 30.0, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the reactor thread, awaited; its result here."""
        from scrapy.utils.defer import deferred_from_coro
        from twisted.internet import defer

        outcome: Future[Any] = Future()

        def call() -> None:
            d = defer.maybeDeferred(lambda: deferred_from_coro(fn(*args, **kwargs)))
            d.addCallbacks(outcome.set_result, lambda f: outcome.set_exception(f.value))

        self.reactor.callFromThread(call)
        try:
            return outcome.result(timeout)
        except FutureTimeout:
            pytest.fail(f"{getattr(fn, '__qualname__', fn)} did not finish within {timeout:g}s")
