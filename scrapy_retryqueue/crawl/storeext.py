"""The store writer in a crawl: Scrapy glue over the store's writer service.

It runs :class:`~scrapy_retryqueue.store.service.WriterService` for the
crawling spider in a thread of its own, never on the reactor, and forwards its
counts to the crawl's stats. When the spider closes it stops the service and
lets it write what is left, for at most RETRYQUEUE_STORE_CLOSE_TIMEOUT seconds
in all; anything still unwritten then waits in Redis for the next crawl. A
forced shutdown (the reactor stopping: a second Ctrl-C) ends those writes'
waits at once: the reactor joins its pool threads before the process exits.

The service starts once the spider has something for the store (a dead letter,
an event not written yet: :func:`~scrapy_retryqueue.store.redisops.has_work`,
asked every RETRYQUEUE_STORE_INTERVAL), and only then are the store's modules
(SQLAlchemy) imported and its schema checked: a healthy crawl never loads
them, so its start and every garbage collection of its heap cost what they
cost with the store off (docs/benchmarks.md, "overhead").

By default (RETRYQUEUE_STORE_PROCESS = "auto", or True) the service runs in a
process forked from the crawl as this extension is made (store/forked.py says
why; an INFO line names it); the wait for the first work stays here. Where the
crawl cannot fork (no fork(), other threads running already) the service runs
in the thread, and one line says so (INFO for "auto", WARNING for True); a
writer process that ends early is replaced by the thread. False: the thread.

A crawl whose spider a ``scrapy retryqueue writer`` serves (it announces itself
in Redis: store/announce.py) runs no writer: its forked process ends as the
spider opens, and the wait for work only watches the announcement; should the
announcement expire, the crawl writes from then on (one WARNING line).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads

from ..config import Config, config_for, redact_url
from ..exceptions import ConfigError
from ..queue import embedded
from ..queue.connection import client_for, embedded_dir
from ..runtime import ShutdownTrigger, file_problem, mark_logged, runtime_if_any, stop_at_start
from ..settings.defaults import STORE_FINAL_FLUSH_MAX
from ..store.config import StoreConfig, load_store_config, sqlite_path
from ..store.forked import ForkedWriter, WriterGone, can_fork

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy import Spider
    from scrapy.crawler import Crawler

    from ..store.service import WriterService

logger = logging.getLogger(__name__)


class RetryQueueStoreExtension:
    def __init__(self, crawler: Crawler, config: Config, store_config: StoreConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.store_config = store_config
        self.stats = crawler.stats
        self.service: WriterService | ForkedWriter | None = None
        self.spider_name: str | None = None
        #: Set when the reactor stops: the closing writes stop waiting for the database.
        self._shutdown = ShutdownTrigger("before", self._force)
        #: time.monotonic() by which the closing writes end (RETRYQUEUE_STORE_CLOSE_TIMEOUT).
        self._close_deadline: float | None = None
        self._thread: threading.Thread | None = None
        #: The embedded server's directory while the writer holds it (embedded.hold).
        self._held_server: Path | None = None
        #: Set when the spider closes: the wait for the store's first work ends.
        self._stopping = threading.Event()
        #: The service is made, and the thread stopped, one at a time.
        self._service_lock = threading.Lock()
        #: The forked writer process (RETRYQUEUE_STORE_PROCESS), until it ends.
        self.writer: ForkedWriter | None = None
        #: Set when the engine starts: a spider closed before it (a CloseSpider as it
        #: opens) gets no engine_stopped, so spider_closed does that part too.
        self._engine_ran = False
        #: Set once the final flush has run (engine_stopped, or spider_closed for it).
        self._finished = False
        #: (consumer, key) of the writer service that serves the spider while this
        #: crawl leaves its writes to it (store/announce.py); None while it writes them.
        self.served_by: tuple[str, str] | None = None

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
            # The fleet set-up's nodes run so on purpose: an INFO line of ours,
            # not the WARNING Scrapy gives a NotConfigured with a reason.
            logger.info(
                "scrapy-retryqueue: the store writer is off in this crawl "
                "(RETRYQUEUE_STORE_ENABLED = False): events and dead letters wait in Redis "
                "for `scrapy retryqueue writer` or `scrapy deadletters sync`"
            )
            raise NotConfigured
        database = store_config.database_url and sqlite_path(store_config.database_url)
        problem = database and file_problem(database)
        if problem:
            stop_at_start(
                f"RETRYQUEUE_DATABASE_URL {redact_url(store_config.database_url)!r}: the SQLite file "
                f"cannot be written: {problem}"
            )
        ext = cls(crawler, config, store_config)
        ext.fork_writer()
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
        crawler.signals.connect(ext.engine_stopped, signal=signals.engine_stopped)
        return ext

    @property
    def database_url(self) -> str:
        return self.store_config.url_for(embedded_dir(self.config.embedded_dir))

    def fork_writer(self) -> None:
        """Fork the writer process now, while the crawl is single-threaded, unless
        RETRYQUEUE_STORE_PROCESS is False; one line says where the writer runs."""
        asked = self.store_config.process
        if asked is False:
            return
        setting = "RETRYQUEUE_STORE_PROCESS = " + ("True" if asked else "'auto'")
        reason = can_fork()
        if reason is None:
            try:
                self.writer = ForkedWriter.fork(
                    self._child_service, freeze_heap=self.config.freeze_heap
                )
            except OSError as exc:
                reason = f"fork() failed: {exc}"
            else:
                logger.info(
                    "scrapy-retryqueue: the store writer runs in process %d, forked from the "
                    "crawl (%s)",
                    self.writer.pid,
                    setting,
                )
                return
        if asked:
            # Asked for by name and not had: a line a WARNING-level log shows.
            logger.warning(
                "scrapy-retryqueue: the store writer runs in a thread of the crawl, not in "
                "the process of its own that %s asks for: %s",
                setting,
                reason,
            )
        else:
            logger.info(
                "scrapy-retryqueue: the store writer runs in a thread of the crawl (%s): %s",
                setting,
                reason,
            )

    def _child_service(self, spider_name: str, forward: Callable[[str, int], Any]) -> WriterService:
        """In the forked process: the service, its counts sent to the crawl. The
        crawl holds the embedded server, so here the client only connects."""
        directory = embedded_dir(self.config.embedded_dir)
        return self._new_service(
            spider_name, lambda: client_for(self.config, embedded_directory=directory)[0], forward
        )

    def _new_service(
        self, spider_name: str, open_redis: Callable[[], Any], forward: Callable[[str, int], Any]
    ) -> WriterService:
        from ..store.service import Counters, WriterService

        return WriterService(
            self.store_config,
            database_url=self.database_url,
            open_redis=open_redis,
            consumer=self.config.node_id,
            spiders=[spider_name],
            counters=Counters(forward=forward),
            project=self.config.namespace,
        )

    def _open_redis(self) -> Any:
        # In the writer's thread: it may start the embedded server (blocking).
        directory = embedded_dir(self.config.embedded_dir)
        if self.config.redis_url is None and self._held_server is None:
            # The final flush still reads it after the queue let go of it.
            embedded.hold(directory, keep=self.config.embedded_keep)
            self._held_server = directory
        client, _ = client_for(self.config, embedded_directory=directory)
        return client

    def make_service(self, spider_name: str) -> WriterService | ForkedWriter:
        """The writer of *spider_name*'s events, its counts in the crawl's stats:
        the forked process when there is one, else a service of this process."""
        self.spider_name = spider_name
        if self.writer is not None:
            # Called once _open_redis has run here: the crawl holds the embedded
            # server the process connects to.
            self.writer.start(spider_name, self.stats.inc_value)
            self.service = self.writer
            return self.writer
        return self._thread_service(spider_name)

    def _thread_service(self, spider_name: str) -> WriterService:
        self.spider_name = spider_name
        self.service = self._new_service(spider_name, self._open_redis, self.stats.inc_value)
        return self.service

    # -- lifecycle ---------------------------------------------------------------

    def spider_opened(self, spider: Spider) -> None:
        self.spider_name = spider.name
        self._shutdown.arm()
        self._thread = threading.Thread(
            target=self._run, args=(spider.name,), name="retryqueue-store", daemon=True
        )
        self._thread.start()

    def _run(self, spider_name: str) -> None:
        """The writer's thread: wait for the store's first work, then write as it comes."""
        if not self._wait_for_work(spider_name):
            return
        with self._service_lock:
            if self._stopping.is_set():
                return  # the spider closed meanwhile: the close writes it
            service = self.service or self.make_service(spider_name)
        try:
            service.run()
        except WriterGone:
            with self._service_lock:
                if self._stopping.is_set():
                    return  # the close writes what is left (_service_for_close)
                service = self._writer_gone(spider_name)
            service.run()

    def _writer_gone(self, spider_name: str) -> WriterService:
        """The writer process ended early: from now on, the thread writes."""
        logger.error(
            "scrapy-retryqueue: the store writer process ended unexpectedly; a thread of "
            "the crawl takes over its writes (nothing is lost: unwritten events wait in Redis)"
        )
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.end(timeout=1.0)
        return self._thread_service(spider_name)

    def _wait_for_work(self, spider_name: str) -> bool:
        """Until the spider has something for the store (True) or closes (False).

        One or two reads of Redis per RETRYQUEUE_STORE_INTERVAL, and nothing of the
        store's loaded. A Redis that does not answer is the service's to handle
        (its outage line, its backoff): it starts then. While a writer service
        announces itself for the spider, the crawl leaves the writing to it.
        """
        from ..store.announce import announced_writer
        from ..store.redisops import has_work

        project = self.config.namespace
        client = None
        try:
            while True:
                try:
                    if client is None:
                        client = self._open_redis()
                    served = self._left_to_service(
                        spider_name,
                        announced_writer(client, spider_name, project, self.config.signing),
                    )
                    if not served and has_work(client, spider_name, project=project):
                        return True
                except Exception:
                    if self.served_by is None:
                        return True
                    # The service's Redis is ours: while it is out of reach,
                    # neither writes, and the events wait there.
                if self._stopping.wait(self.store_config.interval):
                    return False
        finally:
            if client is not None:
                client.close()

    def _left_to_service(self, spider_name: str, found: tuple[str, str] | None) -> bool:
        """Whether a writer service serves the spider (*found*: its announcement):
        the crawl's own writer process ends then, and the crawl says so once; when
        the service stops announcing itself, the crawl writes from then on."""
        if found is not None:
            if self.served_by is None:
                self.served_by = found
                logger.info(
                    "scrapy-retryqueue: the store writer service %r serves spider %r (%s in "
                    "Redis): this crawl runs no store writer of its own",
                    found[0],
                    spider_name,
                    found[1],
                )
                with self._service_lock:
                    writer, self.writer = self.writer, None
                if writer is not None:
                    writer.end()
            return True
        if self.served_by is not None:
            consumer, key = self.served_by
            self.served_by = None
            logger.warning(
                "scrapy-retryqueue: the store writer service %r stopped announcing itself "
                "(%s expired or was deleted): this crawl writes spider %r's events to the "
                "store itself from now on",
                consumer,
                key,
                spider_name,
            )
        return False

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
        if not self._engine_ran:
            # Scrapy sends engine_stopped only for an engine that ran: without
            # this, the writer process (and the heap frozen for it) would outlive
            # the crawl in a process that goes on (CrawlerProcess, a test).
            await self.engine_stopped()

    def engine_started(self) -> None:
        self._engine_ran = True

    async def engine_stopped(self) -> None:
        if self._finished:
            return
        self._finished = True
        # Events written while the spider closed (released leases) and cleanup,
        # within what is left of the close timeout.
        deadline = time.monotonic() + min(STORE_FINAL_FLUSH_MAX, self.store_config.close_timeout)
        if self._close_deadline is not None:
            deadline = min(deadline, self._close_deadline)
        await maybe_deferred_to_future(threads.deferToThread(self._flush, deadline, final=True))
        self._shutdown.disarm()

    def _force(self) -> None:
        self._stopping.set()
        if self.service is not None:
            self.service.force()

    def _stop_thread(self) -> None:
        with self._service_lock:
            self._stopping.set()
            service = self.service
        if service is not None:
            service.stop()
        if self._thread is not None:
            self._thread.join()

    def _service_for_close(self) -> WriterService | ForkedWriter | None:
        """The service, made now if the crawl wrote nothing for the store until its
        close and something is there (its last failures, its released leases);
        none while a writer service serves the spider: its writes are the service's."""
        if self.service is None and self.spider_name is not None:
            from ..store.announce import announced_writer
            from ..store.redisops import has_work

            project = self.config.namespace
            client = None
            try:
                client = self._open_redis()
                found = announced_writer(client, self.spider_name, project, self.config.signing)
                served = self._left_to_service(self.spider_name, found)
                work = not served and has_work(client, self.spider_name, project=project)
            except Exception:
                work = self.served_by is None
            finally:
                if client is not None:
                    client.close()
            if work:
                self.make_service(self.spider_name)
        return self.service

    # -- closing -------------------------------------------------------------------

    def _flush(self, deadline: float, *, final: bool) -> None:
        """Write what is left until *deadline* (``time.monotonic()``); after the
        final flush, say what is left and close."""
        service = self._service_for_close()
        if service is None:
            if final:
                self._close()
            return
        # A pool thread, not the reactor's: the close waits here on purpose,
        # retrying the database until the deadline; a forced shutdown cuts it short.
        try:
            written = service.flush(deadline, closing=not final)
        except WriterGone:
            assert self.spider_name is not None
            service = self._writer_gone(self.spider_name)
            written = service.flush(deadline, closing=not final)
        if final:
            if written:
                # Scrapy dumped the stats already: say it here.
                logger.info(
                    "scrapy-retryqueue: wrote %d more event(s) to the store after the spider "
                    "closed",
                    written,
                )
            self._close()

    def _close(self) -> None:
        try:
            if self.service is not None:
                try:
                    self._close_service(self.service)
                except WriterGone:
                    assert self.spider_name is not None
                    service = self._writer_gone(self.spider_name)
                    # What the process left, written if it can be, and counted.
                    service.flush(time.monotonic() + STORE_FINAL_FLUSH_MAX, closing=False)
                    self._close_service(service)
        finally:
            if self.writer is not None:
                # Ends it whether it ever served (a healthy crawl's never did) or not.
                writer, self.writer = self.writer, None
                writer.end()
            if self._held_server is not None:
                directory, self._held_server = self._held_server, None
                embedded.let_go(directory, keep=self.config.embedded_keep)

    def _close_service(self, service: WriterService | ForkedWriter) -> None:
        left = sum(n or 0 for n in service.unwritten().values())
        if left:
            self.stats.inc_value("retryqueue/left/unstored", left)
            logger.warning(
                "scrapy-retryqueue: %d event(s) of %r are not in the store yet; they wait in "
                "Redis and the next crawl of this spider writes them",
                left,
                self.spider_name,
            )
        service.close()
