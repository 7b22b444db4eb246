"""What became of one write to the queue: the Outcome the glue acts on."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    #: A retry is in the queue, due later.
    PARKED = "parked"
    #: A dead letter is kept.
    DEAD = "dead"
    #: A re-injected request's task is done.
    ACKED = "acked"
    #: Another live task of the same request exists: it will run the request.
    DUPLICATE = "duplicate"
    #: The lease this write named was lost (reclaimed): another node runs the task.
    STALE = "stale"
    #: Redis is unreachable: the write waits in the local spool.
    SPOOLED = "spooled"
    #: Redis refused the write.
    ERROR = "error"

    @property
    def request_parked(self) -> bool:
        """True when the failed request will come back (or another copy runs): it
        leaves the crawl now as RequestParked instead of reaching its errback."""
        return self in _PARKING


_PARKING = frozenset((Outcome.PARKED, Outcome.SPOOLED, Outcome.DUPLICATE, Outcome.STALE))

#: Outcome of a write by its op, when refused (False) or applied (True); a
#: refused write without a lease token met a live task: a duplicate.
WRITE_OUTCOMES: dict[str, dict[bool, Outcome]] = {
    "schedule": {False: Outcome.DUPLICATE, True: Outcome.PARKED},
    "reschedule": {False: Outcome.STALE, True: Outcome.PARKED},
    "ack": {False: Outcome.STALE, True: Outcome.ACKED},
    "deadletter": {False: Outcome.STALE, True: Outcome.DEAD},
}
