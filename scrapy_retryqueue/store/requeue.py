"""Requeue dead letters: back in the Redis queue, due now, history kept.

Shared by ``scrapy deadletters requeue`` and the dashboard, which differ only
in how they pick the rows and report the outcome.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, update

from ..envelope import task_from_json
from ..exceptions import EnvelopeError
from ..queue import RedisDelayedQueue
from .db import Store


def requeue_columns(table: Any) -> tuple[Any, ...]:
    """The columns :func:`requeue_rows` needs from each row."""
    c = table.c
    return (c.id, c.spider, c.task_id, c.url, c.kind, c.envelope, c.history, c.attempts,
            c.finished_at, c.last_error_type, c.last_error_message, c.last_error_status)  # fmt: skip


@dataclass
class Requeued:
    moved: int = 0
    #: Rows whose request has a live retry in the queue already (left as they are).
    live: int = 0
    #: (row, why) of rows whose envelope cannot be read back.
    malformed: list[tuple[Any, EnvelopeError]] = field(default_factory=list)
    spiders: set[str] = field(default_factory=set)


def requeue_rows(
    store: Store,
    rows: Sequence[Any],
    *,
    queue_for: Callable[[str], RedisDelayedQueue],
    node_id: str,
    keep_budget: bool,
) -> Requeued:
    """Put *rows* (dead letters) back in their spiders' queues, due now.

    A fresh budget unless *keep_budget*; the row goes back to ``waiting`` and
    its death is appended to its ``history``, so nothing of it is lost.
    """
    table = store.table
    c = table.c
    now = datetime.now(UTC)
    now_ms = int(now.timestamp() * 1000)
    result = Requeued()
    updates = []
    for row in rows:
        try:
            task = task_from_json(json.dumps(row.envelope or {}))
        except EnvelopeError as exc:
            result.malformed.append((row, exc))
            continue
        if not keep_budget:
            task.attempts = {}
        task.dead_kind = None
        task.due = task.updated = now_ms
        task.node = node_id
        if not queue_for(row.spider).schedule(task, now=now_ms):
            result.live += 1
            continue
        result.moved += 1
        result.spiders.add(row.spider)
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
            update(table)
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
    return result
