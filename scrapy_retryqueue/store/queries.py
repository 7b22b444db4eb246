"""Reading the store for people: counts, matching rows in pages, export rows, each spider's status.

Used by ``scrapy deadletters``, ``scrapy retryqueue status`` and the dashboard;
no Scrapy here. Which rows (:class:`Filters`) is :mod:`.filters`; what recovered
and how fast is :mod:`.outcomes`; both are re-exported here for the modules that
import them from here. The changes people make are :mod:`.actions`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Text, and_, cast, func, select
from sqlalchemy.engine import Connection

from .filters import (
    TASK_ID_LENGTH,
    FilterError,
    Filters,
    check_id,
    check_text,
    is_number,
    parse_time,
    row_id,
    shown,
)
from .models import tasks_table
from .outcomes import (
    Histogram,
    Outcomes,
    outcomes,
    recover_seconds,
    recovery_histogram,
    recovery_times,
)

if TYPE_CHECKING:
    from .db import Store

__all__ = [
    "CHUNK",
    "EXPORT_COLUMNS",
    "JSON_COLUMNS",
    "TASK_ID_LENGTH",
    "TIME_COLUMNS",
    "FilterError",
    "Filters",
    "Histogram",
    "Outcomes",
    "check_id",
    "check_text",
    "chunks",
    "count",
    "is_number",
    "outcomes",
    "parse_time",
    "recover_seconds",
    "recovery_histogram",
    "recovery_times",
    "row_id",
    "shown",
    "status_counts",
    "stream_rows",
]

#: Rows read per query when going through many (keyset pages, not offsets).
CHUNK = 500

#: Columns of an export, in order.
EXPORT_COLUMNS = (
    "id",
    "spider",
    "task_id",
    "status",
    "kind",
    "url",
    "domain",
    "method",
    "attempts_total",
    "attempts",
    "max_retries",
    "reclaims",
    "last_error_kind",
    "last_error_type",
    "last_error_status",
    "last_error_message",
    "first_error_kind",
    "first_error_type",
    "first_error_status",
    "first_error_message",
    "node",
    "created_at",
    "updated_at",
    "finished_at",
    "next_retry_at",
    "requeues",
    "requeued_at",
    "history",
    "envelope",
)


def count(conn: Connection, filters: Filters) -> int:
    return int(
        conn.execute(
            select(func.count()).select_from(tasks_table).where(filters.where())
        ).scalar_one()
    )


def chunks(
    store: Store, filters: Filters, columns: Iterable[Any], *, limit: int | None = None
) -> Iterator[list[Any]]:
    """Matching rows (``id`` and *columns*) in id order, CHUNK at a time, at most
    *limit*. Each chunk is read on a connection of its own, so the caller may
    change the rows between chunks (the next one starts after the last id seen)."""
    c = tasks_table.c
    wanted = [c.id, *(col for col in columns if col is not c.id)]
    seen = last = 0
    while limit is None or seen < limit:
        size = CHUNK if limit is None else min(CHUNK, limit - seen)
        with store.connect() as conn:
            rows = conn.execute(
                select(*wanted).where(filters.where(), c.id > last).order_by(c.id).limit(size)
            ).all()
        if not rows:
            return
        last = rows[-1].id
        seen += len(rows)
        yield rows


#: Export columns whose values are JSON documents (streamed as their JSON text).
JSON_COLUMNS = frozenset({"attempts", "history", "envelope"})
TIME_COLUMNS = frozenset(
    {"created_at", "updated_at", "finished_at", "next_retry_at", "requeued_at"}
)


def stream_rows(
    conn: Connection, filters: Filters, *, limit: int | None = None, chunk: int = 2000
) -> Iterator[tuple[Any, ...]]:
    """Matching rows as tuples in EXPORT_COLUMNS order, oldest id first, in constant
    memory: a server-side cursor on PostgreSQL, a lazily read cursor on SQLite.

    JSON columns come as their JSON text (None for SQL NULL), not decoded.
    """
    c = tasks_table.c
    columns = [
        cast(c[name], Text).label(name) if name in JSON_COLUMNS else c[name]
        for name in EXPORT_COLUMNS
    ]
    stmt = select(*columns).where(filters.where()).order_by(c.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    result = conn.execution_options(stream_results=True, yield_per=chunk).execute(stmt)
    for row in result:
        yield tuple(row)


def status_counts(
    conn: Connection, spiders: Sequence[str] | None, *, since_today: datetime, top: int = 5
) -> dict[str, dict[str, Any]]:
    """Per spider: counts by status, succeeded today, by kind and top domains."""
    c = tasks_table.c
    spider_filter = c.spider.in_(list(spiders)) if spiders else True
    out: dict[str, dict[str, Any]] = {}

    def entry(spider: str) -> dict[str, Any]:
        return out.setdefault(
            spider,
            {"statuses": {}, "succeeded_today": 0, "by_kind": {}, "top_domains": []},
        )

    for spider, status, n in conn.execute(
        select(c.spider, c.status, func.count()).where(spider_filter).group_by(c.spider, c.status)
    ):
        entry(spider)["statuses"][status] = int(n)
    for spider, n in conn.execute(
        select(c.spider, func.count())
        .where(and_(spider_filter, c.status == "succeeded", c.finished_at >= since_today))
        .group_by(c.spider)
    ):
        entry(spider)["succeeded_today"] = int(n)
    open_statuses = ("waiting", "retrying", "dead")
    for spider, kind, status, n in conn.execute(
        select(c.spider, c.kind, c.status, func.count())
        .where(and_(spider_filter, c.status.in_(open_statuses)))
        .group_by(c.spider, c.kind, c.status)
    ):
        group = "dead" if status == "dead" else "pending"
        by_kind = entry(spider)["by_kind"].setdefault(kind or "?", {"pending": 0, "dead": 0})
        by_kind[group] += int(n)
    domains: dict[str, dict[str, dict[str, int]]] = {}
    for spider, domain, status, n in conn.execute(
        select(c.spider, c.domain, c.status, func.count())
        .where(and_(spider_filter, c.status.in_(open_statuses)))
        .group_by(c.spider, c.domain, c.status)
    ):
        group = "dead" if status == "dead" else "pending"
        per = domains.setdefault(spider, {}).setdefault(domain or "?", {"pending": 0, "dead": 0})
        per[group] += int(n)
    for spider, per_domain in domains.items():
        ranked = sorted(
            per_domain.items(), key=lambda kv: (-(kv[1]["pending"] + kv[1]["dead"]), kv[0])
        )
        entry(spider)["top_domains"] = [{"domain": d, **n} for d, n in ranked[:top]]
    return out
