"""The leased frontier's requests in Redis: one Lua script per operation.

A scheduler queue for scrapy-redis fleets (:mod:`scrapy_retryqueue.crawl.frontier`)
keeps its requests here, in the spider's namespace: pushed once per
fingerprint (the frontier is its own dupefilter), leased to a node in batches
instead of popped, acknowledged once the node has finished them, handed back
when it stops, and taken back from a node that died when their leases expire,
with the retry queue's lease machinery (tokens from :mod:`.keys`, renew.lua,
a reclaim count, poison after RETRYQUEUE_MAX_RECLAIMS). Requests are stored
as JSON, never pickled. Calls are blocking; the crawl runs them on its Redis
worker thread.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..decision import kinds
from ..settings.defaults import QUEUE_BATCH
from ..values import as_text
from .keys import Keys, keys_for
from .wire import envelope_text, load_script_source, task_id_text, wire_id

FRONTIER_SCRIPT_NAMES = (
    "frontier_push",
    "frontier_lease",
    "frontier_ack",
    "frontier_release",
    "frontier_reap",
    "frontier_quarantine",
    "frontier_finish",
    "frontier_join",
    # The retry queue's own: it renews any leases given their two keys.
    "renew",
)
#: The two orders of the frontier: by request priority (scrapy-redis's
#: default queue), or first in, first out.
ORDERS = ("priority", "fifo")


@dataclass(frozen=True, slots=True)
class Entry:
    """One request on its way into the frontier."""

    id: str
    #: The request's fingerprint; "" for a request that is not filtered (dont_filter).
    fingerprint: str
    priority: int
    #: The request as JSON text.
    request: str


@dataclass(slots=True)
class Leased:
    """What one lease call returned."""

    #: (request id, stored request) pairs now leased to the caller; a request that
    #: is not UTF-8 text is handed out as its bytes.
    requests: list[tuple[str, str | bytes]] = field(default_factory=list)
    #: Requests waiting in the frontier and leased to any node, after the call.
    waiting: int = 0
    leased: int = 0
    #: Ids in the frontier without a stored request, dropped.
    ghosts: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Finished:
    """The mark of a fleet's crawl that finished: when (ms, the finishing node's
    clock) and on which node."""

    at: int
    node: str

    @classmethod
    def parse(cls, raw: Any) -> Finished:
        """*raw* as frontier_finish.lua writes it, ``"<ms> <node id>"``; one whose time
        is not a number (this version did not write it) reads as finished at 0."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else as_text(raw)
        at, _, node = text.partition(" ")
        return cls(int(at) if at.isascii() and at.isdigit() else 0, node)

    def text(self) -> str:
        return f"{self.at} {self.node}"


@dataclass(frozen=True, slots=True)
class Joined:
    """What a node starting on the frontier found (frontier_join.lua)."""

    #: The crawl that finished: the node was refused (``refused``), or started a new
    #: crawl after it; None when no crawl had finished.
    finished: Finished | None = None
    refused: bool = False


class RedisFrontier:
    """One spider's leased frontier in Redis."""

    def __init__(
        self,
        client: redis.Redis | Any,
        spider: str,
        *,
        order: str = "priority",
        project: str = "",
    ) -> None:
        """*project* is the namespace (RETRYQUEUE_NAMESPACE) the spider's keys are in,
        as the retry queue's: "" for the layout without one."""
        if order not in ORDERS:
            raise ValueError(f"frontier order {order!r} is not one of {ORDERS}")
        self.client = client
        self.order = order
        self.keys: Keys = keys_for(spider, project)
        self._scripts = {
            name: client.register_script(load_script_source(name)) for name in FRONTIER_SCRIPT_NAMES
        }

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._scripts[name](keys=keys, args=args)

    def push(self, entries: Sequence[Entry]) -> list[bool]:
        """Add *entries*; True for each added, False for a duplicate (fingerprint seen)."""
        k = self.keys
        keys = [k.frontier, k.frontier_requests, k.frontier_scores, k.frontier_seen]
        keys.append(k.frontier_seq)
        added: list[bool] = []
        for start in range(0, len(entries), QUEUE_BATCH):
            args: list[Any] = [self.order]
            for e in entries[start : start + QUEUE_BATCH]:
                args += [wire_id(e.id), e.fingerprint, -e.priority, e.request]
            added += [bool(x) for x in self._run("frontier_push", keys, args)]
        return added

    def lease(self, *, limit: int, lease_until: int, token: str) -> Leased:
        """Lease up to *limit* requests, best first; also report the frontier's counts."""
        k = self.keys
        raw = self._run(
            "frontier_lease",
            [
                k.frontier,
                k.frontier_requests,
                k.frontier_leased,
                k.frontier_owners,
                k.frontier_scores,
            ],
            [max(0, min(limit, QUEUE_BATCH)), lease_until, token],
        )
        return _leased(raw)

    def ack(self, leases: dict[str, str]) -> list[str]:
        """Finish the leased requests in *leases* (id -> token); return the ids lost."""
        k = self.keys
        keys = [k.frontier_requests, k.frontier_leased, k.frontier_owners, k.frontier_scores]
        keys.append(k.frontier_reclaims)
        return [task_id_text(x) for x in self._each(leases, "frontier_ack", keys, list)]

    def release(self, leases: dict[str, str]) -> int:
        """Hand back held requests (id -> token): another node leases them at once."""
        k = self.keys
        keys = [k.frontier, k.frontier_leased, k.frontier_owners, k.frontier_scores]
        return int(self._each(leases, "frontier_release", keys, int))

    def renew(self, leases: dict[str, str], *, lease_until: int) -> list[str]:
        """Extend the leases in *leases* (id -> token); return the ids lost."""
        lost: list[str] = []
        items = list(leases.items())
        for start in range(0, len(items), QUEUE_BATCH):
            args: list[Any] = [lease_until]
            for request_id, token in items[start : start + QUEUE_BATCH]:
                args += [wire_id(request_id), token]
            keys = [self.keys.frontier_leased, self.keys.frontier_owners]
            lost += [task_id_text(x) for x in self._run("renew", keys, args)]
        return lost

    def reap(self, *, now: int, max_reclaims: int) -> tuple[list[str], list[str]]:
        """Return expired leases to the frontier; returns (reclaimed ids, quarantined ids)."""
        k = self.keys
        reclaimed, poisoned = self._run(
            "frontier_reap",
            [
                *(k.frontier, k.frontier_requests, k.frontier_leased, k.frontier_owners),
                *(k.frontier_scores, k.frontier_reclaims, k.frontier_quarantine),
            ],
            [now, QUEUE_BATCH, max_reclaims, kinds.POISON],
        )
        return [task_id_text(x) for x in reclaimed], [task_id_text(x) for x in poisoned]

    def quarantine(self, leases: dict[str, str], *, forged: Collection[str] = ()) -> int:
        """Take leased requests that cannot be read out of the frontier, kept as stored:
        as ``malformed``, or ``forged`` for the ids in *forged* (a signature that does
        not verify, RETRYQUEUE_SIGNING_KEYS)."""
        k = self.keys
        keys = [
            *(k.frontier_requests, k.frontier_leased, k.frontier_owners),
            *(k.frontier_scores, k.frontier_reclaims, k.frontier_quarantine),
        ]
        done = 0
        for kind, chosen in (
            (kinds.MALFORMED, {i: t for i, t in leases.items() if i not in forged}),
            (kinds.FORGED, {i: t for i, t in leases.items() if i in forged}),
        ):
            if not chosen:
                continue
            args: list[Any] = [kind]
            for request_id, token in chosen.items():
                args += [wire_id(request_id), token]
            done += int(self._run("frontier_quarantine", keys, args))
        return done

    def _each(self, leases: dict[str, str], script: str, keys: list[str], out: type) -> Any:
        """Run *script* over (id, token) pairs in batches; lists are joined, counts added."""
        total: Any = out()
        items = list(leases.items())
        for start in range(0, len(items), QUEUE_BATCH):
            args: list[Any] = []
            for request_id, token in items[start : start + QUEUE_BATCH]:
                args += [wire_id(request_id), token]
            total += self._run(script, keys, args)
        return total

    def finish(self, *, alive_after: int, mark: Finished | None = None) -> bool:
        """Forget the seen fingerprints when the crawl is over (nothing waits or is
        leased, no node with a heartbeat at or after *alive_after* still crawls),
        and then set *mark*, the crawl finished (None: the node was stopped)."""
        k = self.keys
        keys = [k.frontier, k.frontier_leased, k.frontier_seen, k.frontier_seq]
        keys += [k.due, k.leased, k.nodes, k.frontier_finished]
        args = [alive_after, mark.text() if mark is not None else ""]
        return bool(self._run("frontier_finish", keys, args))

    def join(self, node_id: str, *, now: int, restart: bool, started: int) -> Joined:
        """Join the fleet's crawl as *node_id* (its heartbeat written), unless that
        crawl finished; with *restart*, start a new one after a crawl that finished
        before this node *started* (ms)."""
        # The heartbeat of delayed.RedisDelayedQueue.heartbeat: registered, busy now.
        beat = f"{now} {now} {now}"
        args = [node_id, beat, "1" if restart else "0", started]
        state, mark = self._run(
            "frontier_join", [self.keys.frontier_finished, self.keys.nodes], args
        )
        if not int(state):
            return Joined()
        return Joined(Finished.parse(mark), refused=int(state) == 1)

    def counts(self) -> tuple[int, int]:
        """(waiting, leased) requests of the frontier."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.frontier)
        pipe.zcard(self.keys.frontier_leased)
        waiting, leased = pipe.execute()
        return int(waiting), int(leased)

    def quarantined(self) -> dict[str, tuple[str, str]]:
        """Request id -> (kind, stored text) of every quarantined request."""
        out: dict[str, tuple[str, str]] = {}
        for request_id, value in self.client.hgetall(self.keys.frontier_quarantine).items():
            kind, _, text = as_text(value).partition(" ")
            out[task_id_text(request_id)] = (kind, text)
        return out


def _leased(raw: Any) -> Leased:
    pairs = raw[3:]
    return Leased(
        requests=[
            (task_id_text(pairs[i]), envelope_text(pairs[i + 1])) for i in range(0, len(pairs), 2)
        ],
        waiting=int(raw[0]),
        leased=int(raw[1]),
        ghosts=[task_id_text(x) for x in raw[2]],
    )
