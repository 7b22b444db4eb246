"""A claim of due tasks: its script call (:func:`claim_call`) and what it returned (:class:`Claimed`).

claim.lua leases a batch of due tasks to one node in one step, holding back
those of cooling domains and of domains over their retry budget, and turns
ghosts (due ids without an envelope) into malformed dead letters; see its
header for its KEYS and ARGV.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..decision import kinds
from ..decision.retrybudget import SLOTS, slice_ms
from ..settings.defaults import ENVELOPE_VERSION, PROBE_RECHECK_MS
from .keys import Keys
from .wire import envelope_text, task_id_text


@dataclass(slots=True)
class Claimed:
    """What one claim call returned."""

    #: (task id, raw envelope) pairs now leased to the caller; an envelope that
    #: is not UTF-8 text is handed out as its bytes (see :func:`envelope_text`).
    tasks: list[tuple[str, str | bytes]] = field(default_factory=list)
    due: int = 0
    leased: int = 0
    #: Due time (ms) of the earliest task still waiting, None when there is none.
    next_due: int | None = None
    #: Ghosts: due ids without an envelope, now malformed dead letters (claim.lua).
    ghosts: list[str] = field(default_factory=list)
    #: Ghosts whose id already had a dead letter: dropped from due, that one kept.
    ghosts_kept: list[str] = field(default_factory=list)
    #: Domain -> tasks the retry budget moved to later instead of claiming them.
    budget_deferred: dict[str, int] = field(default_factory=dict)
    #: Domains whose budget record was malformed: started over (claim.lua).
    budget_malformed: list[str] = field(default_factory=list)
    #: Task id -> (version, finished) of each claimed task (RETRYQUEUE_SIGNING_KEYS):
    #: the ``updated`` recorded beside the live task, and the one of the envelope a
    #: task of its id last finished with; None where there is none.
    records: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """The retry budget a claim enforces (retrybudget.py): a share of each domain's
    fresh requests, the retries a window always allows, the window (s)."""

    share: float
    floor: float
    window: float

    def args(self, requests: Mapping[str, int]) -> list[Any]:
        """claim.lua's ARGV[13..]: the budget, then *requests* (domain -> fresh requests)."""
        args: list[Any] = [self.share, self.floor * self.window, slice_ms(self.window), SLOTS]
        for domain, count in requests.items():
            args += [domain, count]
        return args


def claim_call(
    keys: Keys,
    *,
    node_id: str,
    events_maxlen: int,
    now: int,
    limit: int,
    lease_until: int,
    token: str,
    cooldowns: bool = False,
    recheck_ms: int = PROBE_RECHECK_MS,
    deferral_max_wait_ms: int = 0,
    budget: RetryBudget | None = None,
    requests: Mapping[str, int] | None = None,
    records: bool = False,
) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of one claim (see :meth:`RedisDelayedQueue.claim`)."""
    k = keys
    return (
        [
            *(k.due, k.leased, k.tasks, k.owners, k.events, k.cooling, k.probes),
            *(k.dead, k.deadtasks, k.reclaims, k.taskinfo, k.deadkinds, k.budget),
            *(k.versions, k.finished),
        ],
        [
            *(now, limit, lease_until, token, node_id, events_maxlen),
            *(1 if cooldowns else 0, recheck_ms, deferral_max_wait_ms, ENVELOPE_VERSION),
            *(kinds.RATE_LIMITED, kinds.MALFORMED, 1 if records else 0),
            *(budget.args(requests or {}) if budget is not None else []),
        ],
    )


def parse_claimed(raw: Any) -> Claimed:
    """claim.lua's reply as a :class:`Claimed`."""
    over = raw[5]
    held = raw[7]
    pairs = raw[8:]
    tasks = [(task_id_text(pairs[i]), envelope_text(pairs[i + 1])) for i in range(0, len(pairs), 2)]
    return Claimed(
        tasks=tasks,
        due=int(raw[0]),
        leased=int(raw[1]),
        next_due=None if int(raw[2]) < 0 else int(raw[2]),
        ghosts=[task_id_text(x) for x in raw[3]],
        ghosts_kept=[task_id_text(x) for x in raw[4]],
        budget_deferred={
            task_id_text(over[i]): int(over[i + 1]) for i in range(0, len(over) - 1, 2)
        },
        # Domains come from taskinfo, which a hostile writer may fill with any bytes.
        budget_malformed=[task_id_text(x) for x in raw[6]],
        records={
            task_id: (_ms(held[2 * i]), _ms(held[2 * i + 1]))
            for i, (task_id, _) in enumerate(tasks)
            if 2 * i + 1 < len(held)
        },
    )


def _ms(raw: Any) -> int | None:
    """A record's time (ms) as Redis returned it; None for none, or one that is no time."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return int(value) if value == value and abs(value) < 2**53 else None
