"""The process's heap frozen while a crawl runs, so full collections skip what lives as long as it.

CPython's full collections walk every tracked object, the modules' too: about a
third of a lean crawl's CPU goes to the collector, and the add-on's imports
(redis-py alone some 13,000 objects) would lengthen each walk. Frozen objects
(:func:`gc.freeze`) are skipped until :func:`gc.unfreeze`. Frozen just before a
fork, the crawl's collector also leaves alone the pages its forked store writer
shares with it, as Python's documentation advises for fork without exec.

Holds are counted: the heap is unfrozen when the last is released (a process
running several crawls, a crawl and its writer), so a crawl that ends leaves
nothing frozen behind; a heap someone else froze first is left frozen. What was
tracked at a hold and became cyclic garbage since waits for the release to be
collected: the crawl's long-lived start-up objects, not its pages.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

_lock = threading.Lock()
#: Holds not yet released in this process.
_holds = 0
#: Whether the last release unfreezes: nobody had frozen the heap before the first hold.
_thaw = False


def hold() -> Callable[[], None]:
    """Freeze every object the collector tracks now; returns this hold's release
    (thread-safe, and a second call does nothing)."""
    global _holds, _thaw
    with _lock:
        if _holds == 0:
            _thaw = gc.get_freeze_count() == 0
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
            if _holds == 0 and _thaw:
                gc.unfreeze()

    return release


def holds() -> int:
    """Holds not yet released in this process."""
    return _holds
