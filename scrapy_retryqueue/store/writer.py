"""Lifecycle events of the queue → rows of the SQL store (pure; store/upsert writes them).

The queue appends an event to ``retryqueue:{spider}:events`` for each change of
a task (scheduled, claimed, reclaimed, released, succeeded, dead). A batch of
them becomes one row per task, written with one upsert:

- idempotent: each row keeps the stream id of the last event applied to it and
  an event that is not newer changes nothing, so a replayed batch is a no-op;
- last writer wins per column; a column an event does not know (the envelope
  of a ``claimed`` event) keeps its stored value;
- a task that died and then lived again (the same request failed again later)
  keeps its earlier death in ``history``, also inside one batch.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..decision.kinds import BUILTIN_TABLE
from ..exceptions import EnvelopeError
from ..queue import events as lifecycle
from ..queue.envelope import malformed_envelope, read_document
from ..queue.taskinfo import host_of
from ..settings.defaults import FINAL_TASK_STATUSES, META_MAX_RETRIES
from .models import tasks_table

#: Event type → task status (types without one, ``domain``, are no rows).
STATUS_OF = {
    lifecycle.SCHEDULED: "waiting",
    lifecycle.RECLAIMED: "waiting",
    lifecycle.RELEASED: "waiting",
    lifecycle.CLAIMED: "retrying",
    lifecycle.SUCCEEDED: "succeeded",
    lifecycle.DEAD: "dead",
    lifecycle.CANCELLED: "cancelled",
}
FINAL = frozenset(FINAL_TASK_STATUSES)
#: The longest task id the table holds.
TASK_ID_MAX: int = tasks_table.c.task_id.type.length
#: Events whose envelope is read from the tasks hash / the dead letters hash.
ENVELOPE_FROM_TASKS = frozenset({lifecycle.SCHEDULED})
ENVELOPE_FROM_DEAD = frozenset({lifecycle.DEAD})

#: Set from every event (None clears the stored value).
ALWAYS = ("status", "next_retry_at", "finished_at", "updated_at", "event_ms", "event_seq")
#: Set when the event knows them; otherwise the stored value stays.
KNOWN = (
    "url",
    "domain",
    "method",
    "kind",
    "attempts",
    "attempts_total",
    "max_retries",
    "reclaims",
    "first_error_kind",
    "first_error_type",
    "first_error_message",
    "first_error_status",
    "last_error_kind",
    "last_error_type",
    "last_error_message",
    "last_error_status",
    "node",
    "envelope",
)
COLUMNS = ("spider", "task_id", "created_at", *ALWAYS, *KNOWN)


class Event(lifecycle.Event):
    """One event of a spider's events stream (:class:`scrapy_retryqueue.queue.events.Event`)."""

    __slots__ = ("spider",)

    def __init__(self, stream_id: str, spider: str, fields: Mapping[str, str]) -> None:
        super().__init__(stream_id, fields)
        self.spider = spider


def parse_entries(spider: str, entries: Iterable[tuple[Any, Any]]) -> list[Event]:
    """Stream entries ``(id, {field: value})`` as Events (a claim's entry is one
    per task); deleted entries are skipped, and one that is no event this
    version reads becomes an Event without a type, which no row is made of."""
    out = []
    for parsed in lifecycle.parse_entries(entries):
        fields = {} if isinstance(parsed, lifecycle.MalformedEvent) else parsed.fields
        out.append(Event(parsed.stream_id, spider, fields))
    return out


def ms_to_datetime(ms: int | None) -> datetime | None:
    """*ms* as a UTC datetime; None for 0 and for a time outside datetime's years
    (1 to 9999): times come from Redis, and one must not stop the stream."""
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


class EnvelopeDoc(dict[str, Any]):
    """A parsed envelope that remembers its JSON text (written to the store as is)."""

    __slots__ = ("problem", "raw")

    def __init__(self, doc: dict[str, Any], raw: str, problem: str | None = None) -> None:
        super().__init__(doc)
        self.raw = raw
        #: Why the stored value was malformed (it is kept in a malformed
        #: task's wrapper, see :func:`parse_envelope`); None for a sound one.
        self.problem = problem


def parse_envelope(
    raw: str | bytes | None, *, task_id: str = "", node: str = ""
) -> EnvelopeDoc | None:
    """An envelope as a dict. One that is no sound JSON object (not UTF-8, not
    JSON, NaN or Infinity, a lone surrogate, nested too deep: what the crawl's
    reader refuses, and what a database may refuse) is kept as the crawl keeps
    a malformed task, its stored value as text or base64, and says why in
    ``problem``. Nothing else is raised, whatever *raw* is."""
    if raw is None:
        return None
    try:
        doc = read_document(raw)
    except EnvelopeError as exc:
        text = malformed_envelope(task_id, raw if isinstance(raw, (str, bytes)) else repr(raw),
                                  str(exc), node)  # fmt: skip
        return EnvelopeDoc(json.loads(text), _clean_json(text), problem=str(exc))
    text = raw.decode() if isinstance(raw, bytes) else raw
    return EnvelopeDoc(doc, _clean_json(text))


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _clean_json(text: str) -> str:
    # PostgreSQL's jsonb and text refuse NUL; one such value must not block a batch.
    if "\\u0000" in text:
        text = text.replace("\\u0000", "\\ufffd")
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


#: Integers outside SQL's BIGINT are none: SQLite's driver raises OverflowError
#: for them, which is no database error and would stop the writer.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        # Not isdigit(): it accepts "²", which int() refuses; an envelope is input.
        try:
            value = int(value.strip()) if len(value) <= 40 else None
        except ValueError:
            return None
    if isinstance(value, int) and _INT_MIN <= value <= _INT_MAX:
        return value
    return None


def _str(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    text = str(value)[:limit]
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def domain_of(url: str | None) -> str | None:
    """The host of *url* as the crawl's breaker names it (taskinfo.host_of)."""
    if not url:
        return None
    # A task's URL comes again with its next events (scheduled, then succeeded or
    # dead): parsed once. Long ones (rare) are not kept.
    return _domain_cached(url) if len(url) <= _CACHED_URL_MAX else host_of(url)[:255] or None


_CACHED_URL_MAX = 2048


@functools.lru_cache(maxsize=4096)
def _domain_cached(url: str) -> str | None:
    return host_of(url)[:255] or None


def _budget(value: Any) -> int | None:
    # An envelope is input: only a whole number the column holds is a budget.
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None


def _max_retries(doc: Mapping[str, Any], kind: str | None, meta: Any) -> int | None:
    """The retry budget of the failure's kind, as the node that parked the task
    resolved it (the envelope's ``max_retries``). An envelope from before that
    field: the request's own budget (its meta) when it set one, else unknown."""
    budget = _budget(doc.get("max_retries"))
    # The queue's own kinds have no budget; a project's kinds are not known here.
    if budget is not None or (kind is not None and BUILTIN_TABLE.is_internal(kind)):
        return budget
    return _budget(meta.get(META_MAX_RETRIES)) if isinstance(meta, dict) else None


#: An envelope's error fields and the columns each fills (names made once, not per row).
_ERROR_COLUMNS = tuple(
    (which, f"{which}_kind", f"{which}_type", f"{which}_message", f"{which}_status")
    for which in ("first_error", "last_error")
)


def envelope_columns(doc: Mapping[str, Any], *, kind: str | None) -> dict[str, Any]:
    """The columns an envelope tells (request, attempts, errors, node)."""
    request = doc.get("request")
    if not isinstance(request, dict):
        request = {}
    url = request.get("url")
    url = _str(url, 100_000) if isinstance(url, str) else None
    domain = domain_of(url)
    row: dict[str, Any] = {
        "url": url,
        "domain": domain,
        "method": _str(request.get("method") or ("GET" if url else None), 16),
        "envelope": doc.raw if isinstance(doc, EnvelopeDoc) else _clean_json(_dumps(doc)),
    }
    attempts = doc.get("attempts")
    if isinstance(attempts, dict):
        clean = {str(k): v for k, v in attempts.items() if _int(v) is not None}
        row["attempts"] = _dumps(clean)
        row["attempts_total"] = _int(sum(_int(v) or 0 for v in clean.values()))
    for which, kind_column, type_column, message_column, status_column in _ERROR_COLUMNS:
        error = doc.get(which)
        if isinstance(error, dict):
            row[kind_column] = _str(error.get("kind"), 32)
            row[type_column] = _str(error.get("type"), 255)
            row[message_column] = _str(error.get("message"), 10_000)
            row[status_column] = _int(error.get("status"))
    node = doc.get("node")
    if node:
        row["node"] = _str(node, 255)
    if kind is None:
        kind = _str(doc.get("dead_kind") or doc.get("kind") or None, 32)
    row["kind"] = kind
    row["max_retries"] = _max_retries(doc, kind, request.get("meta"))
    return row


def row_for_event(event: Event, envelope: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The column values one event sets; None for an event the store does not track."""
    # The fields read once each: an Event's properties look them up at every use.
    get = event.fields.get
    etype = get(lifecycle.TYPE, "")
    status = STATUS_OF.get(etype)
    task_id = get(lifecycle.ID, "")
    if status is None or not task_id:
        return None
    ms, seq = event.position
    ts = event.ts or ms
    when = ms_to_datetime(ts)
    next_retry = None
    if etype == lifecycle.SCHEDULED:
        due = event.due or ts
        next_retry = when if due == ts else ms_to_datetime(due)
    elif status == "waiting":
        next_retry = when  # reclaimed / released: due at once
    row: dict[str, Any] = {
        "spider": event.spider[:255],
        "task_id": task_id[:TASK_ID_MAX],
        "created_at": when,
        "status": status,
        "next_retry_at": next_retry,
        "finished_at": when if status in FINAL else None,
        "updated_at": when,
        "event_ms": ms,
        "event_seq": seq,
    }
    kind = _str(get(lifecycle.KIND) or None, 32)
    if envelope is not None:
        row.update(envelope_columns(envelope, kind=kind))
        created = ms_to_datetime(_int(envelope.get("created")))
        if created is not None:
            row["created_at"] = created
    else:
        url = _str(get(lifecycle.URL) or None, 100_000)
        row["url"] = url
        row["domain"] = domain_of(url)
        row["kind"] = kind
    node = get(lifecycle.NODE)
    if node:
        row["node"] = _str(node, 255)
    reclaims = event.reclaims
    if reclaims is not None:
        row["reclaims"] = reclaims
    elif etype in (lifecycle.SCHEDULED, lifecycle.SUCCEEDED):
        row["reclaims"] = 0  # a node handled it: earlier expiries were forgiven
    return row


def merge(into: dict[str, Any], newer: Mapping[str, Any]) -> None:
    """Apply *newer* over *into*: last writer wins, unknown (None) values keep."""
    for name, value in newer.items():
        if name == "created_at":
            if value is not None and (into.get(name) is None or value < into[name]):
                into[name] = value
        elif value is not None or name in ALWAYS or name not in into:
            into[name] = value


@dataclass(slots=True)
class Batch:
    """Rows to upsert, in generations: a task that died and lived again in one
    batch has its death in an earlier generation, written first."""

    generations: list[list[dict[str, Any]]] = field(default_factory=list)
    #: (spider, task id, time of death ms, the row that carries it) per dead event.
    deaths: list[tuple[str, str, int, dict[str, Any]]] = field(default_factory=list)
    events: int = 0
    ignored: int = 0
    #: Task ids whose rows only weak events made (store/verify.py): written only over
    #: an unfinished row of the store.
    weak: set[str] = field(default_factory=set)

    @property
    def rows(self) -> int:
        return sum(len(g) for g in self.generations)


def build_batch(
    events: Sequence[Event],
    envelopes: Mapping[tuple[str, str, str], Mapping[str, Any] | None],
) -> Batch:
    """Collapse *events* (stream order) into rows; *envelopes* maps
    (spider, "tasks" | "dead", task id) to the parsed envelope."""
    batch = Batch(events=len(events))
    current: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
    for event in events:
        etype, task_id = event.type, event.task_id
        source = (
            "tasks"
            if etype in ENVELOPE_FROM_TASKS
            else "dead"
            if etype in ENVELOPE_FROM_DEAD
            else None
        )
        envelope = envelopes.get((event.spider, source, task_id)) if source else None
        row = row_for_event(event, envelope)
        if row is None:
            batch.ignored += 1
            continue
        key = (event.spider, task_id)
        held = current.get(key)
        if held is None:
            current[key] = (0, row)
        elif held[1]["status"] == "dead" and row["status"] != "dead":
            # Keep the death: write it in this generation, the new life in the next.
            generation, existing = held
            current[key] = (generation + 1, row)
            _add(batch, generation, existing)
        else:
            merge(held[1], row)
        if etype == lifecycle.DEAD:
            batch.deaths.append((event.spider, task_id, event.ts, current[key][1]))
    for generation, row in current.values():
        _add(batch, generation, row)
    return batch


def _add(batch: Batch, generation: int, row: dict[str, Any]) -> None:
    while len(batch.generations) <= generation:
        batch.generations.append([])
    full = dict.fromkeys(COLUMNS)
    full.update(row)
    batch.generations[generation].append(full)


def stored_deaths(
    batch: Batch, applied: set[tuple[str, str, int, int]]
) -> list[tuple[str, str, int]]:
    """(spider, task id, time of death) of the deaths *batch* wrote to the store.

    A death whose row was not written (a newer event of the task was stored
    first, by another node) is not among them: its dead letter stays in Redis.
    """
    out = []
    for spider, task_id, ts, row in batch.deaths:
        # Only the last death merged into a row is in it (Redis too keeps only
        # the latest death of an id, so an earlier one's removal is a no-op).
        if (spider, task_id, row["event_ms"], row["event_seq"]) in applied:
            out.append((spider, task_id, ts))
    return out
