"""Reading the store for people: filters, counts, matching rows, export rows, status and recovery figures.

Used by ``scrapy deadletters``, ``scrapy retryqueue status`` and the dashboard;
no Scrapy here. The changes people make are :mod:`.actions`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Text, and_, case, cast, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from ..decision.kinds import BUILTIN_TABLE
from ..exceptions import RetryQueueError
from ..settings.defaults import FINAL_TASK_STATUSES, TASK_STATUSES
from .models import tasks_table

if TYPE_CHECKING:
    from .db import Store

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

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*(?:ago)?\s*$", re.IGNORECASE | re.ASCII)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


#: Longest row id (decimal digits) taken as a number: 18 digits always fit a BIGINT.
_ROW_ID_DIGITS = 18
#: Longest task id the store holds (its task_id column).
TASK_ID_LENGTH = tasks_table.c.task_id.type.length or 128


class FilterError(RetryQueueError, ValueError):
    """A filter value that cannot be used; the message names the option and value."""


def shown(value: str, limit: int = 80) -> str:
    """*value* as an error message quotes it: repr, cut after *limit* characters."""
    return (
        repr(value) if len(value) <= limit else repr(value[:limit]) + f"… ({len(value)} characters)"
    )


def check_text(option: str, value: str) -> str:
    """*value* if a database can compare it: no NUL (PostgreSQL text cannot hold one)
    and no lone surrogate (not encodable as UTF-8); FilterError otherwise."""
    if "\x00" in value:
        raise FilterError(f"{option} {shown(value)} holds a NUL character, which no value can")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FilterError(f"{option} {shown(value)} is not valid Unicode text") from None
    return value


def is_number(text: str, digits: int) -> bool:
    """*text* is ASCII decimal digits, at most *digits* of them.

    ``str.isdigit()`` alone accepts "²" and other digits ``int()`` refuses, and
    Python refuses to convert very long digit strings.
    """
    return 0 < len(text) <= digits and text.isascii() and text.isdigit()


def check_id(option: str, value: str) -> str:
    """*value* if it can be a row id (digits 0-9) or a task id (text of at most
    TASK_ID_LENGTH characters); FilterError otherwise."""
    check_text(option, value)
    if value.isdigit() and not value.isascii():  # "²": a digit to isdigit(), not to int()
        raise FilterError(f"{option} {shown(value)} is not a row id: use the digits 0-9")
    if len(value) > TASK_ID_LENGTH:
        raise FilterError(
            f"{option} {shown(value)} is not a row id or a task id "
            f"(task ids have at most {TASK_ID_LENGTH} characters)"
        )
    return value


def row_id(text: str) -> int | None:
    """The row id *text* spells (decimal digits that fit a BIGINT), else None."""
    return int(text) if is_number(text, _ROW_ID_DIGITS) else None


def parse_time(option: str, value: str, *, now: datetime | None = None) -> datetime:
    """An aware datetime from ISO 8601 (naive = local time), ``today``, or ``7d`` (ago).

    A time outside the years 1-9999 (``99999999999d``, ``9999-12-31T23:59-05:00``)
    is a FilterError, as any other value that is not a time.
    """
    try:
        return _parse_time(option, value, now or datetime.now(UTC))
    except (OverflowError, OSError, ValueError) as exc:
        if isinstance(exc, FilterError):
            raise
        raise FilterError(
            f"{option} {shown(value)} is out of range: times must fall in the years 1-9999 (UTC)"
        ) from None


def _parse_time(option: str, value: str, now: datetime) -> datetime:
    check_text(option, value)
    text = value.strip()
    relative = _RELATIVE.match(text)
    if relative:
        amount, unit = float(relative.group(1)), relative.group(2).lower()
        return now - timedelta(**{_UNITS[unit]: amount})
    if text.lower() in ("today", "yesterday"):
        local_midnight = (
            datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        )
        return local_midnight - timedelta(days=1 if text.lower() == "yesterday" else 0)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise FilterError(
            f"{option} {shown(value)} is not a date or time; use e.g. 2024-05-01, "
            "2024-05-01T13:30, 2024-05-01T13:30+02:00, today, or 7d / 12h / 30m (ago)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()  # local time
    return parsed.astimezone(UTC)


@dataclass(slots=True)
class Filters:
    spiders: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    http_statuses: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    since: datetime | None = None
    until: datetime | None = None
    statuses: list[str] = field(default_factory=lambda: ["dead"])
    #: Row ids (numbers) or task ids (fingerprints).
    ids: list[str] = field(default_factory=list)
    #: A substring of the URL (the dashboard's search box); empty: any URL.
    url_contains: str = ""

    @classmethod
    def from_options(
        cls,
        *,
        spiders: Sequence[str] = (),
        kinds: Sequence[str] = (),
        domains: Sequence[str] = (),
        http_statuses: Sequence[str] = (),
        nodes: Sequence[str] = (),
        since: str | None = None,
        until: str | None = None,
        statuses: Sequence[str] = ("dead",),
        ids: Sequence[str] = (),
        known_kinds: Collection[str] = BUILTIN_TABLE.names,
    ) -> Filters:
        """Validate command-line values; FilterError names the bad one.

        *known_kinds* are the kinds --kind accepts: the built-in ones and the
        project's own (RETRYQUEUE_KINDS, ``config.kinds_setting(settings).names``).
        """

        def split(option: str, values: Sequence[str]) -> list[str]:
            return [
                check_text(option, v.strip())
                for value in values
                for v in value.split(",")
                if v.strip()
            ]

        kinds_ = split("--kind", kinds)
        for kind in kinds_:
            if kind not in known_kinds:
                raise FilterError(
                    f"--kind {shown(kind)} is not a kind; known: {', '.join(known_kinds)}"
                )
        statuses_ = split("--status", statuses)
        if statuses_ == ["all"]:
            statuses_ = list(TASK_STATUSES)
        for status in statuses_:
            if status not in TASK_STATUSES:
                raise FilterError(
                    f"--status {shown(status)} is not a status; "
                    f"known: {', '.join(TASK_STATUSES)}, all"
                )
        http: list[int] = []
        for code in split("--http-status", http_statuses):
            if not is_number(code, 3) or not 100 <= int(code) <= 599:
                raise FilterError(f"--http-status {shown(code)} is not an HTTP status (100-599)")
            http.append(int(code))
        domains_ = [d.lower().lstrip(".") for d in split("--domain", domains)]
        for domain in domains_:
            if "/" in domain or ":" in domain:
                raise FilterError(f"--domain {shown(domain)} must be a host name like example.com")
        since_ = parse_time("--since", since) if since else None
        until_ = parse_time("--until", until) if until else None
        if since_ and until_ and since_ >= until_:
            raise FilterError(
                f"--since {shown(since or '')} is not before --until {shown(until or '')}"
            )
        return cls(
            spiders=split("--spider", spiders),
            kinds=kinds_,
            domains=domains_,
            http_statuses=http,
            nodes=split("--node", nodes),
            since=since_,
            until=until_,
            statuses=statuses_ or ["dead"],
            ids=[check_id("--id", i) for i in split("--id", ids)],
        )

    @property
    def time_column(self) -> Any:
        c = tasks_table.c
        return c.finished_at if set(self.statuses) <= set(FINAL_TASK_STATUSES) else c.updated_at

    def where(self) -> ColumnElement[bool]:
        c = tasks_table.c
        clauses: list[Any] = [c.status.in_(self.statuses)]
        if self.spiders:
            clauses.append(c.spider.in_(self.spiders))
        if self.kinds:
            clauses.append(c.kind.in_(self.kinds))
        if self.domains:
            clauses.append(
                or_(*(or_(c.domain == d, c.domain.like(f"%.{d}")) for d in self.domains))
            )
        if self.http_statuses:
            clauses.append(c.last_error_status.in_(self.http_statuses))
        if self.nodes:
            clauses.append(c.node.in_(self.nodes))
        if self.since is not None:
            clauses.append(self.time_column >= self.since)
        if self.until is not None:
            clauses.append(self.time_column < self.until)
        if self.ids:
            numbers = [n for n in map(row_id, self.ids) if n is not None]
            clauses.append(or_(c.task_id.in_(self.ids), c.id.in_(numbers)))
        if self.url_contains:
            clauses.append(c.url.contains(self.url_contains, autoescape=True))
        return and_(*clauses)

    def describe(self) -> str:
        parts = [f"status={','.join(self.statuses)}"]
        for name, values in (
            ("spider", self.spiders),
            ("kind", self.kinds),
            ("domain", self.domains),
            ("http-status", [str(s) for s in self.http_statuses]),
            ("node", self.nodes),
            ("id", self.ids),
        ):
            if values:
                parts.append(f"{name}={','.join(values)}")
        if self.since:
            parts.append(f"since={self.since.isoformat(timespec='seconds')}")
        if self.until:
            parts.append(f"until={self.until.isoformat(timespec='seconds')}")
        if self.url_contains:
            parts.append(f"url~{self.url_contains}")
        return " ".join(parts)


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


# -- what recovered, and how fast (the dashboard's "By kind" table and /metrics) ------


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
