"""Which rows of the store people ask for: the filters' values checked, and their SQL clause.

``scrapy deadletters`` builds a :class:`Filters` from its options, the dashboard
from its query string; a value that cannot be used is a :class:`FilterError`
naming the option and showing the value, raised before the store is opened.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_
from sqlalchemy.sql.elements import ColumnElement

from ..decision.kinds import BUILTIN_TABLE
from ..exceptions import RetryQueueError
from ..settings.defaults import FINAL_TASK_STATUSES, TASK_STATUSES
from .models import tasks_table

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
