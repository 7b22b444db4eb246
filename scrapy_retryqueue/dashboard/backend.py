"""What the dashboard reads and changes: the live queue in Redis, history in the store.

No web framework here: plain data in, plain data (JSON-ready dicts) out, so the
HTML pages, the JSON API and the tests share one implementation. Filters are
the store commands' (:class:`~scrapy_retryqueue.store.queries.Filters`), plus a
URL substring; Redis is read through :mod:`scrapy_retryqueue.view.live`, the
actions are :mod:`scrapy_retryqueue.store.actions`.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import and_, func, select

from ..config import Config, kinds_setting, secret_headers_setting
from ..decision.kinds import BUILTIN_TABLE
from ..exceptions import ConfigError, RetryQueueError, SpiderNameError
from ..queue import events
from ..queue.keys import keys_for
from ..secure.redact import mask_envelope, mask_request, mask_url_passwords
from ..store import actions
from ..store.db import Store, StoreError
from ..store.models import tasks_table
from ..store.queries import (
    FilterError,
    Filters,
    check_id,
    check_text,
    count,
    recovery_times,
    row_id,
    shown,
)
from ..store.service import event_sync
from ..view import live as view
from ..view.sources import Sources
from ..view.status import (
    EMBEDDED_DOWN,
    budget_malformed_line,
    collect,
    learned_recovery,
    learned_strategy,
    local_midnight,
    retry_budget_state,
)
from .settings import MAX_PAGE_SIZE

ACTIONS = actions.ACTIONS

#: Columns of the tasks table, and the ones it can be sorted by.
LIST_COLUMNS = (
    "id",
    "spider",
    "task_id",
    "status",
    "kind",
    "url",
    "domain",
    "method",
    "attempts_total",
    "max_retries",
    "last_error_kind",
    "last_error_type",
    "last_error_status",
    "last_error_message",
    "node",
    "created_at",
    "updated_at",
    "finished_at",
    "next_retry_at",
    "requeues",
)
SORTABLE = (
    "id",
    "updated_at",
    "created_at",
    "finished_at",
    "next_retry_at",
    "status",
    "kind",
    "spider",
    "domain",
    "url",
    "attempts_total",
    "last_error_status",
    "node",
)
#: Filter names of the query string / JSON API (the export command's, plus q).
FILTER_NAMES = ("spider", "status", "kind", "domain", "http_status", "node", "since", "until", "id")
#: How far back the chart looks (seconds), and how many buckets it has at most.
WINDOWS = {"hour": (3600, 60), "day": (86400, 144)}
#: Bucket sizes (seconds) the chart picks from: the smallest that fits the span of
#: the activity in the window in its buckets, so a burst of one minute is not one spike.
CHART_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
#: The chart shows at least this span (seconds), even if the activity is shorter.
CHART_MIN_SPAN = 60
#: Events read from one spider's stream for the chart, at most.
CHART_MAX_EVENTS = 200_000
#: Recovered tasks (the newest) whose time to recover the "By kind" figures use, at most.
RECOVERY_SAMPLE = 20_000
#: Values all the filters of one request may hold together, at most: each is a
#: parameter of the SQL query, and SQLite takes about 32,000.
MAX_FILTER_VALUES = 10_000
#: Spiders the overview may be asked for at once.
MAX_OVERVIEW_SPIDERS = 200
#: Newest events scanned for one task's timeline, at most.
TIMELINE_SCAN = 20_000


class DashboardError(RetryQueueError):
    """Something a person can fix (bad filter, store or Redis down); status for HTTP."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _checked_spiders(spiders: Sequence[str]) -> list[str]:
    """*spiders* as a filter names them, each checked: at most MAX_OVERVIEW_SPIDERS, and
    a name no queue can have is said (a 400), not a server error."""
    if len(spiders) > MAX_OVERVIEW_SPIDERS:
        raise DashboardError(
            f"spider names {len(spiders)} spiders; at most {MAX_OVERVIEW_SPIDERS} at once"
        )
    try:
        checked = [check_text("spider", name.strip()) for name in spiders]
        for name in checked:
            keys_for(name)
    except (FilterError, SpiderNameError) as exc:
        raise DashboardError(str(exc)) from None
    return checked


def _ms_iso(ms: int | None) -> str | None:
    """An ISO time from ms since the epoch; None for None or a time no date can hold."""
    if ms is None:
        return None
    try:
        return _iso(datetime.fromtimestamp(ms / 1000, UTC))
    except (OverflowError, OSError, ValueError):
        return None


def _plain_filter_message(message: str) -> str:
    # The store's messages name command-line options (--http-status); here they are fields.
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), message)


def parse_filters(
    params: Mapping[str, Sequence[str] | str | None],
    *,
    default_status: str = "all",
    known_kinds: Sequence[str] = BUILTIN_TABLE.names,
) -> Filters:
    """Filters (with the URL substring, ``q``) from query-string or JSON values;
    *known_kinds* are the kinds the kind filter accepts (:attr:`Backend.known_kinds`)."""

    def values(name: str) -> list[str]:
        raw = params.get(name)
        if raw is None:
            return []
        if isinstance(raw, (str, int)):
            raw = [str(raw)]
        return [str(v) for v in raw if str(v).strip()]

    given = sum(len(v.split(",")) for name in (*FILTER_NAMES, "q") for v in values(name))
    if given > MAX_FILTER_VALUES:
        raise DashboardError(
            f"the filters hold {given} values; at most {MAX_FILTER_VALUES} in one request"
        )

    def one(name: str) -> str | None:
        got = values(name)
        return got[-1] if got else None

    try:
        filters = Filters.from_options(
            spiders=values("spider"),
            kinds=values("kind"),
            domains=values("domain"),
            http_statuses=values("http_status"),
            nodes=values("node"),
            since=one("since"),
            until=one("until"),
            statuses=values("status") or [default_status],
            ids=values("id"),
            known_kinds=known_kinds,
        )
    except FilterError as exc:
        raise DashboardError(_plain_filter_message(str(exc))) from None
    q = (one("q") or "").strip()
    if len(q) > 2000:
        raise DashboardError(f"q is {len(q)} characters long; at most 2000")
    try:
        filters.url_contains = check_text("q", q)
    except FilterError as exc:
        raise DashboardError(str(exc)) from None
    return filters


#: Columns that may quote a URL, and so its password (masked as the envelope's).
_URL_COLUMNS = frozenset({"url", "first_error_message", "last_error_message"})


def _row(row: Any) -> dict[str, Any]:
    out = {}
    for name, value in row._mapping.items():
        if isinstance(value, datetime):
            value = _iso(value)
        elif name in _URL_COLUMNS:
            value = mask_url_passwords(value)
        out[name] = value
    return out


class Backend:
    """Opens the store and Redis on first use (never at construction) and keeps them."""

    def __init__(self, settings: Any, *, secret_headers: frozenset[str] | None = None) -> None:
        self.settings = settings
        #: Header names whose values no answer shows (RETRYQUEUE_SECRET_HEADERS).
        self.secret_headers = (
            secret_headers
            if secret_headers is not None
            else secret_headers_setting(settings if settings is not None else {})
        )
        #: The built-in kinds and RETRYQUEUE_KINDS': what a filter may name, and
        #: which kinds are retried (the success rate counts only those).
        self.kind_table = kinds_setting(settings if settings is not None else {})
        self.known_kinds: tuple[str, ...] = self.kind_table.names
        self._sources: Sources | None = None
        self._lock = threading.Lock()

    # -- connections -------------------------------------------------------------

    def sources(self) -> Sources:
        with self._lock:
            if self._sources is None:
                try:
                    self._sources = Sources(self.settings)
                except ConfigError as exc:
                    raise DashboardError(str(exc), 500) from None
            return self._sources

    def store(self) -> Store:
        sources = self.sources()
        try:
            return sources.store()
        except RetryQueueError as exc:  # SourceError, StoreError: no store to read
            raise DashboardError(str(exc), 503) from None

    @property
    def project(self) -> str:
        """The namespace of the spiders' keys (RETRYQUEUE_NAMESPACE, else BOT_NAME)."""
        return self.sources().config.namespace

    def redis(self) -> Any:
        """A Redis client, or None when the embedded server is not running."""
        sources = self.sources()
        try:
            return sources.redis(start_embedded=False)
        except RetryQueueError as exc:  # SourceError: Redis does not answer
            raise DashboardError(str(exc), 503) from None

    def close(self) -> None:
        if self._sources is not None:
            self._sources.close()
            self._sources = None

    # -- overview --------------------------------------------------------------

    def overview(self, window: str = "hour", spiders: Sequence[str] = ()) -> dict[str, Any]:
        """Totals, breakdowns and the chart, of every spider or of *spiders*."""
        if window not in WINDOWS:
            raise DashboardError(f"window must be one of {', '.join(WINDOWS)}, got {shown(window)}")
        spiders = _checked_spiders(spiders)
        status = collect(self.redis, self.store, spiders, top=10, project=self.project)
        client, db, notes = status.client, status.history, status.notes
        failures_today = None
        recovered_by_kind: dict[str, int] = {}
        recovery: dict[str, list[float]] = {}
        if db is not None:
            try:
                failures_today, recovered_by_kind, recovery = self._history(spiders)
            except RetryQueueError as exc:
                notes.append(str(exc))
        per_spider: dict[str, Any] = {}
        by_kind: dict[str, dict[str, Any]] = {}
        domains: dict[str, dict[str, int]] = {}
        nodes: Counter[str] = Counter()
        cooling: list[dict[str, Any]] = []
        totals = Counter[str]()
        for spider in status.spiders:
            live = status.live.get(spider)
            history = (db or {}).get(spider, {})
            statuses = history.get("statuses", {})
            entry = {
                "due": live.due if live else None,
                "due_now": live.due_now if live else None,
                "leased": live.leased if live else None,
                "dead": statuses.get("dead", 0) + (live.dead_in_redis if live else 0),
                "succeeded": statuses.get("succeeded", 0),
                "succeeded_today": history.get("succeeded_today", 0),
                "cancelled": statuses.get("cancelled", 0),
                "events_unwritten": live.events_unwritten if live else None,
            }
            per_spider[spider] = entry
            for c in live.cooling if live else []:
                cooling.append({"spider": spider, **c})
            for name in ("due", "due_now", "leased", "dead", "succeeded", "cancelled"):
                totals[name] += entry[name] or 0
            for kind, n in history.get("by_kind", {}).items():
                slot = by_kind.setdefault(kind, {"pending": 0, "dead": 0})
                slot["pending"] += n["pending"]
                slot["dead"] += n["dead"]
            for d in history.get("top_domains", []):
                slot = domains.setdefault(d["domain"], {"pending": 0, "dead": 0})
                slot["pending"] += d["pending"]
                slot["dead"] += d["dead"]
            if client is not None:
                nodes.update(view.lease_holders(client, spider, self.project))
        for kind, n in recovered_by_kind.items():
            by_kind.setdefault(kind, {"pending": 0, "dead": 0})["recovered"] = n
        for kind, slot in by_kind.items():
            slot.setdefault("recovered", 0)
            finished = slot["recovered"] + slot["dead"]
            slot["recovery_rate"] = slot["recovered"] / finished if finished else None
            times = recovery.get(kind, [])
            slot["recover_median_s"] = percentile(times, 0.5)
            slot["recover_p90_s"] = percentile(times, 0.9)
        recovered, dead = totals["succeeded"], totals["dead"]
        # Over the retried kinds only: a 404 that was never retried is neither a
        # recovery nor a failure to recover.
        given_up = sum(
            slot["dead"]
            for kind, slot in by_kind.items()
            if (record := self.kind_table.get(kind)) is not None and record.retry
        )
        rate = recovered / (recovered + given_up) if recovered + given_up else None
        top_domains = sorted(domains.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:10]
        order = {"pending": 0, "dead": 0, "recovered": 0}
        return {
            "generated_at": datetime.fromtimestamp(status.now_ms / 1000, UTC).isoformat(),
            "totals": {
                "pending": totals["due"] if client is not None else None,
                "due_now": totals["due_now"] if client is not None else None,
                "leased": totals["leased"] if client is not None else None,
                "failures_today": failures_today,
                "recovered": recovered,
                "dead": dead,
                "success_rate": rate,
                # Dead letters of the retried kinds: the rate's other half.
                "given_up": given_up,
            },
            "spiders": per_spider,
            "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -sum(kv[1][k] for k in order))),
            "top_domains": [{"domain": d, **n} for d, n in top_domains],
            "nodes": [{"node": n, "leased": c} for n, c in sorted(nodes.items())],
            "cooling": sorted(cooling, key=lambda c: c["until"]),
            "chart": self.chart(client, status.spiders, window, status.now_ms),
            "notes": notes,
        }

    def _history(
        self, spiders: Sequence[str]
    ) -> tuple[int, dict[str, int], dict[str, list[float]]]:
        """Failures first seen today, recovered tasks by kind, and the times to recover
        (seconds, sorted) of the newest RECOVERY_SAMPLE recovered tasks, by kind."""
        c = tasks_table.c
        where = c.created_at >= local_midnight()
        done = c.status == "succeeded"
        if spiders:
            where = and_(where, c.spider.in_(list(spiders)))
            done = and_(done, c.spider.in_(list(spiders)))
        with self.store().connect() as conn:
            recovered_by_kind = {
                kind or "?": int(n)
                for kind, n in conn.execute(
                    select(c.kind, func.count()).where(done).group_by(c.kind)
                )
            }
            failures_today = int(
                conn.execute(
                    select(func.count()).select_from(tasks_table).where(where)
                ).scalar_one()
            )
            times = recovery_times(conn, spiders, limit=RECOVERY_SAMPLE)
        return failures_today, recovered_by_kind, times

    def chart(
        self, client: Any, spiders: Sequence[str], window: str, now_ms: int
    ) -> dict[str, Any]:
        """Scheduled, recovered and dead per bucket, from the events streams.

        The chart looks back over *window*; it spans the activity found there (at
        least CHART_MIN_SPAN) in buckets of the smallest of CHART_STEPS that fits it
        in the window's number of buckets; no activity: the whole window.
        """
        span, most = WINDOWS[window]
        since = now_ms - span * 1000
        names = {events.SCHEDULED: "scheduled", events.SUCCEEDED: "recovered", events.DEAD: "dead"}
        truncated = False
        seen: list[tuple[int, str]] = []
        if client is not None:
            for spider in spiders:
                typed, cut = view.event_types_since(
                    client, spider, since, limit=CHART_MAX_EVENTS, project=self.project
                )
                truncated |= cut
                seen += [(ms, names[t]) for ms, t in typed if t in names and ms >= since]
        shown_s = span
        if seen:
            first = min(ms for ms, _ in seen)
            shown_s = min(span, max(CHART_MIN_SPAN, -(-(now_ms - first) // 1000)))
        step = next((s for s in CHART_STEPS if shown_s / s <= most), span // most)
        step_ms = step * 1000
        start = (now_ms - shown_s * 1000) // step_ms * step_ms
        buckets = (now_ms - start) // step_ms + 1
        series = {name: [0] * buckets for name in ("scheduled", "recovered", "dead")}
        for ms, name in seen:
            index = (ms - start) // step_ms
            if 0 <= index < buckets:
                series[name][index] += 1
        return {
            "window": window,
            "start": start,
            "step_seconds": step,
            "span_seconds": shown_s,
            "series": series,
            "truncated": truncated,
        }

    # -- learned recovery times ---------------------------------------------------

    def recovery(
        self,
        spiders: Sequence[str] = (),
        kinds: Sequence[str] = (),
        domains: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Per spider, the learned recovery curve of each (kind, domain) with its
        figures and LearnedBackoff's next pick (status.learned_recovery), and each
        domain's retry budget now (status.retry_budget_state; ``budget`` is None when
        it is off); *kinds* and *domains* (a domain matches its subdomains too) keep
        only some of them (the budget is per domain: *kinds* leave it whole)."""
        spiders = _checked_spiders(spiders)
        try:
            domains = [check_text("domain", d.strip().lower()) for d in domains if d.strip()]
        except FilterError as exc:
            raise DashboardError(str(exc)) from None
        unknown = [kind for kind in kinds if kind not in self.known_kinds]
        if unknown:
            raise DashboardError(
                f"kind {shown(unknown[0])} is not a kind; known: {', '.join(self.known_kinds)}"
            )
        now = int(datetime.now(UTC).timestamp() * 1000)
        config = self.sources().config
        out: dict[str, Any] = {
            "generated_at": _ms_iso(now),
            # The budget's settings (the project's, as the nodes read them), None: off.
            "budget": (
                {
                    "share": config.retry_budget,
                    "floor": config.retry_budget_floor,
                    "window": config.retry_budget_window,
                }
                if config.retry_budget
                else None
            ),
            "spiders": {},
            "notes": [],
        }
        client = self.redis()
        if client is None:
            out["notes"].append(EMBEDDED_DOWN)
            return out
        try:
            strategy = learned_strategy(config, self.settings)
            names = sorted(set(spiders) if spiders else view.spiders(client, self.project))
        except ConfigError as exc:
            raise DashboardError(str(exc), 500) from None
        except redis.RedisError as exc:
            raise DashboardError(f"Redis does not answer: {exc}", 503) from None

        def in_domains(domain: str | None) -> bool:
            return not domains or (
                domain is not None and any(domain == d or domain.endswith("." + d) for d in domains)
            )

        for spider in names[:MAX_OVERVIEW_SPIDERS]:
            learned = learned_recovery(client, spider, config=config, strategy=strategy, now=now)
            out["notes"].extend(learned.pop("notes"))

            def wanted(kind: str, domain: str | None) -> bool:
                return (not kinds or kind in kinds) and in_domains(domain)

            learned["curves"] = [c for c in learned["curves"] if wanted(c["kind"], c["domain"])]
            learned["kinds"] = [k for k in learned["kinds"] if not kinds or k["kind"] in kinds]
            for curve in learned["curves"]:
                curve["updated_at"] = _ms_iso(curve.pop("updated_ms"))
            learned["budget"] = self._budget(client, spider, config, now, in_domains, out["notes"])
            budget = learned["budget"] or {}
            if (
                learned["records"]
                or learned["unreadable"]
                or budget.get("domains")
                or budget.get("unreadable")
                or spiders
            ):
                out["spiders"][spider] = learned
        return out

    @staticmethod
    def _budget(
        client: Any,
        spider: str,
        config: Config,
        now: int,
        wanted: Callable[[str], bool],
        notes: list[str],
    ) -> dict[str, Any] | None:
        """*spider*'s retry budget per domain (the *wanted* ones), None when it is off;
        records that do not read are counted, and named in one line of *notes*."""
        state = retry_budget_state(client, spider, config=config, now=now)
        if state is None:
            return None
        if state.problem:
            notes.append(state.problem)
        unreadable = state.entry["unreadable"]
        if unreadable:
            notes.append(budget_malformed_line(spider, unreadable))
        return {
            "domains": [d for d in state.entry["domains"] if wanted(d["domain"])],
            "unreadable": len(unreadable),
        }

    # -- tasks -------------------------------------------------------------------

    def tasks(
        self,
        filters: Filters,
        *,
        sort: str = "id",
        order: str = "desc",
        page: int = 1,
        per_page: int = 50,
    ) -> dict[str, Any]:
        if sort not in SORTABLE:
            raise DashboardError(f"sort must be one of {', '.join(SORTABLE)}, got {shown(sort)}")
        if order not in ("asc", "desc"):
            raise DashboardError(f"order must be asc or desc, got {shown(order)}")
        if page < 1 or not 1 <= per_page <= MAX_PAGE_SIZE:
            raise DashboardError(f"page must be >= 1 and per_page 1-{MAX_PAGE_SIZE}")
        c = tasks_table.c
        column = c[sort]
        keys = [column.desc(), c.id.desc()] if order == "desc" else [column.asc(), c.id.asc()]
        if sort == "id":
            keys = keys[:1]
        stmt = (
            select(*(c[name] for name in LIST_COLUMNS))
            .where(filters.where())
            .order_by(*keys)
            .limit(per_page)
            .offset((page - 1) * per_page)
        )
        store = self.store()
        with store.connect() as conn:
            total = count(conn, filters)
            rows = [_row(r) for r in conn.execute(stmt)]
        for row in rows:
            message = row.get("last_error_message")
            if message and len(message) > 300:
                row["last_error_message"] = message[:300] + "…"
        return {
            "total": total,
            "page": page,
            "per_page": per_page,
            "pages": max(1, -(-total // per_page)),
            "sort": sort,
            "order": order,
            "filter": filters.describe(),
            "tasks": rows,
        }

    def task(self, ident: str) -> dict[str, Any]:
        """One task by row id or task id: the row, live state, request and timeline."""
        c = tasks_table.c
        try:
            check_id("id", ident)
        except FilterError as exc:
            raise DashboardError(str(exc)) from None
        number = row_id(ident)
        where = c.id == number if number is not None else c.task_id == ident
        store = self.store()
        with store.connect() as conn:
            row = conn.execute(select(tasks_table).where(where).order_by(c.id).limit(1)).first()
        if row is None:
            raise DashboardError(f"no task {shown(ident)}", 404)
        task = _row(row)
        envelope = _envelope(task.get("envelope"))
        # What people see of the request: secret header values (and cookies) masked.
        envelope = mask_envelope(envelope, self.secret_headers)
        task["envelope"] = envelope
        request = mask_request(envelope.get("request"), self.secret_headers)
        if not isinstance(request, Mapping):
            request = {}
        live: dict[str, Any] = {"available": False}
        events: list[dict[str, Any]] = []
        client = None
        with contextlib.suppress(DashboardError):
            client = self.redis()
        if client is not None:
            live = self._live(client, task["spider"], task["task_id"])
            events = self._events(client, task["spider"], task["task_id"])
        return {
            "task": task,
            "request": {
                "url": request.get("url") or task.get("url"),
                "method": request.get("method") or task.get("method") or "GET",
                "headers": _header_rows(request.get("headers")),
                "meta": request.get("meta") or {},
                "cb_kwargs": request.get("cb_kwargs") or {},
                "callback": request.get("callback"),
                "errback": request.get("errback"),
                "body_bytes": len(request.get("body") or "") * 3 // 4,
            },
            "errors": {
                "first": envelope.get("first_error"),
                "last": envelope.get("last_error"),
            },
            "history": task.get("history") or [],
            "events": events,
            "timeline": _timeline(envelope, events),
            "live": live,
            "next": self._next_step(task, live),
        }

    def _live(self, client: Any, spider: str, task_id: str) -> dict[str, Any]:
        place = view.task_place(client, spider, task_id, self.project)
        return {
            "available": True,
            "due_at": _ms_iso(place.due_ms),
            "lease_until": _ms_iso(place.lease_until_ms),
            "held_by": place.held_by,
            "dead_in_redis": place.dead_in_redis,
        }

    def _events(self, client: Any, spider: str, task_id: str) -> list[dict[str, Any]]:
        """This task's events among the newest TIMELINE_SCAN of its spider, oldest first."""
        out: list[dict[str, Any]] = []
        for ms, parsed in view.task_events(
            client, spider, task_id, scan=TIMELINE_SCAN, project=self.project
        ):
            event: dict[str, Any] = {
                "type": parsed.type,
                "at": _ms_iso(ms),
                "kind": parsed.kind or None,
                "attempt": parsed.fields.get(events.ATTEMPT) or None,
                "node": parsed.node or None,
                "manual": parsed.manual or None,
            }
            due, ts = parsed.due, parsed.ts
            if parsed.type == events.SCHEDULED and due is not None and events.TS in parsed.fields:
                event["delay_s"] = round((due - ts) / 1000, 3)
                event["due_at"] = _ms_iso(due)
            out.append(event)
        return out

    def _next_step(self, task: Mapping[str, Any], live: Mapping[str, Any]) -> str:
        status = task["status"]
        if status == "waiting":
            due = live.get("due_at") or task.get("next_retry_at")
            budget = task.get("max_retries")
            tries = (
                f"; {task.get('attempts_total') or 0} of {budget} retries used"
                if budget is not None
                else ""
            )
            if (
                live.get("available")
                and live.get("due_at") is None
                and live.get("lease_until") is None
            ):
                return "not in the queue any more (its next event is not stored yet)" + tries
            return f"retried by the first node with room once due ({due}){tries}"
        if status == "retrying":
            holder = live.get("held_by") or task.get("node")
            until = live.get("lease_until")
            return f"being retried by {holder}" + (f", lease until {until}" if until else "")
        if status == "dead":
            return "dead letter: nothing more happens unless it is requeued"
        if status == "succeeded":
            return "recovered: nothing more happens"
        return "cancelled: nothing more happens"

    # -- actions -------------------------------------------------------------------

    def action_filters(self, action: str, filters: Filters) -> Filters:
        if action not in ACTIONS:
            raise DashboardError(
                f"unknown action {shown(action)}; known: {', '.join(ACTIONS)}", 404
            )
        return actions.applicable(action, filters)

    def count_for(self, action: str, filters: Filters) -> int:
        narrowed = self.action_filters(action, filters)
        with self.store().connect() as conn:
            return count(conn, narrowed)

    def run_action(self, action: str, filters: Filters, *, dry_run: bool = False) -> dict[str, Any]:
        """Apply *action* to the matching tasks it applies to; says how many it touched."""
        narrowed = self.action_filters(action, filters)
        matched = self.count_for(action, filters)
        result: dict[str, Any] = {
            "action": action,
            "filter": narrowed.describe(),
            "matched": matched,
            "changed": 0,
            "skipped": 0,
            "dry_run": dry_run,
        }
        if dry_run or not matched:
            return result
        store = self.store()
        if action == "purge":
            result["changed"] = actions.purge(store, narrowed)
            return result
        client = self.redis()
        if client is None:
            raise DashboardError("the embedded Redis server is not running", 503)
        config = self.sources().config
        # Its events say who changed the queue: the dashboard of this node.
        node_id = f"{config.node_id}:dashboard"
        if action == "requeue":
            # With a fresh budget, as ``scrapy deadletters requeue`` does by default.
            requeued = actions.requeue(
                store,
                client,
                narrowed,
                node_id=node_id,
                events_maxlen=config.events_maxlen,
                project=config.namespace,
            )
            # Malformed, or a live retry of the same request is queued already.
            changed, skipped = requeued.moved, requeued.live + len(requeued.malformed)
            spiders = requeued.spiders
        else:
            op = actions.retry_now if action == "retry_now" else actions.cancel
            done = op(
                store,
                client,
                narrowed,
                node_id=node_id,
                events_maxlen=config.events_maxlen,
                project=config.namespace,
            )
            changed, skipped, spiders = done.changed, done.skipped, done.spiders
        self.sync(client, spiders)
        result["changed"], result["skipped"] = changed, skipped
        return result

    def sync(self, client: Any, spiders: set[str]) -> None:
        """Write the spiders' waiting events into the store now, so the change shows."""
        sources = self.sources()
        store = self.store()
        for spider in sorted(spiders):
            try:
                event_sync(
                    store,
                    client,
                    spider,
                    sources.store_config,
                    consumer=f"{sources.config.node_id}:dashboard",
                    project=sources.config.namespace,
                ).drain()
            except (redis.RedisError, StoreError):
                # The change is in Redis; the next writer run stores it.
                continue


def _envelope(stored: Any) -> dict[str, Any]:
    """The stored envelope as a dict; one that cannot be read says so, without its text
    (it may hold a secret header that cannot be masked in a text nobody can parse)."""
    envelope = stored if stored is not None else {}
    if isinstance(envelope, str):
        try:
            envelope = json.loads(envelope)
        except ValueError:
            return {"unreadable": f"not JSON ({len(stored)} characters)"}
    if not isinstance(envelope, Mapping):
        return {"unreadable": f"a JSON {type(envelope).__name__}, not an object"}
    return dict(envelope)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The *q* quantile (0-1) of sorted *values*, interpolated between ranks; None if empty."""
    if not values:
        return None
    rank = q * (len(values) - 1)
    low = int(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def _timeline(envelope: Mapping[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's failures (from its envelope) and events (from the stream), by time."""
    items: list[tuple[str, int, dict[str, Any]]] = []
    first, last = envelope.get("first_error"), envelope.get("last_error")
    for which, error, ms in (
        ("first failure", first, envelope.get("created")),
        ("last failure", last if last != first else None, envelope.get("updated")),
    ):
        at = _ms_iso(ms) if isinstance(ms, int) and ms > 0 else None
        if isinstance(error, dict) and at:
            items.append((at, 0, {"type": which, "at": at, "error": error}))
    for event in events:
        items.append((event["at"] or "", 1, event))
    items.sort(key=lambda item: (item[0], item[1]))
    return [item for _, _, item in items]


def _header_rows(headers: Any) -> list[list[str]]:
    """A stored request's headers as (name, value) rows; headers sealed by
    RETRYQUEUE_ENCRYPTION_KEYS (one string, not pairs) as a single row saying so."""
    if isinstance(headers, str):
        return [["(all headers)", headers]]
    if isinstance(headers, Mapping):  # not this package's shape: a hostile or older writer's
        headers = [[name, *(v if isinstance(v, list) else [v])] for name, v in headers.items()]
    if not isinstance(headers, list):
        return []
    return [
        [str(pair[0]), ", ".join(str(v) for v in pair[1:])]
        for pair in headers
        if isinstance(pair, (list, tuple)) and len(pair) >= 2
    ]
