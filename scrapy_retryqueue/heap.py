"""The process's heap frozen while a crawl runs, so full collections skip what lives as long as it.

CPython's full collections walk every tracked object, the modules' too: about a
third of a lean crawl's CPU goes to the collector, and the add-on's imports
(redis-py alone some 13,000 objects) would lengthen each walk. Frozen objects
(:func:`gc.freeze`) are skipped until :func:`gc.unfreeze`. Frozen before a fork,
the crawl's collector also leaves alone the pages its forked store writer shares
with it, as Python's documentation advises for fork without exec.

Holds are counted: the heap is unfrozen when the last is released (a process
running several crawls, a crawl and its writer), so a crawl that ends leaves
nothing frozen behind. A heap someone else froze before the first hold is theirs:
no hold freezes or thaws it. (A ``gc.freeze()`` of theirs made while holds stand
is thawed with the last release.) What was tracked at a hold and became cyclic
garbage since waits for the last release to be collected: the crawl's long-lived
start-up objects, and, where several crawls share the process, what another crawl
had in flight when this one's engine started.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

_lock = threading.Lock()
#: Holds not yet released in this process.
_holds = 0


def _nothing() -> None:
    return None


def hold() -> Callable[[], None]:
    """Freeze every object the collector tracks now; returns this hold's release
    (thread-safe; a second call does nothing)."""
    global _holds
    with _lock:
        if _holds == 0 and gc.get_freeze_count():
            return _nothing
        _holds += 1
        gc.freeze()
    released = False

    def release() -> None:
        global _holds
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _holds -= 1
            if _holds == 0:
                gc.unfreeze()

    return release


def holds() -> int:
    """Holds not yet released in this process."""
    return _holds


def reset() -> None:
    """Forget every hold and thaw the heap: for a test that left one behind."""
    global _holds
    with _lock:
        _holds = 0
        gc.unfreeze()
