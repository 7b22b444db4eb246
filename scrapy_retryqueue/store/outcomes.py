"""What recovered and how fast, read from the store: times to recover, their histogram, outcomes.

The dashboard's "By kind" table and its /metrics; no Scrapy here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from .models import tasks_table


def recover_seconds(dialect: str) -> ColumnElement[Any]:
    """SQL for a recovered task's time to recover: first failure to success, in seconds."""
    c = tasks_table.c
    if dialect == "sqlite":
        # julianday() is a float of days: round to the millisecond the times are kept in,
        # so 5 s is 5.0 and not 5.0000000001 (the histogram's bounds are inclusive).
        days = func.julianday(c.finished_at) - func.julianday(c.created_at)
        return func.round(days * 86400.0, 3)
    return func.extract("epoch", c.finished_at - c.created_at)


def _recovered(spiders: Sequence[str] | None) -> ColumnElement[bool]:
    # Tasks requeued by hand are left out: their wait includes their time as dead letters.
    c = tasks_table.c
    clauses: list[Any] = [c.status == "succeeded", c.finished_at.is_not(None), c.requeues == 0]
    if spiders:
        clauses.append(c.spider.in_(list(spiders)))
    return and_(*clauses)


def recovery_times(
    conn: Connection, spiders: Sequence[str] | None, *, limit: int
) -> dict[str, list[float]]:
    """By kind, the times to recover (seconds, ascending) of the newest *limit*
    recovered tasks (of *spiders*, or all)."""
    c = tasks_table.c
    seconds = recover_seconds(conn.dialect.name).label("seconds")
    rows = conn.execute(
        select(c.kind, seconds)
        .where(_recovered(spiders))
        .order_by(c.finished_at.desc())
        .limit(limit)
    )
    out: dict[str, list[float]] = {}
    for kind, value in rows:
        if value is not None:
            out.setdefault(kind or "?", []).append(max(0.0, float(value)))
    for values in out.values():
        values.sort()
    return out


@dataclass(slots=True)
class Histogram:
    """Cumulative counts of values ≤ each bound, their number and their sum."""

    buckets: list[int]
    count: int
    total: float


def recovery_histogram(
    conn: Connection, bounds: Sequence[float]
) -> dict[tuple[str, str], Histogram]:
    """By (spider, kind): the recovered tasks' times to recover as a histogram over
    *bounds* (seconds), counted in the database (every such task, in one query)."""
    c = tasks_table.c
    seconds = recover_seconds(conn.dialect.name)
    columns = [func.sum(case((seconds <= bound, 1), else_=0)) for bound in bounds]
    rows = conn.execute(
        select(c.spider, c.kind, func.count(), func.sum(seconds), *columns)
        .where(_recovered(None))
        .group_by(c.spider, c.kind)
    )
    return {
        (spider, kind or ""): Histogram(
            [int(n or 0) for n in counts], int(number), max(0.0, float(total or 0))
        )
        for spider, kind, number, total, *counts in rows
    }


@dataclass(slots=True)
class Outcomes:
    """Since the store began (less what was purged), by (spider, kind): tasks that entered
    the queue (by the kind of their first failure; a requeue counts again), recovered
    and dead-lettered (by the kind they ended with; a requeued dead letter still counts),
    and the current rows by (spider, kind, status)."""

    scheduled: dict[tuple[str, str], int] = field(default_factory=dict)
    recovered: dict[tuple[str, str], int] = field(default_factory=dict)
    dead_lettered: dict[tuple[str, str], int] = field(default_factory=dict)
    by_status: dict[tuple[str, str, str], int] = field(default_factory=dict)


def outcomes(conn: Connection) -> Outcomes:
    """The store's outcome counts, in one pass over the table."""
    c = tasks_table.c
    out = Outcomes()
    first_kind = func.coalesce(c.first_error_kind, c.kind, "")
    for spider, kind, first, status, n, requeues in conn.execute(
        select(
            c.spider,
            c.kind,
            first_kind,
            c.status,
            func.count(),
            func.coalesce(func.sum(c.requeues), 0),
        ).group_by(c.spider, c.kind, first_kind, c.status)
    ):
        n, requeues, kind = int(n), int(requeues), kind or ""
        key = (spider, kind)
        by_status = (spider, kind, status)
        out.by_status[by_status] = out.by_status.get(by_status, 0) + n
        entered = (spider, first or "")
        out.scheduled[entered] = out.scheduled.get(entered, 0) + n + requeues
        if status == "succeeded":
            out.recovered[key] = out.recovered.get(key, 0) + n
        dead = (n if status == "dead" else 0) + requeues
        if dead:
            out.dead_lettered[key] = out.dead_lettered.get(key, 0) + dead
    return out
