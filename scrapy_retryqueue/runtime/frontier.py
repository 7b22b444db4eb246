"""The leased frontier's requests this node holds, and the one round trip that moves them.

Nothing here blocks the reactor. Pushed requests wait in an outbox; popped
requests come from a batch leased ahead; finished ones wait for their
acknowledgement. One worker call (:meth:`Frontier.io`) writes the pushes
first, then the acknowledgements, so a finished request's children are in
Redis before it leaves; then it renews what this node holds, reaps the other
expired leases (at polls), and leases the next batch, reading the frontier's counts.
The node's first round trip joins the fleet's crawl before anything else, or
finds that crawl finished, and then does nothing else.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..queue.frontier import Entry, Finished, Joined, Leased
from ..values import now_ms
from .renewal import RenewalClock

if TYPE_CHECKING:
    from collections.abc import Callable, Container

    from scrapy import Request

    from ..config import Config
    from ..queue.frontier import RedisFrontier


@dataclass(slots=True)
class FrontierResult:
    """What one frontier round trip did."""

    leased: Leased
    #: The lease token of the requests it leased.
    token: str
    #: Pushes refused as duplicates (their fingerprint was seen).
    duplicates: int = 0
    pushed: int = 0
    acked: int = 0
    quarantined: int = 0
    #: Ids this node no longer holds (acks and renewals refused).
    lost: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    poisoned: list[str] = field(default_factory=list)
    #: What the node's first round trip found when it joined (None: joined before).
    joined: Joined | None = None


@dataclass(slots=True)
class _Taken:
    """The state one round trip took from the node, put back if it fails."""

    entries: list[Entry]
    acks: dict[str, str]
    bad: dict[str, str]


class Frontier:
    def __init__(self, config: Config, new_token: Callable[[], str]) -> None:
        self.config = config
        self._new_token = new_token
        #: A scheduler queue of the leased frontier uses this crawler.
        self.in_use = False
        self.order = "priority"
        #: How many requests one lease takes: what this node can run at once.
        self.batch = max(1, config.max_in_flight)
        self.outbox: list[Entry] = []
        #: Requests that cannot be stored as JSON: crawled from memory.
        self.local: deque[Request] = deque()
        #: Leased, not popped yet: (id, stored request, token).
        self.ready: deque[tuple[str, str | bytes, str]] = deque()
        #: Popped, handed to the engine: id -> (token, request).
        self.running: dict[str, tuple[str, Request]] = {}
        #: Finished, to acknowledge: id -> token.
        self.done: dict[str, str] = {}
        #: Leased but unreadable, to quarantine: id -> token.
        self.bad: dict[str, str] = {}
        #: The ids of ``bad`` refused as forged (a signature that does not verify),
        #: quarantined as such rather than as malformed.
        self.forged: set[str] = set()
        #: Leased, sound, but no key of this node opens it: id -> token, renewed and
        #: handed back at close for a node that has the key.
        self.kept: dict[str, str] = {}
        #: Ids whose failure is being parked: acknowledged once the park is written.
        self.parking: dict[str, int] = {}
        #: The fleet's frontier at the last round trip: waiting, leased (any node).
        self.waiting = 0
        self.leased = 0
        self._renewal = RenewalClock(config.lease_time)
        self._taken: _Taken | None = None
        #: When this node started (ms): made with the crawl's components, before
        #: any wait for Redis. A crawl that finished after it is one it came late to.
        self.started = now_ms()
        #: The spider seeds the crawl with its start requests (not a scrapy-redis
        #: spider fed from a Redis list): a finished crawl is not seeded again.
        self.seeds = True
        #: The first round trip joined the fleet's crawl (or found it finished).
        self.joined = False
        #: The fleet's crawl finished before this node joined: it crawls nothing.
        self.refused: Finished | None = None
        #: The frontier was deleted during the crawl (SCHEDULER_PERSIST False).
        self.cleared = False

    def __len__(self) -> int:
        """Requests the scheduler can still get: local, leased ahead, and the fleet's waiting."""
        return len(self.outbox) + len(self.local) + len(self.ready) + self.waiting

    @property
    def holds(self) -> bool:
        """This node has frontier work that is not in Redis's final state yet."""
        return bool(
            self.outbox or self.local or self.ready or self.running or self.done or self.bad
        )

    @property
    def wants_lease(self) -> bool:
        return len(self.ready) <= self.batch // 2

    def settle(self, in_progress: Container[Request] | None) -> None:
        """Requests the engine has finished with (no longer in progress) are done."""
        if in_progress is None:
            return
        for request_id, (token, request) in list(self.running.items()):
            if request not in in_progress and request_id not in self.parking:
                del self.running[request_id]
                self.done[request_id] = token

    def hand_back(self, request_id: Any) -> None:
        """A request the engine gives up without running it (its download cancelled by
        the shutdown): kept under lease, handed back when the node closes."""
        entry = self.running.pop(request_id, None) if isinstance(request_id, str) else None
        if entry is not None:
            self.kept[request_id] = entry[0]

    def park_started(self, request_id: str) -> bool:
        if request_id not in self.running:
            return False
        self.parking[request_id] = self.parking.get(request_id, 0) + 1
        return True

    def park_finished(self, request_id: str) -> None:
        left = self.parking.get(request_id, 0) - 1
        if left > 0:
            self.parking[request_id] = left
        else:
            self.parking.pop(request_id, None)

    def io(
        self, store: RedisFrontier, *, maintain: bool, lease: bool
    ) -> Callable[[], FrontierResult]:
        """The blocking part of one round trip, as a function for the worker thread.

        What it writes is taken now, on the reactor thread (:meth:`failed` puts it
        back when Redis does not take it).
        """
        config = self.config
        taken = _Taken(self.outbox, self.done, self.bad)
        self.outbox, self.done, self.bad = [], {}, {}
        self._taken = taken
        renew: dict[str, str] = {}
        renews = self._renewal.round_trip() if maintain else None
        if maintain:
            renew = {request_id: token for request_id, _, token in self.ready}
            renew.update((request_id, token) for request_id, (token, _) in self.running.items())
            renew.update(self.kept)
        limit = max(0, self.batch - len(self.ready)) if lease and self.wants_lease else 0
        token = self._new_token()
        lease_ms = int(config.lease_time * 1000)
        max_reclaims = config.max_reclaims
        join = self.seeds and not self.joined
        forged = frozenset(self.forged)

        def io() -> FrontierResult:
            now_ = now_ms()
            result = FrontierResult(Leased(), token)
            if join:
                # Before the first push: a finished crawl is not seeded again.
                result.joined = store.join(
                    config.node_id, now=now_, restart=config.frontier_restart, started=self.started
                )
                if result.joined.refused:
                    return result
            if taken.entries:
                added = store.push(taken.entries)
                result.pushed = sum(added)
                result.duplicates = len(added) - result.pushed
            if taken.acks:
                lost = store.ack(taken.acks)
                result.acked = len(taken.acks) - len(lost)
                result.lost += lost
            if taken.bad:
                result.quarantined = store.quarantine(taken.bad, forged=forged)
            # Before the reap (renewal.py): a node that stalled past its leases keeps
            # them instead of reaping and fetching them again.
            if renew and renews is not None and renews(now_):
                result.lost += store.renew(renew, lease_until=now_ + lease_ms)
            if maintain:
                result.reclaimed, result.poisoned = store.reap(now=now_, max_reclaims=max_reclaims)
            result.leased = store.lease(limit=limit, lease_until=now_ + lease_ms, token=token)
            return result

        return io

    def landed(self, result: FrontierResult) -> None:
        self._taken = None
        if result.joined is not None:
            self.joined = True
            if result.joined.refused:
                # Nothing of this node's reaches the frontier: what it took is dropped.
                self.refused = result.joined.finished
                self.ready.clear()
                self.local.clear()
                self.outbox.clear()
                return
        self.waiting, self.leased = result.leased.waiting, result.leased.leased
        lost = set(result.lost)
        if lost:
            # Another node may hold them now: this one neither renews nor acks them.
            self.ready = deque(r for r in self.ready if r[0] not in lost)
            for request_id in lost:
                self.running.pop(request_id, None)
                self.kept.pop(request_id, None)
        for request_id, raw in result.leased.requests:
            self.ready.append((request_id, raw, result.token))

    def failed(self) -> None:
        """The round trip did not reach Redis: what it took waits for the next one."""
        taken, self._taken = self._taken, None
        if taken is None:
            return
        self.outbox[:0] = taken.entries
        self.done.update(taken.acks)
        self.bad.update(taken.bad)

    def take_all(self) -> tuple[list[Entry], dict[str, str], dict[str, str], dict[str, str]]:
        """Everything this node holds, forgotten here: (pushes, acks, quarantines,
        leases to hand back). At close, when the engine has finished every request."""
        entries, acks, bad = self.outbox, self.done, self.bad
        release = {request_id: token for request_id, _, token in self.ready}
        release.update((request_id, token) for request_id, (token, _) in self.running.items())
        release.update(self.kept)
        self.outbox, self.done, self.bad, self.kept = [], {}, {}, {}
        self.ready.clear()
        self.running.clear()
        return entries, acks, bad, release


def close_io(
    store: RedisFrontier,
    entries: list[Entry],
    acks: dict[str, str],
    bad: dict[str, str],
    release: dict[str, str],
    *,
    alive_after: int,
    mark: Finished | None,
    forged: frozenset[str] = frozenset(),
) -> tuple[int, int, int, bool]:
    """The last round trip of a node: pushes, acks, quarantines, then hand back the
    rest; a crawl found over forgets its seen fingerprints and, with *mark* (the
    spider ran out of work), is marked finished (frontier_finish.lua).

    Returns (pushed, acked, released, over).
    """
    pushed = sum(store.push(entries)) if entries else 0
    acked = len(acks) - len(store.ack(acks)) if acks else 0
    if bad:
        store.quarantine(bad, forged=forged)
    released = store.release(release) if release else 0
    return pushed, acked, released, store.finish(alive_after=alive_after, mark=mark)


def finished_line(spider: str, joined: Joined, started: int, restart: bool) -> str:
    """What a node joining the frontier found of the fleet's crawl that finished:
    the one log line of a node refused, or of one that starts a new crawl."""
    assert joined.finished is not None
    at = joined.finished.at
    when = datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ago = max(0, now_ms() - at) // 1000
    said = f"the crawl of spider {spider!r} on the leased frontier finished at {when}"
    said += f" ({_duration(ago)} ago" + (
        f", on node {joined.finished.node})" if joined.finished.node else ")"
    )
    if not joined.refused:
        return f"{said}; this node starts a new crawl of it (RETRYQUEUE_FRONTIER_RESTART)"
    if restart and at >= started:
        return (
            f"{said}, after this node started: the node came too late to that crawl and "
            "crawls nothing (RETRYQUEUE_FRONTIER_RESTART starts a new crawl only after one "
            "that finished before the node started)"
        )
    return (
        f"{said}; this node crawls nothing. To crawl {spider!r} again from its start "
        "requests, run it with -s RETRYQUEUE_FRONTIER_RESTART=True"
    )


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def entry_for(request_id: str, fingerprint: str, request: Request, text: str) -> Entry:
    return Entry(request_id, fingerprint, int(request.priority), text)


def reason_of(value: Any) -> str:
    return f"{type(value).__name__}: {value}"
