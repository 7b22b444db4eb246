"""The store writer as a Scrapy extension: events → PostgreSQL / SQLite during a crawl.

It runs :class:`~scrapy_retryqueue.store.sync.EventSync` in a thread of its
own, never on the reactor: the thread reads the spider's events stream through
the ``store`` consumer group, writes batches, and acknowledges them after each
commit. It writes at most one partial batch per RETRYQUEUE_STORE_INTERVAL
(events gather in Redis meanwhile), so a burst of failures costs the crawl a
few large transactions, not one per event. While the database is down it retries with a capped backoff (logging
once per outage); the events wait in Redis and the crawl goes on. When the
spider closes it writes what is left, for at most RETRYQUEUE_STORE_CLOSE_TIMEOUT
seconds in all; anything still unwritten then waits in Redis for the next crawl.
A forced shutdown (the reactor stopping: a second Ctrl-C) ends those writes'
waits at once: the reactor joins its pool threads before the process exits.

The store's modules (SQLAlchemy, Alembic) are imported when the extension is
built for a crawl that writes to the store, with the crawl's own start, not
with this module: a crawl without the store never loads them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import redis
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads

from .config import Config, config_for
from .connection import client_for, embedded_dir
from .defaults import (
    REDIS_SOCKET_TIMEOUT,
    STORE_FINAL_FLUSH_MAX,
    STORE_RETENTION_INTERVAL,
    STORE_RETRY_MIN_DELAY,
    STORE_SWEEP_INTERVAL,
)
from .exceptions import ConfigError
from .runtime import runtime_if_any
from .shutdown import ShutdownTrigger
from .startup import mark_logged
from .store.config import StoreConfig, load_store_config

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from .store.db import Store
    from .store.sync import EventSync

logger = logging.getLogger(__name__)


def _transient() -> tuple[type[BaseException], ...]:
    """Database and Redis errors that mean "try again later"."""
    from sqlalchemy.exc import SQLAlchemyError

    from .store.db import StoreError

    return (StoreError, SQLAlchemyError, redis.RedisError, OSError)


def _describe(exc: BaseException) -> str:
    from sqlalchemy.exc import SQLAlchemyError

    from .store.db import describe_db_error

    if isinstance(exc, SQLAlchemyError):
        return describe_db_error(exc)
    return f"{type(exc).__name__}: {exc}"


def _load_store_modules() -> None:
    """Import the store's modules (SQLAlchemy, Alembic: about 50,000 objects) now,
    before the crawl starts, not in the writer thread once it runs.

    Imported by the writer thread mid-crawl they cost a healthy crawl of 4,000
    pages about 8 % more CPU per page than imported here (paired runs, the
    crawls side by side): the import's own 0.3 s, and the reactor thread slowed
    while the import held the GIL and made the collector walk the crawl's heap.
    """
    from .store import db, sync  # noqa: F401


class RetryQueueStoreExtension:
    def __init__(self, crawler: Crawler, config: Config, store_config: StoreConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.store_config = store_config
        self.stats = crawler.stats
        self.store: Store | None = None
        self.sync: EventSync | None = None
        self.client: redis.Redis | None = None
        self.spider_name: str | None = None
        self._stop = threading.Event()
        #: Set when the reactor stops: the closing writes stop waiting for the database.
        self._shutting_down = threading.Event()
        self._shutdown = ShutdownTrigger("before", self._shutting_down.set)
        #: time.monotonic() by which the closing writes end (RETRYQUEUE_STORE_CLOSE_TIMEOUT).
        self._close_deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._outage_since: float | None = None
        self._fatal: str | None = None
        self._next_sweep = 0.0
        self._next_retention = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RetryQueueStoreExtension:
        try:
            config = config_for(crawler)
            store_config = load_store_config(crawler.settings)
        except ConfigError as exc:
            # One line, no traceback after it (see startup.py).
            logger.error("scrapy-retryqueue: %s", exc)
            raise mark_logged(exc) from None
        if not config.enabled:
            raise NotConfigured("RETRYQUEUE_ENABLED is False")
        if not store_config.enabled:
            raise NotConfigured("RETRYQUEUE_STORE_ENABLED is False")
        ext = cls(crawler, config, store_config)
        _load_store_modules()
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.engine_stopped, signal=signals.engine_stopped)
        return ext

    @property
    def database_url(self) -> str:
        return self.store_config.url_for(embedded_dir(self.config.embedded_dir))

    @property
    def block_ms(self) -> int:
        """How long one read waits for new events: RETRYQUEUE_STORE_INTERVAL, but below
        the client's socket timeout (a longer blocking read would time out, and count
        as an outage of Redis)."""
        return int(min(self.store_config.interval, REDIS_SOCKET_TIMEOUT / 2) * 1000)

    def _inc(self, name: str, value: int) -> None:
        self.stats.inc_value(name, value)

    # -- lifecycle ---------------------------------------------------------------

    def spider_opened(self, spider: Spider) -> None:
        self.spider_name = spider.name
        self._shutdown.arm()
        self._thread = threading.Thread(target=self._run, name="retryqueue-store", daemon=True)
        self._thread.start()

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        # The retry queue's last writes first: dead letters of the final
        # failures, and the leases it releases as it closes (also when it is
        # still connecting: a Ctrl-C as the spider opens).
        runtime = runtime_if_any(self.crawler)
        if runtime is not None and runtime.started:
            await maybe_deferred_to_future(runtime.closed)
        await maybe_deferred_to_future(threads.deferToThread(self._stop_thread))
        self._close_deadline = time.monotonic() + self.store_config.close_timeout
        await maybe_deferred_to_future(
            threads.deferToThread(self._flush, self._close_deadline, final=False)
        )

    async def engine_stopped(self) -> None:
        # Events written while the spider closed (released leases) and cleanup,
        # within what is left of the close timeout.
        deadline = time.monotonic() + min(STORE_FINAL_FLUSH_MAX, self.store_config.close_timeout)
        if self._close_deadline is not None:
            deadline = min(deadline, self._close_deadline)
        await maybe_deferred_to_future(threads.deferToThread(self._flush, deadline, final=True))
        self._shutdown.disarm()

    def _stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    # -- the writer thread -------------------------------------------------------

    def _connect(self) -> EventSync:
        if self.sync is not None:
            return self.sync
        from .store.db import Store
        from .store.sync import EventSync

        if self.client is None:
            directory = embedded_dir(self.config.embedded_dir)
            self.client, _ = client_for(self.config, embedded_directory=directory)
        if self.store is None:
            self.store = Store(self.database_url)
        self.store.ensure_schema(create=self.store_config.create_schema)
        assert self.spider_name is not None
        self.sync = EventSync(
            self.store,
            self.client,
            self.spider_name,
            consumer=self.config.node_id,
            batch_size=self.store_config.batch_size,
            claim_idle=self.store_config.claim_idle,
            policy_table=self.config.policy_table,
            stats=self._inc,
        )
        logger.info(
            "scrapy-retryqueue: writing failure history and dead letters to %s",
            self.store.safe_url,
        )
        return self.sync

    def _run(self) -> None:
        from .store.db import SchemaError

        transient = _transient()
        backoff = STORE_RETRY_MIN_DELAY
        block_ms = self.block_ms
        while not self._stop.is_set() and self._fatal is None:
            try:
                with self._lock:
                    sync = self._connect()
                    self._housekeeping(sync)
                    written = sync.step(block_ms=block_ms)
                self._recovered()
                backoff = STORE_RETRY_MIN_DELAY
                if 0 < written.events < sync.batch_size:
                    # Less than a full batch: let events gather for an interval
                    # before the next one. A step per event (a read, an envelope
                    # fetch, a transaction, a script call each) cost a 404 crawl
                    # about 1 ms of CPU per dead letter, on the crawl's GIL;
                    # batches of hundreds cost about a tenth of that.
                    self._stop.wait(self.store_config.interval)
            except SchemaError as exc:
                self._give_up(str(exc))
            except transient as exc:
                self._failed(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.store_config.retry_max)
            except Exception:  # a bug: say so, keep the events, and retry later
                logger.exception("scrapy-retryqueue: the store writer failed")
                self._inc("retryqueue/store/errors", 1)
                self._stop.wait(self.store_config.retry_max)

    def _housekeeping(self, sync: EventSync) -> None:
        from .store.sync import apply_retention

        now = time.monotonic()
        if now >= self._next_sweep:
            swept = sync.sweep_dead()
            if swept:
                logger.info(
                    "scrapy-retryqueue: stored %d dead letter(s) whose events were gone", swept
                )
            self._next_sweep = now + STORE_SWEEP_INTERVAL
        sc = self.store_config
        if now >= self._next_retention and (sc.dead_retention or sc.history_retention):
            assert self.store is not None
            dead, history = apply_retention(
                self.store,
                spider=self.spider_name,
                dead_days=sc.dead_retention,
                history_days=sc.history_retention,
            )
            self._inc("retryqueue/store/retention_dead", dead)
            self._inc("retryqueue/store/retention_history", history)
            if dead or history:
                logger.info(
                    "scrapy-retryqueue: retention deleted %d dead letter(s) older than %s day(s) "
                    "(RETRYQUEUE_DEAD_RETENTION) and %d finished task(s) older than %s day(s) "
                    "(RETRYQUEUE_HISTORY_RETENTION) of spider %r",
                    dead,
                    sc.dead_retention,
                    history,
                    sc.history_retention,
                    self.spider_name,
                )
            self._next_retention = now + STORE_RETENTION_INTERVAL

    def _failed(self, exc: BaseException) -> None:
        self._inc("retryqueue/store/write_errors", 1)
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self._inc("retryqueue/store/outages", 1)
            if isinstance(exc, redis.RedisError):
                # The events stream is out of reach, not the database: name Redis.
                logger.error(
                    "scrapy-retryqueue: the store writer cannot read the events in Redis "
                    "(%s); they wait there and are written to the store when Redis answers",
                    _describe(exc),
                )
            else:
                url = self.store.safe_url if self.store is not None else self.database_url
                logger.error(
                    "scrapy-retryqueue: the store's database at %s cannot be written (%s); "
                    "events wait in Redis and are written when it is back",
                    url,
                    _describe(exc),
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
            self._next_sweep = 0.0  # events trimmed during the outage: their dead letters

    def _give_up(self, message: str) -> None:
        self._fatal = message
        self._inc("retryqueue/store/schema_errors", 1)
        logger.error("scrapy-retryqueue: %s. The store writer stops; events wait in Redis", message)

    # -- closing -------------------------------------------------------------------

    def _flush(self, deadline: float, *, final: bool) -> None:
        """Write what is left, retrying an unreachable store until *deadline*
        (``time.monotonic()``): the last try starts at the deadline, so a store back
        by then still gets it. A forced shutdown ends the waits between tries."""
        from .store.db import SchemaError

        transient = _transient()
        backoff = STORE_RETRY_MIN_DELAY
        written = 0
        down = self._outage_since is not None
        if down and not final:
            logger.info(
                "scrapy-retryqueue: the store is still unreachable; the closing spider tries it "
                "for up to %.0fs more (RETRYQUEUE_STORE_CLOSE_TIMEOUT), unless the process is "
                "stopped (Ctrl-C twice)",
                max(deadline - time.monotonic(), 0),
            )
        # No try after the deadline while the store is known to be down.
        tries = not (down and time.monotonic() >= deadline)
        while tries and self._fatal is None and self.spider_name is not None:
            try:
                with self._lock:
                    sync = self._connect()
                    written += sync.drain(deadline=deadline).events
                self._recovered()
                break
            except SchemaError as exc:
                self._give_up(str(exc))
            except transient as exc:
                self._failed(exc)
                # A pool thread, not the reactor's: the close waits here on purpose,
                # retrying the database until the deadline. The reactor joins this
                # thread when it stops, so a forced shutdown must cut the wait short.
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._shutting_down.wait(min(backoff, remaining)):
                    break
                backoff = min(backoff * 2, self.store_config.retry_max)
        if final:
            if written:
                # Scrapy dumped the stats already: say it here.
                logger.info(
                    "scrapy-retryqueue: wrote %d more event(s) to the store after the spider "
                    "closed",
                    written,
                )
            self._close(written)

    def _close(self, written: int) -> None:
        left = None
        if self.sync is not None:
            try:
                stream = self.sync.stream
                left = stream.pending_count() + (stream.lag() or 0)
            except (redis.RedisError, OSError):
                left = None
        if left:
            self._inc("retryqueue/left/unstored", left)
            logger.warning(
                "scrapy-retryqueue: %d event(s) of %r are not in the store yet; they wait in "
                "Redis and the next crawl of this spider writes them",
                left,
                self.spider_name,
            )
        if self.store is not None:
            self.store.close()
        if self.client is not None:
            self.client.close()
