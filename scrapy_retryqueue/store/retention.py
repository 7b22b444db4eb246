"""Retention: deletes the store's dead letters and finished tasks older than so many days.

The writer service (store/service.py) runs it for each spider it serves, every
STORE_RETENTION_INTERVAL, when RETRYQUEUE_DEAD_RETENTION or
RETRYQUEUE_HISTORY_RETENTION is set.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, delete

from .db import Store


def apply_retention(
    store: Store, *, spider: str | None, dead_days: float | None, history_days: float | None
) -> tuple[int, int]:
    """Delete dead letters / finished tasks (of *spider*, or all) older than so many days."""
    table = store.table
    now = datetime.now(UTC)
    counts = []
    for days, statuses in ((dead_days, ("dead",)), (history_days, ("succeeded", "cancelled"))):
        if days is None:
            counts.append(0)
            continue
        cutoff = now - timedelta(days=days)
        where = and_(table.c.status.in_(statuses), table.c.finished_at < cutoff)
        if spider is not None:
            where = and_(where, table.c.spider == spider)
        with store.begin() as conn:
            counts.append(int(conn.execute(delete(table).where(where)).rowcount or 0))
    return counts[0], counts[1]
