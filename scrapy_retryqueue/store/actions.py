"""Changes people make to dead letters and waiting tasks: requeue, purge, retry now, cancel.

Shared by ``scrapy deadletters`` and the dashboard, which differ only in how
they pick the tasks (:class:`~.filters.Filters`) and report the outcome. The
queue side goes through :class:`~scrapy_retryqueue.queue.delayed.RedisDelayedQueue`
(its events tell the store writer); the store side is written here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, delete, update

from ..decision.kinds import FORGED
from ..exceptions import EnvelopeError
from ..queue.delayed import RedisDelayedQueue
from ..queue.envelope import task_from_json
from ..secure.signing import KeyRing
from ..settings.defaults import FINAL_TASK_STATUSES
from ..values import now_ms
from .db import Store
from .filters import Filters
from .models import tasks_table
from .queries import chunks

#: Statuses each action can change; other matching rows are left alone.
ACTION_STATUSES: dict[str, tuple[str, ...]] = {
    "retry_now": ("waiting",),
    "cancel": ("waiting", "retrying"),
    "requeue": ("dead",),
    "purge": FINAL_TASK_STATUSES,
}
ACTIONS = tuple(ACTION_STATUSES)

#: Called with the number of rows read, before they are changed (a progress line).
OnChunk = Callable[[int], None]


def applicable(action: str, filters: Filters) -> Filters:
    """*filters* narrowed to the statuses *action* can change."""
    allowed = ACTION_STATUSES[action]
    return dataclasses.replace(filters, statuses=[s for s in filters.statuses if s in allowed])


class _Queues:
    """One queue per spider, made on first use."""

    def __init__(
        self,
        client: Any,
        *,
        node_id: str,
        events_maxlen: int,
        project: str,
        signing: KeyRing | None = None,
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.events_maxlen = events_maxlen
        self.project = project
        self.signing = signing
        self._queues: dict[str, RedisDelayedQueue] = {}

    def __call__(self, spider: str) -> RedisDelayedQueue:
        if spider not in self._queues:
            self._queues[spider] = RedisDelayedQueue(
                self.client,
                spider,
                node_id=self.node_id,
                events_maxlen=self.events_maxlen,
                project=self.project,
                signing=self.signing,
            )
        return self._queues[spider]


# -- requeue -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Malformed:
    """A dead letter whose envelope cannot be read back, so it cannot be requeued."""

    row_id: int
    url: str | None
    reason: str


@dataclass(slots=True)
class Requeued:
    moved: int = 0
    #: Dead letters whose request has a live retry in the queue already (left as they are).
    live: int = 0
    malformed: list[Malformed] = field(default_factory=list)
    #: Forged dead letters left alone: requeued only when asked for by kind, forced.
    forged: int = 0
    #: Spiders whose queue got a task back.
    spiders: set[str] = field(default_factory=set)


#: The columns requeueing needs from each row.
_REQUEUE_COLUMNS = tuple(
    tasks_table.c[name]
    for name in (
        "spider", "task_id", "url", "kind", "envelope", "history", "attempts", "finished_at",
        "last_error_type", "last_error_message", "last_error_status",
    )
)  # fmt: skip


def requeue(
    store: Store,
    client: Any,
    filters: Filters,
    *,
    node_id: str,
    events_maxlen: int,
    keep_budget: bool = False,
    limit: int | None = None,
    on_chunk: OnChunk | None = None,
    project: str = "",
    signing: KeyRing | None = None,
    forged: bool = False,
) -> Requeued:
    """Put the matching dead letters (at most *limit*) back in their spiders' queues, due now.

    A fresh budget unless *keep_budget*; the row goes back to ``waiting`` and
    its death is appended to its ``history``, so nothing of it is lost. *project*
    is the namespace of the spiders' keys (Config.namespace); *signing* the key
    ring that signs what goes back (RETRYQUEUE_SIGNING_KEYS). A ``forged`` dead
    letter is left alone (counted) unless *forged*: then the entry it kept is put
    back as the task it claims to be, signed now (a person vouches for it).
    """
    queues = _Queues(
        client, node_id=node_id, events_maxlen=events_maxlen, project=project, signing=signing
    )
    result = Requeued()
    for rows in chunks(store, filters, _REQUEUE_COLUMNS, limit=limit):
        if on_chunk is not None:
            on_chunk(len(rows))
        _requeue_rows(
            store,
            rows,
            queues,
            node_id=node_id,
            keep_budget=keep_budget,
            forged=forged,
            into=result,
        )
    return result


def _requeue_rows(
    store: Store,
    rows: Sequence[Any],
    queue_for: Callable[[str], RedisDelayedQueue],
    *,
    node_id: str,
    keep_budget: bool,
    forged: bool,
    into: Requeued,
) -> None:
    c = tasks_table.c
    now = datetime.now(UTC)
    at_ms = int(now.timestamp() * 1000)  # the same instant as the rows' times
    updates = []
    for row in rows:
        if row.kind == FORGED and not forged:
            into.forged += 1
            continue
        try:
            task = task_from_json(_requeued_text(row))
        except EnvelopeError as exc:
            into.malformed.append(Malformed(row.id, row.url, str(exc)))
            continue
        if not keep_budget:
            task.attempts = {}
        task.dead_kind = None
        if row.kind == FORGED:
            task.spider = row.spider  # the queue it is put back into
        # Later than the dead letter's envelope: a copy of that one stays a replay.
        task.due, task.updated = at_ms, max(at_ms, task.updated + 1)
        task.node = node_id
        if not queue_for(row.spider).schedule(task, now=at_ms):
            into.live += 1
            continue
        into.moved += 1
        into.spiders.add(row.spider)
        history = list(row.history or [])
        history.append(
            {
                "status": "dead",
                "kind": row.kind,
                "attempts": row.attempts,
                "finished_at": row.finished_at.isoformat() if row.finished_at else None,
                "last_error_type": row.last_error_type,
                "last_error_message": row.last_error_message,
                "last_error_status": row.last_error_status,
                "requeued_at": now.isoformat(),
                "kept_budget": keep_budget,
            }
        )
        updates.append({"row_id": row.id, "history": history})
    if updates:
        stmt = (
            update(tasks_table)
            .where(c.id == bindparam("row_id"), c.status == "dead")
            .values(
                status="waiting",
                next_retry_at=now,
                finished_at=None,
                updated_at=now,
                requeued_at=now,
                requeues=c.requeues + 1,
                history=bindparam("history"),
            )
        )
        with store.begin() as conn:
            conn.execute(stmt, updates)


def _requeued_text(row: Any) -> str:
    """The envelope a dead letter's row puts back: its own, or for a forged one the entry
    it kept (``raw``; one kept as ``raw_base64`` is no UTF-8 text, so no envelope)."""
    envelope = row.envelope if isinstance(row.envelope, dict) else {}
    if row.kind == FORGED:
        raw = envelope.get("raw")
        if not isinstance(raw, str):
            raise EnvelopeError("the forged entry it kept is not text")
        return raw
    return json.dumps(envelope)


# -- purge -------------------------------------------------------------------------


def purge(store: Store, filters: Filters) -> int:
    """Delete the matching rows from the store; returns how many."""
    with store.begin() as conn:
        return int(conn.execute(delete(tasks_table).where(filters.where())).rowcount or 0)


# -- retry now, cancel ---------------------------------------------------------------


@dataclass(slots=True)
class Changed:
    changed: int = 0
    #: Matching tasks the queue no longer held as the action expects.
    skipped: int = 0
    #: Spiders whose queue changed.
    spiders: set[str] = field(default_factory=set)


def retry_now(
    store: Store,
    client: Any,
    filters: Filters,
    *,
    node_id: str,
    events_maxlen: int,
    project: str = "",
    signing: KeyRing | None = None,
) -> Changed:
    """Make the matching waiting tasks due now."""
    return _queue_op(store, client, filters, "retry_now", node_id, events_maxlen, project, signing)


def cancel(
    store: Store,
    client: Any,
    filters: Filters,
    *,
    node_id: str,
    events_maxlen: int,
    project: str = "",
    signing: KeyRing | None = None,
) -> Changed:
    """Remove the matching live tasks (waiting or leased) from the queue for good."""
    return _queue_op(store, client, filters, "cancel", node_id, events_maxlen, project, signing)


def _queue_op(
    store: Store,
    client: Any,
    filters: Filters,
    op: str,
    node_id: str,
    events_maxlen: int,
    project: str,
    signing: KeyRing | None = None,
) -> Changed:
    c = tasks_table.c
    queues = _Queues(
        client, node_id=node_id, events_maxlen=events_maxlen, project=project, signing=signing
    )
    result = Changed()
    for rows in chunks(store, filters, (c.spider, c.task_id)):
        by_spider: dict[str, list[str]] = {}
        for row in rows:
            by_spider.setdefault(row.spider, []).append(row.task_id)
        now = now_ms()
        for spider, ids in by_spider.items():
            queue = queues(spider)
            done = (
                queue.retry_now(ids, now=now) if op == "retry_now" else queue.cancel(ids, now=now)
            )
            result.changed += sum(done)
            result.skipped += len(done) - sum(done)
            result.spiders.add(spider)
    return result
