"""The tasks this node holds under lease, and the poll that claims, renews and reaps them.

One poll is one worker call: hand back what earlier polls whose reply was
lost had claimed, renew what this node holds, return the other expired leases
to due (or dead-letter a poison task), claim as many due tasks as it has room for, and
read the cooling domains. Nothing due in the future is held in
memory: only the ids and tokens of tasks this node is running.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..decision.recovery import RecoveryStats, read_records
from ..queue.keys import lease_prefix, lease_token
from ..settings.defaults import PROBE_RECHECK_MS, QUEUE_BATCH
from ..values import now_ms
from .renewal import RenewalClock

if TYPE_CHECKING:
    from collections.abc import Callable

    from twisted.internet.defer import Deferred

    from ..config import Config
    from ..queue.delayed import Claimed, RedisDelayedQueue, RetryBudget
    from ..queue.domains import DomainCooldowns


@dataclass(slots=True)
class PollResult:
    claimed: Claimed
    reclaimed: list[str] = field(default_factory=list)
    poisoned: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    #: The lease token of every task this poll claimed.
    token: str = ""
    #: Domains cooling down (domain -> end, ms); None when cooldowns are off.
    cooling: dict[str, int] | None = None
    #: Every node crawling the spider: node id -> (heartbeat ms, last busy ms,
    #: registered ms).
    nodes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: The learned recovery records, read when a learning strategy's refresh was
    #: due (else None), and the fields found malformed (recovery.read_records).
    recovery: tuple[RecoveryStats, list[str]] | None = None
    #: Tasks handed back that earlier polls whose reply was lost had claimed.
    unclaimed: list[str] = field(default_factory=list)
    #: The lease tokens of those polls, settled now.
    settled: list[str] = field(default_factory=list)


class Leases:
    def __init__(self, config: Config) -> None:
        self.config = config
        #: Task id -> lease token, for the tasks this node runs now.
        self.held: dict[str, str] = {}
        #: Task id -> lease token, for tasks whose last write (ack, reschedule, dead
        #: letter, hand-back) is on its way: no longer room taken, but renewed until
        #: the write lands, so that a poll that runs before it cannot reap them.
        self.writing: dict[str, str] = {}
        self._prefix = lease_prefix(config.node_id)
        self._serial = itertools.count()
        self._renewal = RenewalClock(config.lease_time)
        self._last_learned = float("-inf")
        #: Lease tokens of polls that failed on the way (a timeout, a lost
        #: connection): their claim may have run, leasing tasks this node never
        #: learned of. The next poll hands those back (unclaim.lua).
        self.doubtful: set[str] = set()

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, task_id: str, token: str) -> None:
        self.held[task_id] = token

    def written_by(self, task_id: str, landed: Deferred[Any]) -> None:
        """The task's last write is *landed* (a Deferred): the task leaves the held
        ones now and is renewed with them until the write has landed or failed."""
        token = self.held.pop(task_id, None)
        if token is None:
            return
        self.writing[task_id] = token

        def done(result: Any) -> Any:
            if self.writing.get(task_id) == token:
                del self.writing[task_id]
            return result

        landed.addBoth(done)

    def take_all(self) -> dict[str, str]:
        """Every lease held, forgotten here (the caller hands them back)."""
        leases, self.held = self.held, {}
        return leases

    @property
    def room(self) -> int:
        return max(0, self.config.max_in_flight - len(self.held))

    def new_token(self) -> str:
        return lease_token(self._prefix, next(self._serial))

    def poll_io(
        self,
        queue: RedisDelayedQueue,
        domains: DomainCooldowns | None,
        *,
        last_busy: int,
        registered: int = 0,
        learns: bool = False,
        budget: RetryBudget | None = None,
        requests: dict[str, int] | None = None,
    ) -> tuple[Callable[[], PollResult], str]:
        """The blocking part of one poll, as a function for the worker thread, and the
        lease token its claim uses (see :meth:`doubt`).

        What to renew and how much room there is are read now, on the reactor
        thread; Redis is called only by the returned function. With *learns* (the
        strategy learns), the recovery records are read in the heartbeat's round
        trip once every RETRYQUEUE_LEARNED_REFRESH seconds, and decoded there. With
        *budget*, the claim adds *requests* (this node's fresh requests per domain
        since its last poll) to the fleet's retry budget and holds to it.
        """
        config = self.config
        now = time.time()
        held = {**self.writing, **self.held}
        renews = self._renewal.round_trip()
        room = self.room
        token = self.new_token()
        lease_ms = int(config.lease_time * 1000)
        max_wait = config.deferral_max_wait
        max_wait_ms = 0 if max_wait is None else max(1, int(max_wait * 1000))
        doubtful = sorted(self.doubtful)
        learned: list[Any] | None = None
        if learns and now - self._last_learned >= config.learned_refresh:
            learned = []
            self._last_learned = now
        half_life = config.learned_half_life

        def io() -> PollResult:
            now_ = now_ms()
            # First, so that this very claim may take them again.
            unclaimed = queue.unclaim(doubtful, now=now_) if doubtful else []
            # Renewed before the reap (renewal.py): a node that stalled past its
            # leases keeps them rather than reaping its own tasks and running them
            # a second time beside the first.
            lost = queue.renew(held, lease_until=now_ + lease_ms) if renews(now_) else []
            reclaimed, poisoned = queue.reap(
                now=now_, limit=QUEUE_BATCH, max_reclaims=config.max_reclaims
            )
            claimed = queue.claim(
                now=now_,
                limit=room,
                lease_until=now_ + lease_ms,
                token=token,
                cooldowns=domains is not None,
                recheck_ms=PROBE_RECHECK_MS,
                deferral_max_wait_ms=max_wait_ms,
                budget=budget,
                requests=requests,
            )
            cooling = domains.cooling() if domains is not None else None
            nodes = queue.heartbeat(
                now=now_, last_busy=last_busy, registered=registered, learned=learned
            )
            recovery = None
            if learned:
                recovery = read_records(learned[0], now=now_, half_life=half_life)
            return PollResult(
                claimed,
                reclaimed,
                poisoned,
                lost,
                token,
                cooling,
                nodes,
                recovery,
                unclaimed,
                doubtful,
            )

        return io, token

    def doubt(self, token: str) -> None:
        """The poll that used *token* failed on the way: its claim may have run."""
        self.doubtful.add(token)

    def settle(self, tokens: list[str]) -> None:
        """What the polls that used *tokens* leased is back in due."""
        self.doubtful.difference_update(tokens)

    def lost(self, task_ids: list[str]) -> list[str]:
        """Forget the leases a renewal found gone; the ones that were still held.

        A task whose write landed between the poll's making and its renewal is
        gone for the best of reasons: it is not returned."""
        return [task_id for task_id in task_ids if self.held.pop(task_id, None) is not None]
