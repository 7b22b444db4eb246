"""The store's sweep: dead letters that sit in Redis without an event to carry them.

Their events were trimmed (a long database outage), or never carried them (a
row a weak event could not make): :meth:`DeadLetterSweep.sweep_dead` stores them
from the ``dead`` set, ``deadtasks`` and ``deadkinds`` directly, and takes out of
Redis those the store now holds. Also here: what a dead letter's row needs of
what Redis holds (its kind, whether it can be a row at all).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, select
from sqlalchemy.exc import DBAPIError

from ..decision.kinds import FORGED
from ..queue.events import DEAD, ID, KIND, TS, TYPE
from ..values import now_ms
from .db import Store, describe_db_error, is_connection_error
from .upsert import sweep_statement
from .verify import is_forged
from .writer import TASK_ID_MAX, EnvelopeDoc, Event, build_batch, ms_to_datetime, parse_envelope

if TYPE_CHECKING:
    from .redisops import EventStream
    from .verify import StoreCheck

logger = logging.getLogger("scrapy_retryqueue.store.sync")


class DeadLetterSweep:
    """The sweep of :class:`~.sync.EventSync`, a base of it: it works on the sync's
    store, stream, spider, batch size, counters and reports."""

    store: Store
    stream: EventStream
    spider: str
    batch_size: int
    claim_idle_ms: int
    check: StoreCheck | None

    def inc(self, name: str, value: int = 1) -> None:
        raise NotImplementedError

    def _report_malformed(self, seen: Any, line: str) -> None:
        raise NotImplementedError

    def _verified(self, source: str, key: str, task_id: str, raw: Any, doc: Any) -> Any:
        raise NotImplementedError

    def sweep_dead(self, *, older_than_ms: int | None = None, deadline: float | None = None) -> int:
        """Store dead letters that sit in Redis without an event to carry them
        (their events were trimmed, say, during a long database outage), batch
        by batch until none is left or *deadline* (``time.monotonic()``) passes.

        A malformed one never stops the others. One whose envelope is not JSON
        is stored as a malformed dead letter that keeps its value, as the crawl
        keeps a malformed task; one the store cannot hold (an id that is not
        UTF-8 text, a time of death that is not a time) stays in Redis. Each is
        logged once and counted in ``retryqueue/store/malformed``.
        """
        if older_than_ms is None:
            older_than_ms = now_ms() - self.claim_idle_ms
        stored = skip = 0
        while True:
            found = self.stream.dead_letters(
                older_than_ms=older_than_ms, skip=skip, count=self.batch_size
            )
            if not found:
                break
            deaths = []
            for task_id, score, raw, dead_kind in found:
                problem = unstorable_dead_letter(task_id, score)
                if problem is not None:
                    self._report_malformed(
                        (task_id, score),
                        f"dead letter {shown_id(task_id)} in {self.stream.keys.dead} cannot be "
                        f"stored ({problem}); it stays there, for a person to look at",
                    )
                    continue
                doc = self._swept_envelope(task_id, score, raw)
                deaths.append((task_id, int(score), doc, dead_kind))
            removed = self._store_swept(deaths) if deaths else 0
            stored += removed
            # What stays in Redis (not stored, or malformed) is skipped from now on.
            skip += len(found) - removed
            if len(found) < self.batch_size:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
        self.inc("swept", stored)
        return stored

    def _swept_envelope(self, task_id: str, score: float, raw: Any) -> EnvelopeDoc | None:
        """A swept dead letter's envelope; one that is not a sound JSON object is
        kept in the wrapper of a malformed task (its value as text, or base64)."""
        doc = parse_envelope(raw, task_id=task_id, node=self.stream.consumer)
        if doc is not None and doc.problem is not None:
            self._report_malformed(
                (task_id, score),
                f"dead letter {shown_id(task_id)} in {self.stream.keys.deadtasks} is malformed "
                f"({doc.problem}); stored as a malformed dead letter that keeps its value",
            )
        if self.check is not None:
            doc = self._verified("dead", self.stream.keys.deadtasks, task_id, raw, doc)
        return doc

    def _store_swept(self, deaths: list[tuple[str, int, EnvelopeDoc | None, Any]]) -> int:
        """Write (task id, time of death, envelope, dead kind) dead letters; remove
        from Redis those the store now holds. Returns how many it removed."""
        swept, envelopes = [], {}
        for task_id, ts, doc, dead_kind in deaths:
            kind = FORGED if is_forged(doc) else dead_kind_of(dead_kind, doc)
            fields = {TYPE: DEAD, ID: task_id, TS: str(ts), KIND: kind}
            swept.append(Event("0-0", self.spider, fields))
            envelopes[(self.spider, "dead", task_id)] = doc
        batch = build_batch(swept, envelopes)
        rows = batch.generations[0]
        table = self.store.table
        try:
            with self.store.begin() as conn:
                conn.execute(sweep_statement(conn.dialect.name), rows)
        except DBAPIError as exc:
            if is_connection_error(exc):
                raise
            # One row the database refuses must not keep the others in Redis.
            self._sweep_row_by_row(rows, deaths)
        with self.store.connect() as conn:
            recorded = conn.execute(
                select(table.c.task_id, table.c.finished_at).where(
                    and_(
                        table.c.spider == self.spider,
                        table.c.status == "dead",
                        table.c.task_id.in_([t for t, _, _, _ in deaths]),
                    )
                )
            ).all()
        finished = {t: round(f.timestamp() * 1000) for t, f in recorded if f is not None}
        done = [(t, ts) for t, ts, _, _ in deaths if finished.get(t, -1) >= ts]
        return self.stream.forget_dead(done)

    def _sweep_row_by_row(self, rows: list[dict[str, Any]], deaths: list[Any]) -> None:
        scores = {task_id: ts for task_id, ts, _, _ in deaths}
        for row in rows:
            try:
                with self.store.begin() as conn:
                    conn.execute(sweep_statement(conn.dialect.name), [row])
            except DBAPIError as exc:
                if is_connection_error(exc):
                    raise
                task_id = row["task_id"]
                self._report_malformed(
                    (task_id, scores.get(task_id)),
                    f"dead letter {shown_id(task_id)} in {self.stream.keys.dead} is refused by "
                    f"the store ({describe_db_error(exc)}); it stays there, for a person to "
                    "look at",
                )


def dead_kind_of(stored: Any, doc: Any) -> str:
    """The kind a dead letter died of: its deadkinds entry (*stored*), else, for
    one an older version wrote, its envelope's ``dead_kind`` or ``kind``."""
    if isinstance(stored, bytes):
        stored = stored.decode("utf-8", "replace")
    if isinstance(stored, str) and stored:
        return stored
    doc = doc if isinstance(doc, dict) else {}
    return str(doc.get("dead_kind") or doc.get("kind") or "")


def unstorable_dead_letter(task_id: str, death: float) -> str | None:
    """Why a dead letter read from Redis cannot be a row of the store, or None.

    Such a one could not be removed from Redis once written either (its row
    would hold another id or no time of death), so the sweep leaves it there.
    """
    if not task_id:
        return "its id is empty"
    try:
        task_id.encode()
    except UnicodeEncodeError:  # read with surrogateescape: not UTF-8 in Redis
        return "its id is not UTF-8 text"
    if "\x00" in task_id:
        return "its id holds a NUL character"  # PostgreSQL's text refuses it
    if len(task_id) > TASK_ID_MAX:
        return f"its id is longer than {TASK_ID_MAX} characters"
    if not (math.isfinite(death) and death == int(death) and ms_to_datetime(int(death))):
        return f"its time of death is not a time in ms ({death!r})"
    return None


def shown_id(task_id: str, limit: int = 80) -> str:
    """A task id for a log line: ASCII, the bytes Redis holds when they are not
    UTF-8, at most *limit* characters."""
    try:
        task_id.encode()
    except UnicodeEncodeError:
        return ascii(task_id.encode("utf-8", "surrogateescape")[:limit])
    return ascii(task_id[:limit]) + ("..." if len(task_id) > limit else "")
