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
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError

from ..decision.kinds import FORGED
from ..queue.events import DEAD, KIND
from ..secure.signing import KeyRing
from ..settings.defaults import STORE_SETTINGS
from .db import Store, describe_db_error, is_connection_error
from .redisops import EventStream
from .sweep import DeadLetterSweep, dead_kind_of, shown_id, unstorable_dead_letter
from .upsert import apply_batch
from .verify import StoreCheck, drop_weak, is_forged
from .writer import (
    ENVELOPE_FROM_DEAD,
    ENVELOPE_FROM_TASKS,
    Batch,
    Event,
    build_batch,
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


class EventSync(DeadLetterSweep):
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
        signing: KeyRing | None = None,
    ) -> None:
        """*signing*: RETRYQUEUE_SIGNING_KEYS as a key ring; with one, what does not
        verify makes no row that looks like the crawl's own (store/verify.py)."""
        self.store = store
        self.check = None if signing is None else StoreCheck(signing, project, spider)
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
                    if batch.weak:
                        drop_weak(conn, self.store.table, batch, self.spider, batch.weak)
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
        weak: set[str] = set()
        if self.check is not None:
            checked = self.check.events(events)
            events, weak = checked.events, checked.weak
            self.inc(FORGED, checked.quarantined)
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
                if self.check is not None:
                    doc = self._verified(source, key, task_id, raw, doc)
                envelopes[(self.spider, source, task_id)] = doc
        if self.check is not None:
            events = [_as_forged(e) if is_forged(envelopes.get((self.spider, "dead", e.task_id)))
                      and e.type == DEAD else e for e in events]  # fmt: skip
        batch = build_batch(events, envelopes)
        batch.weak = weak
        return batch

    def _verified(self, source: str, key: str, task_id: str, raw: Any, doc: Any) -> Any:
        """*doc* as the store may take it (store/verify.py): a live task's that does not
        verify gives no column; a dead letter's becomes a forged one."""
        assert self.check is not None
        checked = self.check.envelope(raw, doc, dead=source == "dead", task_id=task_id)
        if checked is not doc:
            what = "task" if source == "tasks" else "dead letter"
            self._report_forged(
                (source, task_id, raw),
                f"{what} {shown_id(task_id)} in {key} is forged (its signature does not verify); "
                + (
                    "its columns are not taken"
                    if source == "tasks"
                    else f"stored as a {FORGED} dead letter that keeps its value"
                ),
            )
        return checked

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

    def _report_forged(self, seen: Any, line: str) -> None:
        # Once per writer, as a malformed one: the sweep may meet it again.
        if seen in self._malformed_seen:
            return
        self._malformed_seen.add(seen)
        self.inc(FORGED)
        logger.error("scrapy-retryqueue: %s", line)

    def _report_malformed(self, seen: Any, line: str) -> None:
        # Once per writer: the sweep meets a dead letter left in Redis every time.
        if seen in self._malformed_seen:
            return
        self._malformed_seen.add(seen)
        self.inc("malformed")
        logger.error("scrapy-retryqueue: %s", line)


def _as_forged(event: Event) -> Event:
    """A dead event whose dead letter is forged: its row is of kind forged."""
    return Event(event.stream_id, event.spider, {**event.fields, KIND: FORGED})


__all__ = [
    "EventSync",
    "StepResult",
    "dead_kind_of",
    "shown_id",
    "unstorable_dead_letter",
]
