"""When a round trip to Redis renews the leases a node holds (no I/O).

Every third of RETRYQUEUE_LEASE_TIME, and whenever a round trip runs a third
of the lease after it was made on the reactor thread: the process stalled in
between (a loaded machine, a frozen VM), and the leases may have run out. The
renewal comes before the round trip's reap, so a node that only stalled keeps
every lease no other node took meanwhile. The retry queue's poll and the leased
frontier's round trip share this rule.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..values import now_ms

if TYPE_CHECKING:
    from collections.abc import Callable


class RenewalClock:
    def __init__(self, lease_time: float) -> None:
        self.lease_time = lease_time
        #: When the last renewal was due (time.time()); 0: the first round trip renews.
        self.last = 0.0

    def round_trip(self) -> Callable[[int], bool]:
        """For a round trip made now: whether it renews, asked with the time (ms) it runs."""
        now = time.time()
        due = now - self.last >= self.lease_time / 3
        if due:
            self.last = now
        made = now_ms()
        held_up_ms = int(self.lease_time * 1000) // 3
        return lambda running: due or running - made >= held_up_ms
