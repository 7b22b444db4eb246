"""Moves events from a spider's events stream into the store, batch by batch.

One :meth:`EventSync.step`: read a batch (this consumer's unacknowledged
entries first, then entries that a dead consumer left, then new ones), build
the rows, write them in one transaction, and only after the commit remove the
stored dead letters from Redis and acknowledge the entries. A failure anywhere
leaves the entries pending, to be written by the next step: replaying them is
a no-op for rows already written.

Blocking: the store's writer service (store/service.py) runs it in a thread of its own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.exc import DBAPIError

from ..queue.events import DEAD, ID, KIND, TS, TYPE
from ..settings.defaults import STORE_SETTINGS
from ..values import now_ms
from .db import Store, describe_db_error, is_connection_error
from .redisops import EventStream
from .upsert import apply_batch, sweep_statement
from .writer import (
    ENVELOPE_FROM_DEAD,
    ENVELOPE_FROM_TASKS,
    TASK_ID_MAX,
    Batch,
    EnvelopeDoc,
    Event,
    build_batch,
    ms_to_datetime,
    parse_entries,
    parse_envelope,
    stored_deaths,
)

logger = logging.getLogger(__name__)

Stats = Callable[[str, int], None]


@dataclass(slots=True)
class Prepared:
    """A batch read from the stream, its rows built, not yet written."""

    entries: list[Any]
    batch: Batch
    claimed: int


@dataclass(slots=True)
class StepResult:
    events: int = 0
    rows: int = 0
    dead_stored: int = 0
    claimed: int = 0

    def __iadd__(self, other: StepResult) -> StepResult:
        self.events += other.events
        self.rows += other.rows
        self.dead_stored += other.dead_stored
        self.claimed += other.claimed
        return self


class EventSync:
    def __init__(
        self,
        store: Store,
        client: Any,
        spider: str,
        *,
        consumer: str,
        batch_size: int = STORE_SETTINGS["RETRYQUEUE_STORE_BATCH_SIZE"],
        claim_idle: float = STORE_SETTINGS["RETRYQUEUE_STORE_CLAIM_IDLE"],
        stats: Stats | None = None,
        project: str = "",
    ) -> None:
        self.store = store
        self.stream = EventStream(client, spider, consumer=consumer, project=project)
        self.spider = spider
        self.batch_size = batch_size
        self.claim_idle_ms = int(claim_idle * 1000)
        self._stats = stats
        #: Read this consumer's pending entries first (at start and after a failure).
        self._own_pending = True
        self._pending_cursor = "0"
        self._claim_cursor = "0-0"
        self._next_claim = 0.0
        #: Malformed entries already reported (a dead letter: its id and time of death).
        self._malformed_seen: set[Any] = set()

    def inc(self, name: str, value: int = 1) -> None:
        if self._stats is not None and value:
            self._stats(f"retryqueue/store/{name}", value)

    # -- one batch -------------------------------------------------------------

    def step(self, block_ms: int = 0) -> StepResult:
        """Write at most one batch; returns what was written (0 events: nothing to do)."""
        prepared = self.fetch(block_ms)
        if prepared is None:
            return StepResult()
        return self.write(prepared)

    def fetch(self, block_ms: int = 0) -> Prepared | None:
        """Read the next batch and build its rows (no database work).

        This consumer's unacknowledged entries come first, then entries a dead
        consumer left, then new ones.
        """
        stream = self.stream
        entries: list[Any] = []
        claimed = 0
        if self._own_pending:
            entries = stream.read_own_pending(self.batch_size, after=self._pending_cursor)
            if entries:
                self._pending_cursor = entries[-1][0]
            else:
                self._own_pending = False
                self._pending_cursor = "0"
        if not entries and time.monotonic() >= self._next_claim:
            cursor, entries, trimmed = stream.claim_stale(
                self.batch_size, self.claim_idle_ms, self._claim_cursor
            )
            if trimmed:
                # Trimmed before anyone wrote them; the dead letter sweep covers deaths.
                stream.ack(trimmed)
                self.inc("trimmed", len(trimmed))
            self._claim_cursor = cursor
            claimed = len(entries)
            if cursor == "0-0":
                self._next_claim = time.monotonic() + max(1.0, self.claim_idle_ms / 2000)
        if not entries:
            entries = stream.read_new(self.batch_size, block_ms)
        if not entries:
            return None
        try:
            batch = self.build(parse_entries(self.spider, entries))
        except BaseException:
            self.reset()
            raise
        return Prepared(entries, batch, claimed)

    def write(self, prepared: Prepared) -> StepResult:
        """Write a fetched batch in one transaction; after the commit, remove the
        stored dead letters from Redis and acknowledge the entries."""
        batch, entries = prepared.batch, prepared.entries
        try:
            try:
                with self.store.begin() as conn:
                    applied = apply_batch(conn, batch)
            except DBAPIError as exc:
                if is_connection_error(exc):
                    raise
                # A row the database refuses (bad data) must not block the stream.
                applied = self._write_row_by_row(batch, exc)
            deaths = stored_deaths(batch, applied)
            self.stream.forget_dead(
                [(task_id, ts) for _, task_id, ts in deaths], acks=[entry[0] for entry in entries]
            )
        except BaseException:
            self.reset()
            raise
        self.inc("events", len(entries))
        self.inc("rows", batch.rows)
        self.inc("batches")
        self.inc("dead_stored", len(deaths))
        self.inc("claimed_stale", prepared.claimed)
        return StepResult(len(entries), batch.rows, len(deaths), prepared.claimed)

    def _write_row_by_row(
        self, batch: Batch, error: BaseException
    ) -> set[tuple[str, str, int, int]]:
        logger.warning(
            "scrapy-retryqueue: the store refused a batch of %d row(s) (%s); writing them "
            "one by one",
            batch.rows,
            describe_db_error(error),
        )
        applied: set[tuple[str, str, int, int]] = set()
        with self.store.begin() as conn:
            for generation in batch.generations:
                for row in generation:
                    savepoint = conn.begin_nested()
                    try:
                        applied |= apply_batch(conn, Batch(generations=[[row]]))
                        savepoint.commit()
                    except DBAPIError as exc:
                        savepoint.rollback()
                        if is_connection_error(exc):
                            raise
                        self.inc("rejected")
                        logger.error(
                            "scrapy-retryqueue: the store refused task %s of spider %r (%s); "
                            "its events are acknowledged, a dead letter of it stays in Redis",
                            row["task_id"],
                            row["spider"],
                            describe_db_error(exc),
                        )
        return applied

    def reset(self) -> None:
        """After a failure: start again from this consumer's unacknowledged entries."""
        self._own_pending = True
        self._pending_cursor = "0"

    def build(self, events: list[Event]) -> Batch:
        wanted_tasks = list(
            dict.fromkeys(e.task_id for e in events if e.type in ENVELOPE_FROM_TASKS)
        )
        wanted_dead = list(dict.fromkeys(e.task_id for e in events if e.type in ENVELOPE_FROM_DEAD))
        raw_tasks, raw_dead = self.stream.envelopes(wanted_tasks, wanted_dead)
        envelopes: dict[tuple[str, str, str], Any] = {}
        keys = self.stream.keys
        for source, key, wanted, raws in (
            ("tasks", keys.tasks, wanted_tasks, raw_tasks),
            ("dead", keys.deadtasks, wanted_dead, raw_dead),
        ):
            for task_id, raw in zip(wanted, raws, strict=True):
                doc = parse_envelope(raw, task_id=task_id, node=self.stream.consumer)
                if doc is not None and doc.problem is not None:
                    what = "task" if source == "tasks" else "dead letter"
                    self._report_malformed(
                        (source, task_id, raw),
                        f"{what} {shown_id(task_id)} in {key} is malformed ({doc.problem}); "
                        "its row keeps its value as a malformed envelope",
                    )
                envelopes[(self.spider, source, task_id)] = doc
        return build_batch(events, envelopes)

    def drain(self, *, deadline: float | None = None, ahead: int = 2) -> StepResult:
        """Write everything there is now (no waiting for new events).

        A helper thread reads and builds up to *ahead* batches while the
        current one is written, so Redis, JSON and the database work side by side.
        """
        total = StepResult()
        ready: queue.Queue[Prepared | BaseException | None] = queue.Queue(maxsize=ahead)
        stop = threading.Event()

        def produce() -> None:
            try:
                while not stop.is_set():
                    prepared = self.fetch()
                    ready.put(prepared)
                    if prepared is None:
                        return
            except BaseException as exc:
                ready.put(exc)

        producer = threading.Thread(target=produce, name="retryqueue-store-fetch", daemon=True)
        producer.start()
        failed = False
        try:
            while True:
                item = ready.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                total += self.write(item)
                if deadline is not None and time.monotonic() >= deadline:
                    break
        except BaseException:
            failed = True
            raise
        finally:
            stop.set()
            left_over = False
            while producer.is_alive() or not ready.empty():
                with contextlib.suppress(queue.Empty):
                    left_over |= isinstance(ready.get(timeout=0.05), Prepared)
            # Only now that the helper stopped: batches it read but nobody wrote
            # are pending in Redis, read again from this consumer's pending entries.
            if failed or left_over:
                self.reset()
        return total

    # -- dead letters whose events are gone -------------------------------------

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
        return doc

    def _store_swept(self, deaths: list[tuple[str, int, EnvelopeDoc | None, Any]]) -> int:
        """Write (task id, time of death, envelope, dead kind) dead letters; remove
        from Redis those the store now holds. Returns how many it removed."""
        swept, envelopes = [], {}
        for task_id, ts, doc, dead_kind in deaths:
            kind = dead_kind_of(dead_kind, doc)
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

    def _report_malformed(self, seen: Any, line: str) -> None:
        # Once per writer: the sweep meets a dead letter left in Redis every time.
        if seen in self._malformed_seen:
            return
        self._malformed_seen.add(seen)
        self.inc("malformed")
        logger.error("scrapy-retryqueue: %s", line)


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


__all__ = ["EventSync", "StepResult"]
