"""Read-only view of the queue in Redis for people: counts, tasks, dead letters, events, cooling, learned records.

Never writes. Serves ``scrapy retryqueue status``, ``scrapy deadletters`` and the dashboard.
Key names and lease tokens come from :mod:`scrapy_retryqueue.queue.keys`; the
writes are :mod:`scrapy_retryqueue.queue.delayed`'s (and the store writer's).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from ..decision.retrybudget import DomainBudget, read_budgets
from ..queue.domains import parse_state
from ..queue.events import Event, entry_ms, entry_type, parse_entries
from ..queue.keys import all_keys, keys_for, lease_owner, scan_pattern, spider_of
from ..settings.defaults import STORE_CONSUMER_GROUP
from ..values import as_text

#: Entries one XRANGE / XREVRANGE call reads.
_PAGE = 5000


# Every reader takes the project's namespace (Config.namespace; "" for keys
# without one): two projects' spiders of one name are two queues.


def spiders(client: Any, project: str = "") -> set[str]:
    """The spiders of *project* that have any key in Redis."""
    return _spiders_matching(client, scan_pattern(project=project), project)


def spiders_with_events(client: Any, project: str = "") -> set[str]:
    """The spiders of *project* that have an events stream in Redis."""
    return _spiders_matching(client, scan_pattern("events", project), project)


def _spiders_matching(client: Any, pattern: str, project: str) -> set[str]:
    found = set()
    for key in client.scan_iter(match=pattern, count=1000):
        spider = spider_of(key, project)
        if spider is not None:
            found.add(spider)
    return found


def has_keys(client: Any, spider: str, project: str = "") -> bool:
    if client is None:
        return False
    return bool(client.exists(*all_keys(keys_for(spider, project))))


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """One spider's queue as it is now."""

    due: int
    #: Due at the time asked about or earlier.
    due_now: int
    leased: int
    #: Dead letters not yet in the SQL store.
    dead_in_redis: int
    #: Events the store writer has not written; None when Redis cannot tell.
    events_unwritten: int | None
    #: Domains cooling down or half-open, soonest end first (JSON-ready dicts).
    cooling: list[dict[str, Any]] = field(default_factory=list)


def counts(client: Any, spider: str, now_ms: int, project: str = "") -> QueueCounts:
    k = keys_for(spider, project)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(k.due)
    pipe.zcount(k.due, "-inf", now_ms)
    pipe.zcard(k.leased)
    pipe.zcard(k.dead)
    pipe.exists(k.events)
    pipe.zrange(k.cooling, 0, -1, withscores=True)
    pipe.hgetall(k.domains)
    due, due_now, leased, dead, has_events, cooling, states = pipe.execute()
    return QueueCounts(
        due=int(due),
        due_now=int(due_now),
        leased=int(leased),
        dead_in_redis=int(dead),
        events_unwritten=_unwritten(client, k.events) if has_events else None,
        cooling=_cooling(cooling, states),
    )


def _unwritten(client: Any, stream: str) -> int | None:
    """Events the store's consumer group has not acknowledged (all of them without a group)."""
    try:
        for group in client.xinfo_groups(stream):
            info = {as_text(k): v for k, v in group.items()}
            if as_text(info.get("name", "")) == STORE_CONSUMER_GROUP:
                # Read by a writer and not acknowledged, plus not yet delivered
                # (lag: None before Redis 7 or when Redis cannot tell).
                return int(info["pending"]) + int(info.get("lag") or 0)
        return int(client.xlen(stream))
    except redis.ResponseError:
        return None


def _cooling(cooling: list[tuple[Any, float]], states: dict[Any, Any]) -> list[dict[str, Any]]:
    out = []
    for raw_domain, until in cooling:
        domain = as_text(raw_domain)
        state = parse_state(states.get(raw_domain) or states.get(domain)) or {}
        out.append(
            {
                "domain": domain,
                "until": int(until),
                "state": state.get("state", "cooling"),
                "level": state.get("level"),
                "reason": state.get("reason"),
            }
        )
    return out


def budgets(
    client: Any,
    spider: str,
    now_ms: int,
    *,
    share: float,
    floor: float,
    window: float,
    project: str = "",
) -> tuple[list[DomainBudget], list[str]]:
    """The retry budget of each domain with requests or retries in its window now,
    busiest first, by the budget's settings; and the domains whose record is malformed."""
    raw = client.hgetall(keys_for(spider, project).budget)
    return read_budgets(raw, now=now_ms, share=share, floor=floor, window=window)


def lease_holders(client: Any, spider: str, project: str = "") -> Counter[str]:
    """Leased tasks per node id."""
    owners = keys_for(spider, project).owners
    return Counter(lease_owner(token) for token in client.hvals(owners))


@dataclass(frozen=True, slots=True)
class TaskPlace:
    """Where one task is in the queue now; all None when it is not there."""

    due_ms: int | None
    lease_until_ms: int | None
    #: The node id that holds its lease.
    held_by: str | None
    dead_in_redis: bool


def task_place(client: Any, spider: str, task_id: str, project: str = "") -> TaskPlace:
    k = keys_for(spider, project)
    pipe = client.pipeline(transaction=False)
    pipe.zscore(k.due, task_id)
    pipe.zscore(k.leased, task_id)
    pipe.hget(k.owners, task_id)
    pipe.zscore(k.dead, task_id)
    due, leased, owner, dead = pipe.execute()
    return TaskPlace(
        due_ms=None if due is None else int(due),
        lease_until_ms=None if leased is None else int(leased),
        held_by=None if owner is None else lease_owner(owner),
        dead_in_redis=dead is not None,
    )


def event_types_since(
    client: Any, spider: str, since_ms: int, *, limit: int, project: str = ""
) -> tuple[list[tuple[int, str]], bool]:
    """(time in ms, type) of the spider's events from *since_ms* on, oldest first, at
    most about *limit* of them; and whether *limit* cut the list short. An entry
    of no known type has the type ``""``."""
    key = keys_for(spider, project).events
    out: list[tuple[int, str]] = []
    cursor = f"{since_ms}-0"
    read = 0
    while read < limit:
        entries = client.xrange(key, min=cursor, max="+", count=_PAGE)
        if not entries:
            return out, False
        for entry_id, fields in entries:
            out.append((entry_ms(entry_id), entry_type(fields)))
        read += len(entries)
        cursor = "(" + as_text(entries[-1][0])
        if len(entries) < _PAGE:
            return out, False
    return out, True


def task_events(
    client: Any, spider: str, task_id: str, *, scan: int, project: str = ""
) -> list[tuple[int, Event]]:
    """(time in ms, event) of one task's events among the newest *scan* of its
    spider, oldest first (a claim's entry lists several tasks: its event for
    this one). Entries that are no event this version reads are left out."""
    key = keys_for(spider, project).events
    out: list[tuple[int, Event]] = []
    cursor = "+"
    scanned = 0
    page = 2000
    while scanned < scan:
        entries = client.xrevrange(key, max=cursor, min="-", count=page)
        if not entries:
            break
        for parsed in parse_entries(entries):
            if isinstance(parsed, Event) and parsed.task_id == task_id:
                out.append((entry_ms(parsed.stream_id), parsed))
        scanned += len(entries)
        cursor = "(" + as_text(entries[-1][0])
        if len(entries) < page:
            break
    out.reverse()
    return out


@dataclass(frozen=True, slots=True)
class RecoveryHash:
    """One spider's learned recovery records as stored (decision/recovery.py), unread."""

    #: Field -> value, as Redis returned them (bytes or text).
    fields: dict[Any, Any]
    #: More fields than the reader took (the first *limit* are here).
    truncated: bool = False
    #: Why the key could not be read (a key of another type); None when it was.
    problem: str | None = None


def recovery_hash(client: Any, spider: str, project: str = "", *, limit: int) -> RecoveryHash:
    """The ``recovery`` hash of *spider*, at most *limit* fields (HSCAN: a hash grown
    past its bound by another writer is not read whole)."""
    key = keys_for(spider, project).recovery
    fields: dict[Any, Any] = {}
    try:
        for name, value in client.hscan_iter(key, count=min(1000, max(10, limit))):
            if len(fields) >= limit:
                return RecoveryHash(fields, truncated=True)
            fields[name] = value
    except redis.ResponseError as exc:  # WRONGTYPE: another writer's key
        return RecoveryHash({}, problem=f"{as_text(key)} cannot be read as a hash ({exc})")
    return RecoveryHash(fields)
