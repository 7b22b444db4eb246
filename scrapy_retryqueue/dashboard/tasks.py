"""The tasks table and one task's page: store rows, where the task is in Redis, its request and timeline.

Rows come from the store, filtered as the export command filters them; one task adds
its place in the queue now and its events (both from Redis, when it answers), and
what people may see of its request: secret header values, cookies and URL passwords
masked (:mod:`scrapy_retryqueue.secure.redact`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ..queue import events
from ..secure.redact import mask_envelope, mask_request, mask_url_passwords
from ..store.models import tasks_table
from ..store.queries import FilterError, Filters, check_id, count, row_id, shown
from ..view import live as view
from .errors import DashboardError
from .settings import MAX_PAGE_SIZE
from .times import iso, ms_iso

if TYPE_CHECKING:
    from .connections import Connections

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
#: Newest events scanned for one task's timeline, at most.
TIMELINE_SCAN = 20_000
#: Columns that may quote a URL, and so its password (masked as the envelope's).
_URL_COLUMNS = frozenset({"url", "first_error_message", "last_error_message"})


def listing(
    backend: Connections,
    filters: Filters,
    *,
    sort: str = "id",
    order: str = "desc",
    page: int = 1,
    per_page: int = 50,
) -> dict[str, Any]:
    """One page of the tasks matching *filters*, sorted, with their total."""
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
    store = backend.store()
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


def one(backend: Connections, ident: str) -> dict[str, Any]:
    """One task by row id or task id: the row, live state, request and timeline."""
    c = tasks_table.c
    try:
        check_id("id", ident)
    except FilterError as exc:
        raise DashboardError(str(exc)) from None
    number = row_id(ident)
    where = c.id == number if number is not None else c.task_id == ident
    store = backend.store()
    with store.connect() as conn:
        row = conn.execute(select(tasks_table).where(where).order_by(c.id).limit(1)).first()
    if row is None:
        raise DashboardError(f"no task {shown(ident)}", 404)
    task = _row(row)
    envelope = _envelope(task.get("envelope"))
    # What people see of the request: secret header values (and cookies) masked.
    envelope = mask_envelope(envelope, backend.secret_headers)
    task["envelope"] = envelope
    request = mask_request(envelope.get("request"), backend.secret_headers)
    if not isinstance(request, Mapping):
        request = {}
    live: dict[str, Any] = {"available": False}
    seen: list[dict[str, Any]] = []
    client = None
    with contextlib.suppress(DashboardError):
        client = backend.redis()
    if client is not None:
        live = _live(client, task["spider"], task["task_id"], backend.project)
        seen = _events(client, task["spider"], task["task_id"], backend.project)
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
        "events": seen,
        "timeline": _timeline(envelope, seen),
        "live": live,
        "next": _next_step(task, live),
    }


def _row(row: Any) -> dict[str, Any]:
    out = {}
    for name, value in row._mapping.items():
        if isinstance(value, datetime):
            value = iso(value)
        elif name in _URL_COLUMNS:
            value = mask_url_passwords(value)
        out[name] = value
    return out


def _live(client: Any, spider: str, task_id: str, project: str) -> dict[str, Any]:
    place = view.task_place(client, spider, task_id, project)
    return {
        "available": True,
        "due_at": ms_iso(place.due_ms),
        "lease_until": ms_iso(place.lease_until_ms),
        "held_by": place.held_by,
        "dead_in_redis": place.dead_in_redis,
    }


def _events(client: Any, spider: str, task_id: str, project: str) -> list[dict[str, Any]]:
    """This task's events among the newest TIMELINE_SCAN of its spider, oldest first."""
    out: list[dict[str, Any]] = []
    for ms, parsed in view.task_events(
        client, spider, task_id, scan=TIMELINE_SCAN, project=project
    ):
        event: dict[str, Any] = {
            "type": parsed.type,
            "at": ms_iso(ms),
            "kind": parsed.kind or None,
            "attempt": parsed.fields.get(events.ATTEMPT) or None,
            "node": parsed.node or None,
            "manual": parsed.manual or None,
        }
        due, ts = parsed.due, parsed.ts
        if parsed.type == events.SCHEDULED and due is not None and events.TS in parsed.fields:
            event["delay_s"] = round((due - ts) / 1000, 3)
            event["due_at"] = ms_iso(due)
        out.append(event)
    return out


def _next_step(task: Mapping[str, Any], live: Mapping[str, Any]) -> str:
    status = task["status"]
    if status == "waiting":
        due = live.get("due_at") or task.get("next_retry_at")
        budget = task.get("max_retries")
        tries = (
            f"; {task.get('attempts_total') or 0} of {budget} retries used"
            if budget is not None
            else ""
        )
        if live.get("available") and live.get("due_at") is None and live.get("lease_until") is None:
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


def _timeline(envelope: Mapping[str, Any], seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's failures (from its envelope) and events (from the stream), by time."""
    items: list[tuple[str, int, dict[str, Any]]] = []
    first, last = envelope.get("first_error"), envelope.get("last_error")
    for which, error, ms in (
        ("first failure", first, envelope.get("created")),
        ("last failure", last if last != first else None, envelope.get("updated")),
    ):
        at = ms_iso(ms) if isinstance(ms, int) and ms > 0 else None
        if isinstance(error, dict) and at:
            items.append((at, 0, {"type": which, "at": at, "error": error}))
    for event in seen:
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
