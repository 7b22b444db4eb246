"""Waiting for a condition in tests: poll it until it holds, never sleep a fixed time.

A fixed ``time.sleep`` is either too short on a busy machine (a flaky test) or
too long everywhere else (a slow one); polling returns as soon as the event
happened and fails with what was awaited when it never does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

#: How often a condition is checked (seconds).
POLL = 0.05


def wait_for(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    """Return as soon as ``condition()`` is true; fail the test after *timeout* s.

    A condition that raises a connection error (a server still starting or
    already stopped) counts as false, so a condition can talk to a server the
    test is waiting for.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL)
