"""What the dashboard reads and changes: the live queue in Redis, history in the store.

No web framework here: plain data in, plain data (JSON-ready dicts) out, so the
HTML pages, the JSON API and the tests share one implementation. Filters are
the store commands' (:class:`~scrapy_retryqueue.store.queries.Filters`), plus a
URL substring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import and_, delete, func, select
from sqlalchemy.sql.elements import ColumnElement

from ..commands._common import CommandFailed, Context
from ..commands._status import _spiders_in_redis, redis_counts
from ..exceptions import ConfigError
from ..keys import keys_for
from ..queue import RedisDelayedQueue
from ..store.db import StoreError
from ..store.models import tasks_table
from ..store.queries import FINAL_STATUSES, FilterError, Filters, count, status_counts
from ..store.requeue import requeue_columns, requeue_rows
from ..store.sync import EventSync

#: Statuses each action can change; other matching rows are left alone.
ACTION_STATUSES: dict[str, tuple[str, ...]] = {
    "retry_now": ("waiting",),
    "cancel": ("waiting", "retrying"),
    "requeue": ("dead",),
    "purge": FINAL_STATUSES,
}
ACTIONS = tuple(ACTION_STATUSES)

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
WINDOWS = {"hour": (3600, 60), "day": (86400, 600)}
#: Events read from one spider's stream for the chart, at most.
CHART_MAX_EVENTS = 200_000
#: Newest events scanned for one task's timeline, at most.
TIMELINE_SCAN = 20_000
_CHUNK = 500


class DashboardError(Exception):
    """Something a person can fix (bad filter, store or Redis down); status for HTTP."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _plain_filter_message(message: str) -> str:
    # The store's messages name command-line options (--http-status); here they are fields.
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), message)


def parse_filters(
    params: Mapping[str, Sequence[str] | str | None], *, default_status: str = "all"
) -> tuple[Filters, str]:
    """Filters (and the URL substring) from query-string or JSON values."""

    def values(name: str) -> list[str]:
        raw = params.get(name)
        if raw is None:
            return []
        if isinstance(raw, (str, int)):
            raw = [str(raw)]
        return [str(v) for v in raw if str(v).strip()]

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
        )
    except FilterError as exc:
        raise DashboardError(_plain_filter_message(str(exc))) from None
    q = (one("q") or "").strip()
    if len(q) > 2000:
        raise DashboardError(f"q is {len(q)} characters long; at most 2000")
    return filters, q


def _where(filters: Filters, q: str) -> ColumnElement[bool]:
    where = filters.where()
    if q:
        where = and_(where, tasks_table.c.url.contains(q, autoescape=True))
    return where


def _row(row: Any) -> dict[str, Any]:
    out = {}
    for name, value in row._mapping.items():
        out[name] = _iso(value) if isinstance(value, datetime) else value
    return out


class Backend:
    """Opens the store and Redis on first use (never at construction) and keeps them."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._context: Context | None = None
        self._lock = threading.Lock()

    # -- connections -------------------------------------------------------------

    def context(self) -> Context:
        with self._lock:
            if self._context is None:
                try:
                    self._context = Context(self.settings)
                except ConfigError as exc:
                    raise DashboardError(str(exc), 500) from None
            return self._context

    def store(self) -> Any:
        context = self.context()
        with self._lock:
            try:
                return context.store()
            except (CommandFailed, StoreError) as exc:
                raise DashboardError(str(exc), 503) from None

    def redis(self) -> Any:
        """A Redis client, or None when the embedded server is not running."""
        context = self.context()
        with self._lock:
            try:
                return context.redis(start_embedded=False)
            except CommandFailed as exc:
                raise DashboardError(str(exc), 503) from None

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None

    # -- overview --------------------------------------------------------------

    def overview(self, window: str = "hour", spiders: Sequence[str] = ()) -> dict[str, Any]:
        """Totals, breakdowns and the chart, of every spider or of *spiders*."""
        if window not in WINDOWS:
            raise DashboardError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
        now = datetime.now(UTC)
        now_ms = int(now.timestamp() * 1000)
        notes: list[str] = []
        client = None
        try:
            client = self.redis()
            if client is None:
                notes.append(
                    "the embedded Redis server is not running (scrapy retryqueue server start); "
                    "live queue counts are not shown"
                )
        except DashboardError as exc:
            notes.append(str(exc))
        db: dict[str, dict[str, Any]] | None = None
        failures_today = None
        recovered_by_kind: dict[str, int] = {}
        today = datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        try:
            store = self.store()
            with store.connect() as conn:
                db = status_counts(conn, list(spiders) or None, since_today=today, top=10)
                where = tasks_table.c.created_at >= today
                if spiders:
                    where = and_(where, tasks_table.c.spider.in_(list(spiders)))
                c = tasks_table.c
                done = c.status == "succeeded"
                if spiders:
                    done = and_(done, c.spider.in_(list(spiders)))
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
        except (DashboardError, StoreError) as exc:
            notes.append(str(exc))
        known = (_spiders_in_redis(client) if client is not None else set()) | set(db or {})
        names = sorted(known & set(spiders) if spiders else known)
        per_spider: dict[str, Any] = {}
        by_kind: dict[str, dict[str, int]] = {}
        domains: dict[str, dict[str, int]] = {}
        nodes: Counter[str] = Counter()
        cooling: list[dict[str, Any]] = []
        totals = Counter[str]()
        for spider in names:
            live = redis_counts(client, spider, now_ms) if client is not None else None
            history = (db or {}).get(spider, {})
            statuses = history.get("statuses", {})
            entry = {
                "due": live["due"] if live else None,
                "due_now": live["due_now"] if live else None,
                "leased": live["leased"] if live else None,
                "dead": statuses.get("dead", 0) + (live["dead_in_redis"] if live else 0),
                "succeeded": statuses.get("succeeded", 0),
                "succeeded_today": history.get("succeeded_today", 0),
                "cancelled": statuses.get("cancelled", 0),
                "events_unwritten": live["events_unwritten"] if live else None,
            }
            per_spider[spider] = entry
            for c in (live or {}).get("cooling") or []:
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
                for token in client.hvals(keys_for(spider).owners):
                    # token = <node id>:<process hex>:<claim counter>; node ids may hold ':'
                    nodes[_s(token).rsplit(":", 2)[0]] += 1
        for kind, n in recovered_by_kind.items():
            by_kind.setdefault(kind, {"pending": 0, "dead": 0})["recovered"] = n
        for slot in by_kind.values():
            slot.setdefault("recovered", 0)
        recovered, dead = totals["succeeded"], totals["dead"]
        rate = recovered / (recovered + dead) if recovered + dead else None
        top_domains = sorted(domains.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:10]
        return {
            "generated_at": now.isoformat(),
            "totals": {
                "pending": totals["due"] if client is not None else None,
                "due_now": totals["due_now"] if client is not None else None,
                "leased": totals["leased"] if client is not None else None,
                "failures_today": failures_today,
                "recovered": recovered,
                "dead": dead,
                "success_rate": rate,
            },
            "spiders": per_spider,
            "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -sum(kv[1].values()))),
            "top_domains": [{"domain": d, **n} for d, n in top_domains],
            "nodes": [{"node": n, "leased": c} for n, c in sorted(nodes.items())],
            "cooling": sorted(cooling, key=lambda c: c["until"]),
            "chart": self.chart(client, names, window, now_ms),
            "notes": notes,
        }

    def chart(
        self, client: Any, spiders: Sequence[str], window: str, now_ms: int
    ) -> dict[str, Any]:
        """Scheduled, recovered and dead per bucket over *window*, from the events streams."""
        span, step = WINDOWS[window]
        step_ms = step * 1000
        start = (now_ms - span * 1000) // step_ms * step_ms + step_ms
        buckets = (now_ms - start) // step_ms + 1
        series = {name: [0] * buckets for name in ("scheduled", "recovered", "dead")}
        names = {"scheduled": "scheduled", "succeeded": "recovered", "dead": "dead"}
        truncated = False
        if client is not None:
            for spider in spiders:
                key = keys_for(spider).events
                cursor = f"{start}-0"
                read = 0
                while read < CHART_MAX_EVENTS:
                    entries = client.xrange(key, min=cursor, max="+", count=5000)
                    if not entries:
                        break
                    for entry_id, fields in entries:
                        name = names.get(_s(fields.get(b"type", fields.get("type", ""))))
                        if name is None:
                            continue
                        ms = int(_s(entry_id).partition("-")[0])
                        index = (ms - start) // step_ms
                        if 0 <= index < buckets:
                            series[name][index] += 1
                    read += len(entries)
                    last = _s(entries[-1][0])
                    cursor = "(" + last
                    if len(entries) < 5000:
                        break
                else:
                    truncated = True
        return {
            "window": window,
            "start": start,
            "step_seconds": step,
            "series": series,
            "truncated": truncated,
        }

    # -- tasks -------------------------------------------------------------------

    def tasks(
        self,
        filters: Filters,
        q: str = "",
        *,
        sort: str = "id",
        order: str = "desc",
        page: int = 1,
        per_page: int = 50,
    ) -> dict[str, Any]:
        if sort not in SORTABLE:
            raise DashboardError(f"sort must be one of {', '.join(SORTABLE)}, got {sort!r}")
        if order not in ("asc", "desc"):
            raise DashboardError(f"order must be asc or desc, got {order!r}")
        if page < 1 or not 1 <= per_page <= 500:
            raise DashboardError("page must be >= 1 and per_page 1-500")
        c = tasks_table.c
        where = _where(filters, q)
        column = c[sort]
        keys = [column.desc(), c.id.desc()] if order == "desc" else [column.asc(), c.id.asc()]
        if sort == "id":
            keys = keys[:1]
        stmt = (
            select(*(c[name] for name in LIST_COLUMNS))
            .where(where)
            .order_by(*keys)
            .limit(per_page)
            .offset((page - 1) * per_page)
        )
        store = self.store()
        with store.connect() as conn:
            total = int(
                conn.execute(
                    select(func.count()).select_from(tasks_table).where(where)
                ).scalar_one()
            )
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
            "filter": filters.describe() + (f" url~{q}" if q else ""),
            "tasks": rows,
        }

    def task(self, ident: str) -> dict[str, Any]:
        """One task by row id or task id: the row, live state, request and timeline."""
        c = tasks_table.c
        where = c.id == int(ident) if ident.isdigit() and len(ident) < 19 else c.task_id == ident
        store = self.store()
        with store.connect() as conn:
            row = conn.execute(select(tasks_table).where(where).order_by(c.id).limit(1)).first()
        if row is None:
            raise DashboardError(f"no task {ident!r}", 404)
        task = _row(row)
        envelope = task.get("envelope") or {}
        if isinstance(envelope, str):
            try:
                envelope = json.loads(envelope)
            except ValueError:
                envelope = {"raw": envelope}
        request = envelope.get("request") if isinstance(envelope.get("request"), dict) else {}
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
                "headers": request.get("headers") or [],
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
        k = keys_for(spider)
        pipe = client.pipeline(transaction=False)
        pipe.zscore(k.due, task_id)
        pipe.zscore(k.leased, task_id)
        pipe.hget(k.owners, task_id)
        pipe.zscore(k.dead, task_id)
        due, leased, owner, dead = pipe.execute()
        return {
            "available": True,
            "due_at": _iso(datetime.fromtimestamp(due / 1000, UTC)) if due is not None else None,
            "lease_until": _iso(datetime.fromtimestamp(leased / 1000, UTC))
            if leased is not None
            else None,
            "held_by": _s(owner).rsplit(":", 2)[0] if owner is not None else None,
            "dead_in_redis": dead is not None,
        }

    def _events(self, client: Any, spider: str, task_id: str) -> list[dict[str, Any]]:
        """This task's events among the newest TIMELINE_SCAN of its spider, oldest first."""
        key = keys_for(spider).events
        out: list[dict[str, Any]] = []
        cursor = "+"
        scanned = 0
        while scanned < TIMELINE_SCAN:
            entries = client.xrevrange(key, max=cursor, min="-", count=2000)
            if not entries:
                break
            for entry_id, raw in entries:
                fields = {_s(k): _s(v) for k, v in raw.items()}
                ids = fields.get("ids", "").split() if "ids" in fields else [fields.get("id")]
                if task_id not in ids:
                    continue
                event: dict[str, Any] = {
                    "type": fields.get("type"),
                    "at": _iso(
                        datetime.fromtimestamp(int(_s(entry_id).partition("-")[0]) / 1000, UTC)
                    ),
                    "kind": fields.get("kind") or None,
                    "attempt": fields.get("attempt") or None,
                    "node": fields.get("node") or None,
                    "manual": fields.get("manual") or None,
                }
                if fields.get("type") == "scheduled" and fields.get("due") and fields.get("ts"):
                    event["delay_s"] = round((int(fields["due"]) - int(fields["ts"])) / 1000, 3)
                    event["due_at"] = _iso(datetime.fromtimestamp(int(fields["due"]) / 1000, UTC))
                out.append(event)
            scanned += len(entries)
            cursor = "(" + _s(entries[-1][0])
            if len(entries) < 2000:
                break
        out.reverse()
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
        if action not in ACTION_STATUSES:
            raise DashboardError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}", 404)
        allowed = ACTION_STATUSES[action]
        statuses = [s for s in filters.statuses if s in allowed]
        return dataclasses.replace(filters, statuses=statuses)

    def count_for(self, action: str, filters: Filters, q: str = "") -> int:
        narrowed = self.action_filters(action, filters)
        store = self.store()
        with store.connect() as conn:
            if not q:
                return count(conn, narrowed)
            return int(
                conn.execute(
                    select(func.count()).select_from(tasks_table).where(_where(narrowed, q))
                ).scalar_one()
            )

    def run_action(
        self, action: str, filters: Filters, q: str = "", *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Apply *action* to the matching tasks it applies to; says how many it touched."""
        narrowed = self.action_filters(action, filters)
        matched = self.count_for(action, filters, q)
        result: dict[str, Any] = {
            "action": action,
            "filter": narrowed.describe() + (f" url~{q}" if q else ""),
            "matched": matched,
            "changed": 0,
            "skipped": 0,
            "dry_run": dry_run,
        }
        if dry_run or not matched:
            return result
        where = _where(narrowed, q)
        if action == "purge":
            store = self.store()
            with store.begin() as conn:
                result["changed"] = conn.execute(delete(tasks_table).where(where)).rowcount
            return result
        client = self.redis()
        if client is None:
            raise DashboardError("the embedded Redis server is not running", 503)
        if action == "requeue":
            changed, skipped = self._requeue(client, where)
        else:
            changed, skipped = self._queue_op(client, action, where)
        result["changed"], result["skipped"] = changed, skipped
        return result

    def _rows(self, where: ColumnElement[bool], *columns: Any) -> Any:
        """Matching rows in id order, a chunk at a time (keyset, not offset)."""
        c = tasks_table.c
        store = self.store()
        last = 0
        while True:
            with store.connect() as conn:
                rows = conn.execute(
                    select(c.id, *columns).where(where, c.id > last).order_by(c.id).limit(_CHUNK)
                ).all()
            if not rows:
                return
            last = rows[-1].id
            yield rows

    def _queue(self, client: Any, spider: str) -> RedisDelayedQueue:
        config = self.context().config
        return RedisDelayedQueue(
            client,
            spider,
            node_id=f"{config.node_id}:dashboard",
            events_maxlen=config.events_maxlen,
        )

    def _queue_op(self, client: Any, action: str, where: ColumnElement[bool]) -> tuple[int, int]:
        c = tasks_table.c
        changed = skipped = 0
        spiders: set[str] = set()
        for rows in self._rows(where, c.spider, c.task_id):
            by_spider: dict[str, list[str]] = {}
            for row in rows:
                by_spider.setdefault(row.spider, []).append(row.task_id)
            now_ms = int(time.time() * 1000)
            for spider, ids in by_spider.items():
                queue = self._queue(client, spider)
                op = queue.retry_now if action == "retry_now" else queue.cancel
                done = op(ids, now=now_ms)
                changed += sum(done)
                skipped += len(done) - sum(done)
                spiders.add(spider)
        self.sync(client, spiders)
        return changed, skipped

    def _requeue(self, client: Any, where: ColumnElement[bool]) -> tuple[int, int]:
        """Dead letters back in the queue, due now, with a fresh budget (as
        ``scrapy deadletters requeue`` does)."""
        store = self.store()
        changed = skipped = 0
        spiders: set[str] = set()
        node_id = f"{self.context().config.node_id}:dashboard"
        for rows in self._rows(where, *requeue_columns(tasks_table)[1:]):
            done = requeue_rows(
                store,
                rows,
                queue_for=lambda spider: self._queue(client, spider),
                node_id=node_id,
                keep_budget=False,
            )
            changed += done.moved
            # Malformed, or a live retry of the same request is queued already.
            skipped += done.live + len(done.malformed)
            spiders |= done.spiders
        self.sync(client, spiders)
        return changed, skipped

    def sync(self, client: Any, spiders: set[str]) -> None:
        """Write the spiders' waiting events into the store now, so the change shows."""
        context = self.context()
        store = self.store()
        for spider in sorted(spiders):
            try:
                EventSync(
                    store,
                    client,
                    spider,
                    consumer=f"{context.config.node_id}:dashboard",
                    batch_size=context.store_config.batch_size,
                    claim_idle=context.store_config.claim_idle,
                    policy_table=context.config.policy_table,
                ).drain()
            except (redis.RedisError, StoreError):
                # The change is in Redis; the next writer run stores it.
                continue

    # -- metrics -------------------------------------------------------------------

    def metrics(self) -> str:
        """Queue depth by state and tasks by kind and outcome, Prometheus text format."""
        lines = [
            "# HELP retryqueue_queue_tasks Tasks in the Redis queue by state.",
            "# TYPE retryqueue_queue_tasks gauge",
        ]
        now_ms = int(time.time() * 1000)
        up_redis = up_store = 0
        client = None
        try:
            client = self.redis()
            up_redis = int(client is not None)
        except DashboardError:
            pass
        spiders: set[str] = set()
        if client is not None:
            try:
                spiders = _spiders_in_redis(client)
                for spider in sorted(spiders):
                    live = redis_counts(client, spider, now_ms)
                    for state, key in (
                        ("due", "due"),
                        ("due_now", "due_now"),
                        ("leased", "leased"),
                        ("dead", "dead_in_redis"),
                    ):
                        lines.append(
                            f'retryqueue_queue_tasks{{spider="{_label(spider)}",state="{state}"}} {live[key]}'
                        )
            except redis.RedisError:
                up_redis = 0
        lines += [
            "# HELP retryqueue_tasks Tasks in the store by kind and outcome (status).",
            "# TYPE retryqueue_tasks gauge",
        ]
        try:
            store = self.store()
            c = tasks_table.c
            with store.connect() as conn:
                for spider, kind, status, n in conn.execute(
                    select(c.spider, c.kind, c.status, func.count()).group_by(
                        c.spider, c.kind, c.status
                    )
                ):
                    lines.append(
                        f'retryqueue_tasks{{spider="{_label(spider)}",kind="{_label(kind or "")}",'
                        f'status="{_label(status)}"}} {int(n)}'
                    )
            up_store = 1
        except (DashboardError, StoreError):
            pass
        lines += [
            "# HELP retryqueue_up Whether the dashboard reaches each backend.",
            "# TYPE retryqueue_up gauge",
            f'retryqueue_up{{backend="redis"}} {up_redis}',
            f'retryqueue_up{{backend="store"}} {up_store}',
        ]
        return "\n".join(lines) + "\n"


def _timeline(envelope: Mapping[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's failures (from its envelope) and events (from the stream), by time."""
    items: list[tuple[str, int, dict[str, Any]]] = []
    first, last = envelope.get("first_error"), envelope.get("last_error")
    for which, error, ms in (
        ("first failure", first, envelope.get("created")),
        ("last failure", last if last != first else None, envelope.get("updated")),
    ):
        if isinstance(error, dict) and isinstance(ms, int) and ms > 0:
            at = _iso(datetime.fromtimestamp(ms / 1000, UTC)) or ""
            items.append((at, 0, {"type": which, "at": at, "error": error}))
    for event in events:
        items.append((event["at"] or "", 1, event))
    items.sort(key=lambda item: (item[0], item[1]))
    return [item for _, _, item in items]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
