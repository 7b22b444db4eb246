"""Per spider, the live queue (Redis) beside its history (the store), either side optional.

What ``scrapy retryqueue status`` and the dashboard's overview and metrics
start from. A side that cannot be opened is left out with a note saying why,
and the other is still read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import view
from .exceptions import RetryQueueError
from .store.db import Store
from .store.queries import status_counts
from .values import now_ms

#: Said when the embedded server is down: counts are left out, not started for.
EMBEDDED_DOWN = (
    "the embedded Redis server is not running (scrapy retryqueue server start); "
    "live queue counts are not shown"
)


@dataclass(slots=True)
class Status:
    #: The spiders found (or the ones asked for that were found), sorted.
    spiders: list[str]
    #: Redis, None when it cannot be read.
    client: Any
    #: Per spider, the queue now; empty when Redis cannot be read.
    live: dict[str, view.QueueCounts]
    #: Per spider, :func:`~scrapy_retryqueue.store.queries.status_counts`; None
    #: when the store cannot be read.
    history: dict[str, dict[str, Any]] | None
    #: Why a side is missing.
    notes: list[str] = field(default_factory=list)
    #: The time (ms) "due now" counts against.
    now_ms: int = 0
    #: The spiders asked for that have nothing in Redis or in the store, in the
    #: order asked (a spider never crawled, or a wrong name).
    missing: list[str] = field(default_factory=list)
    #: The namespace of the spiders' keys (Config.namespace).
    project: str = ""


def local_midnight() -> datetime:
    """Start of today, local time: what "succeeded today" counts from."""
    return datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)


def collect(
    open_redis: Callable[[], Any],
    open_store: Callable[[], Store],
    spiders: Sequence[str] = (),
    *,
    top: int = 5,
    project: str = "",
) -> Status:
    """Both sides for every spider found, or for *spiders*.

    *open_redis* returns a client or None (the embedded server is not
    running); either callable raises a RetryQueueError (ConfigError,
    SourceError, StoreError, ...) when its side cannot be opened.
    """
    now = now_ms()
    notes: list[str] = []
    client = None
    try:
        client = open_redis()
        if client is None:
            notes.append(EMBEDDED_DOWN)
    except RetryQueueError as exc:
        notes.append(str(exc))
    history: dict[str, dict[str, Any]] | None = None
    try:
        store = open_store()
        with store.connect() as conn:
            history = status_counts(
                conn, list(spiders) or None, since_today=local_midnight(), top=top
            )
    except RetryQueueError as exc:
        notes.append(str(exc))
    names = (view.spiders(client, project) if client is not None else set()) | set(history or {})
    if spiders:
        names = {name for name in spiders if name in names or view.has_keys(client, name, project)}
    found = sorted(names)
    missing = [name for name in dict.fromkeys(spiders) if name not in names]
    live = (
        {} if client is None else {name: view.counts(client, name, now, project) for name in found}
    )
    return Status(found, client, live, history, notes, now, missing, project)
