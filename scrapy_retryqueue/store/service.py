"""The store writer as a service: spiders' events → the SQL store, until it is stopped.

One loop serves one spider (a crawl's writer) or many (``scrapy retryqueue
writer``, which also finds spiders whose events stream appears later). It
reads each spider's events through the ``store`` consumer group, writes
batches and acknowledges them after each commit (:class:`~.sync.EventSync`),
sweeps dead letters whose events were trimmed, applies retention, and waits
out an unreachable database or Redis with a capped backoff, logging once per
outage and once when it is back. :meth:`WriterService.flush` writes what is
left within a deadline (a closing crawl): the events, then every dead letter
still in the spider's dead set.

It uses neither Scrapy's engine nor Twisted (the pure modules it shares with
the crawl import parts of Scrapy's library): the caller runs :meth:`~WriterService.run`
in a thread of its choice, copies :class:`Counters` into its own stats, and
calls :meth:`~WriterService.stop` (finish the batch in hand) or
:meth:`~WriterService.force` (end every wait at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy.exc import SQLAlchemyError

from ..config import redact_url
from ..queue.connection import is_outage
from ..secure.signing import ring_for
from ..settings.defaults import (
    REDIS_SOCKET_TIMEOUT,
    STORE_RETENTION_INTERVAL,
    STORE_RETRY_MIN_DELAY,
    STORE_SWEEP_INTERVAL,
    STORE_WRITER_RESCAN,
)
from ..values import now_ms
from .config import StoreConfig
from .db import SchemaError, Store, StoreError, describe_db_error
from .redisops import spiders_with_streams
from .retention import apply_retention
from .sync import EventSync

logger = logging.getLogger(__name__)

#: Errors that mean "the database or Redis is out of reach: try again later".
TRANSIENT: tuple[type[BaseException], ...] = (
    StoreError,
    SQLAlchemyError,
    redis.RedisError,
    OSError,
)


def transient(exc: BaseException) -> bool:
    """One of :data:`TRANSIENT`, or Redis (one server or a cluster) out of reach."""
    return isinstance(exc, TRANSIENT) or is_outage(exc)


Forward = Callable[[str, int], Any]


class Counters:
    """The writer's counts by stat name (``retryqueue/store/...``).

    Thread-safe. *forward*, when given, is called with each increment as it
    happens (a crawl passes its Scrapy stats' ``inc_value``), so that stats
    are live while the writer runs.
    """

    def __init__(self, forward: Forward | None = None) -> None:
        self._forward = forward
        self._values: dict[str, int] = {}
        self._lock = threading.Lock()

    def inc(self, name: str, value: int = 1) -> None:
        if not value:
            return
        with self._lock:
            self._values[name] = self._values.get(name, 0) + value
        if self._forward is not None:
            self._forward(name, value)

    def get(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def event_sync(
    store: Store,
    client: Any,
    spider: str,
    config: StoreConfig,
    *,
    consumer: str,
    stats: Forward | None = None,
    project: str = "",
) -> EventSync:
    """The writer of one spider's events, tuned by the store's settings: the one place
    an :class:`~.sync.EventSync` is made (crawls, ``scrapy deadletters sync``, the
    dashboard, ``scrapy retryqueue writer``)."""
    return EventSync(
        store,
        client,
        spider,
        consumer=consumer,
        batch_size=config.batch_size,
        claim_idle=config.claim_idle,
        stats=stats,
        project=project,
        signing=ring_for(config.signing_keys),
    )


def describe(exc: BaseException) -> str:
    """One line for a database or Redis error."""
    if isinstance(exc, SQLAlchemyError):
        return describe_db_error(exc)
    return f"{type(exc).__name__}: {exc}"


@dataclass(slots=True)
class _Served:
    """One spider the service writes, and when its housekeeping is due (monotonic)."""

    sync: EventSync
    next_sweep: float = 0.0
    next_retention: float = 0.0


class WriterService:
    """Writes the events of *spiders* (None: every spider with an events stream,
    looked for again every *rescan* seconds) into the store.

    The store at *database_url* (or *store*, opened already) and the client
    *open_redis* returns are opened in the writer's own thread when it first
    needs them (that may block: start an embedded server, say), and again after
    a failure until they are. *consumer* names this writer in the consumer
    group: two writers at once need two names. *announce* logs the store it
    writes to once it is open (the caller may have said so already).
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        database_url: str,
        open_redis: Callable[[], Any],
        store: Store | None = None,
        consumer: str,
        spiders: Sequence[str] | None = None,
        rescan: float = STORE_WRITER_RESCAN,
        counters: Counters | None = None,
        announce: bool = True,
        project: str = "",
    ) -> None:
        self.config = config
        #: The namespace of the spiders' keys (RETRYQUEUE_NAMESPACE); "" for none.
        self.project = project
        self.consumer = consumer
        self.counters = counters if counters is not None else Counters()
        self.database_url = database_url
        self.store = store
        self.client: Any = None
        #: Why the writer gave up (a schema it must not write to); None while it may go on.
        self.fatal: str | None = None
        self._open_redis = open_redis
        self._named = list(dict.fromkeys(spiders)) if spiders is not None else None
        self._rescan = rescan
        self._next_scan = 0.0
        self._served: dict[str, _Served] = {}
        self._schema_checked = False
        self._announce = announce
        self._stop = threading.Event()
        self._forced = threading.Event()
        #: run() and flush() never write at the same time.
        self._lock = threading.Lock()
        self._outage_since: float | None = None

    # -- what a caller uses ----------------------------------------------------------

    @property
    def spiders(self) -> list[str]:
        """The spiders served so far."""
        return list(self._served)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """End :meth:`run` once the batch in hand is written and acknowledged."""
        self._stop.set()

    def force(self) -> None:
        """Stop, and end every wait at once (for the database, between flush tries)."""
        self._forced.set()
        self._stop.set()

    @property
    def block_ms(self) -> int:
        """How long one read of a lone spider waits for new events: the interval, but
        below the client's socket timeout (a longer blocking read would time out and
        count as an outage of Redis)."""
        return int(min(self.config.interval, REDIS_SOCKET_TIMEOUT / 2) * 1000)

    def run(self) -> None:
        """Write events as they come until :meth:`stop` (or a schema it must not use)."""
        backoff = STORE_RETRY_MIN_DELAY
        while not self._stop.is_set() and self.fatal is None:
            try:
                with self._lock:
                    self._connect()
                    written, full, blocked = self._round()
                self._recovered()
                backoff = STORE_RETRY_MIN_DELAY
                if full or (blocked and not written):
                    continue  # more is waiting, or the read itself waited for events
                # Less than a full batch: let events gather for an interval before
                # the next. A step per event (a read, an envelope fetch, a transaction,
                # a script call each) cost a 404 crawl about 1 ms of CPU per dead
                # letter, on the crawl's GIL; batches of hundreds about a tenth of that.
                self._stop.wait(self.config.interval)
            except SchemaError as exc:
                self._give_up(str(exc))
            except Exception as exc:
                if not transient(exc):  # a bug: say so, keep the events, and retry later
                    logger.exception("scrapy-retryqueue: the store writer failed")
                    self.counters.inc("retryqueue/store/errors")
                    self._stop.wait(self.config.retry_max)
                    continue
                self._failed(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.config.retry_max)

    def flush(self, deadline: float, *, closing: bool = True) -> int:
        """Write what is left of every spider served, retrying an unreachable store
        until *deadline* (``time.monotonic()``); returns the events written.

        What is left: the events nobody wrote, then every dead letter in the dead
        set whatever its age (its event read by a writer that died, or trimmed),
        as ``scrapy deadletters sync`` does. The last try starts at the deadline;
        :meth:`force` ends the waits between tries at once. *closing* says, when
        the store is down, that a closing spider waits for it.
        """
        backoff = STORE_RETRY_MIN_DELAY
        written = 0
        down = self._outage_since is not None
        if down and closing:
            logger.info(
                "scrapy-retryqueue: the store is still unreachable; the closing spider tries it "
                "for up to %.0fs more (RETRYQUEUE_STORE_CLOSE_TIMEOUT), unless the process is "
                "stopped (Ctrl-C twice)",
                max(deadline - time.monotonic(), 0),
            )
        # No try after the deadline while the store is known to be down.
        tries = not (down and time.monotonic() >= deadline)
        while tries and self.fatal is None and not self._forced.is_set():
            try:
                with self._lock:
                    self._connect()
                    for spider, served in list(self._served.items()):
                        written += served.sync.drain(deadline=deadline).events
                        self._sweep_all(spider, served, deadline)
                self._recovered()
                break
            except SchemaError as exc:
                self._give_up(str(exc))
            except Exception as exc:
                if not transient(exc):
                    raise
                self._failed(exc)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._forced.wait(min(backoff, remaining)):
                    break
                backoff = min(backoff * 2, self.config.retry_max)
        return written

    def unwritten(self) -> dict[str, int | None]:
        """Per spider served, the events not in the store yet (None: Redis cannot tell)."""
        left: dict[str, int | None] = {}
        for spider, served in self._served.items():
            try:
                stream = served.sync.stream
                left[spider] = stream.pending_count() + (stream.lag() or 0)
            except Exception as exc:
                if not transient(exc):  # a cluster out of reach is one too (is_outage)
                    raise
                left[spider] = None
        return left

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.client is not None:
            self.client.close()

    # -- the loop's parts ------------------------------------------------------------

    def _connect(self) -> None:
        if self.client is None:
            self.client = self._open_redis()
        if self.store is None:
            self.store = Store(self.database_url)
        if not self._schema_checked:
            self.store.ensure_schema(create=self.config.create_schema)
            self._schema_checked = True
        if self._announce:
            self._announce = False
            logger.info(
                "scrapy-retryqueue: writing failure history and dead letters to %s",
                self.store.safe_url,
            )
        if self._named is not None:
            for spider in self._named:
                self._serve(spider)
        elif time.monotonic() >= self._next_scan:
            for spider in sorted(
                spiders_with_streams(self.client, self.project) - set(self._served)
            ):
                self._serve(spider)
            self._next_scan = time.monotonic() + self._rescan

    def _serve(self, spider: str) -> None:
        if spider in self._served:
            return
        assert self.store is not None
        sync = event_sync(
            self.store,
            self.client,
            spider,
            self.config,
            consumer=self.consumer,
            stats=self.counters.inc,
            project=self.project,
        )
        self._served[spider] = _Served(sync)
        if self._named is None:
            logger.info("scrapy-retryqueue: the store writer serves spider %r", spider)

    def _round(self) -> tuple[int, bool, bool]:
        """One step of every spider served: (events written, whether a batch was full,
        whether the read waited for new events)."""
        blocking = len(self._served) == 1
        written, full = 0, False
        for spider, served in list(self._served.items()):
            if self._stop.is_set():
                break  # the batches in hand are written: stop between spiders
            try:
                self._housekeeping(spider, served)
                result = served.sync.step(block_ms=self.block_ms if blocking else 0)
            except redis.ResponseError as exc:
                if not str(exc).startswith("NOGROUP"):
                    raise
                # Its stream was deleted (a purge of its keys): serve it afresh.
                del self._served[spider]
                continue
            written += result.events
            full |= result.events >= served.sync.batch_size
        return written, full, blocking

    def _housekeeping(self, spider: str, served: _Served) -> None:
        now = time.monotonic()
        if now >= served.next_sweep:
            swept = served.sync.sweep_dead()
            if swept:
                logger.info(
                    "scrapy-retryqueue: stored %d dead letter(s) of %r whose events were gone",
                    swept,
                    spider,
                )
            served.next_sweep = now + STORE_SWEEP_INTERVAL
        config = self.config
        if now >= served.next_retention and (config.dead_retention or config.history_retention):
            assert self.store is not None
            dead, history = apply_retention(
                self.store,
                spider=spider,
                dead_days=config.dead_retention,
                history_days=config.history_retention,
            )
            self.counters.inc("retryqueue/store/retention_dead", dead)
            self.counters.inc("retryqueue/store/retention_history", history)
            if dead or history:
                logger.info(
                    "scrapy-retryqueue: retention deleted %d dead letter(s) older than %s day(s) "
                    "(RETRYQUEUE_DEAD_RETENTION) and %d finished task(s) older than %s day(s) "
                    "(RETRYQUEUE_HISTORY_RETENTION) of spider %r",
                    dead,
                    config.dead_retention,
                    history,
                    config.history_retention,
                    spider,
                )
            served.next_retention = now + STORE_RETENTION_INTERVAL

    def _sweep_all(self, spider: str, served: _Served, deadline: float) -> None:
        swept = served.sync.sweep_dead(older_than_ms=now_ms(), deadline=deadline)
        if swept:
            logger.info(
                "scrapy-retryqueue: stored %d dead letter(s) of %r that waited in Redis "
                "without an event to write (read by another writer, or trimmed)",
                swept,
                spider,
            )

    def _failed(self, exc: BaseException) -> None:
        self.counters.inc("retryqueue/store/write_errors")
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.counters.inc("retryqueue/store/outages")
            if isinstance(exc, redis.RedisError) or is_outage(exc):
                # The events stream is out of reach, not the database: name Redis.
                logger.error(
                    "scrapy-retryqueue: the store writer cannot read the events in Redis "
                    "(%s); they wait there and are written to the store when Redis answers",
                    describe(exc),
                )
            else:
                logger.error(
                    "scrapy-retryqueue: the store's database at %s cannot be written (%s); "
                    "events wait in Redis and are written when it is back",
                    self.store.safe_url
                    if self.store is not None
                    else redact_url(self.database_url),
                    describe(exc),
                )
        # A connection that broke mid-transaction is discarded by the pool.
        if self.store is not None:
            self.store.engine.dispose()

    def _recovered(self) -> None:
        if self._outage_since is not None:
            logger.warning(
                "scrapy-retryqueue: the store is back after %.1fs; writing the events that waited",
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
            for served in self._served.values():
                served.next_sweep = 0.0  # events trimmed during the outage: their dead letters

    def _give_up(self, message: str) -> None:
        self.fatal = message
        self.counters.inc("retryqueue/store/schema_errors")
        logger.error("scrapy-retryqueue: %s. The store writer stops; events wait in Redis", message)
