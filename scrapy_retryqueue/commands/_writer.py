"""``scrapy retryqueue writer``: the store's writer service in the foreground, until a signal.

While it runs it announces itself in Redis (store/announce.py), so that crawls of
the spiders it serves start no writer of their own.

Imported when the subcommand runs, not with the command (Scrapy imports every
command's module whenever ``scrapy`` runs): it loads the store's SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import IO

from ..config import redact_url
from ..queue import embedded
from ..store.announce import WriterAnnouncement
from ..store.service import Counters, WriterService
from ..view.sources import Sources
from ._common import EXIT_ERROR

#: The loggers of the store's writer: their lines are the command's news.
STORE_LOGGER = "scrapy_retryqueue.store"


class _OneLine(logging.Formatter):
    """A record as its message, and an exception as its one-line description:
    a command's errors are one line, never a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message = f"{message} ({type(exc).__name__}: {exc})"
        return message


@contextlib.contextmanager
def _store_lines_on(stream: IO[str]) -> Iterator[None]:
    """The writer's log lines (INFO and up) on *stream*, while Scrapy's log is off."""
    store_logger = logging.getLogger(STORE_LOGGER)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_OneLine())
    level, propagate = store_logger.level, store_logger.propagate
    store_logger.addHandler(handler)
    store_logger.setLevel(logging.INFO)
    store_logger.propagate = False
    try:
        yield
    finally:
        store_logger.removeHandler(handler)
        store_logger.setLevel(level)
        store_logger.propagate = propagate


@contextlib.contextmanager
def _stopped_by_signals(service: WriterService) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM stop *service* after the batch in hand; a second
    one interrupts it at once (exit 130)."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        if service.stopping:
            # The batch in hand may be stuck (a database that does not answer its
            # connect): leave now. Nothing is lost: its events are acknowledged
            # only after their commit, so they are read again by the next writer.
            service.force()
            raise KeyboardInterrupt
        service.stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_writer(
    sources: Sources,
    *,
    spiders: list[str] | None,
    rescan: float,
    consumer: str,
    log_to_stderr: bool,
) -> int:
    """Serve *spiders* (None: every spider with an events stream) until a signal."""
    config, store_config = sources.config, sources.store_config
    # Both must answer at the start: a writer that cannot begin says so and exits.
    client = sources.redis()
    store = sources.store(create=True, check_schema=False)
    store.ensure_schema(create=store_config.create_schema)
    redis_url = config.redis_url or embedded.server_url(sources.directory)
    served = (
        f"spider(s) {', '.join(spiders)}"
        if spiders
        else f"every spider with events (looked for every {rescan:g}s)"
    )
    counters = Counters()
    service = WriterService(
        store_config,
        database_url=sources.database_url,
        store=store,
        open_redis=lambda: client,
        consumer=consumer,
        spiders=spiders,
        rescan=rescan,
        counters=counters,
        announce=False,  # the line below says it
        project=config.namespace,
    )
    print(
        f"writer {consumer}: {served} from Redis {redact_url(redis_url)} into "
        f"{store.safe_url}; Ctrl-C or SIGTERM stops it",
        file=sys.stderr,
        flush=True,
    )
    # Crawls of these spiders that see it start no writer of their own.
    announcement = WriterAnnouncement(
        client,
        consumer=consumer,
        spiders=spiders,
        project=config.namespace,
        signing=config.signing,
    )
    lines = _store_lines_on(sys.stderr) if log_to_stderr else contextlib.nullcontext()
    try:
        announcement.start()
        with lines, _stopped_by_signals(service):
            service.run()
    finally:
        announcement.stop()
        service.close()
    if service.fatal is not None:
        # Its log line said why (a schema changed under it): that is the one line.
        return EXIT_ERROR
    print(
        f"writer {consumer} stopped: {counters.get('retryqueue/store/events')} event(s) written, "
        f"{counters.get('retryqueue/store/dead_stored') + counters.get('retryqueue/store/swept')} "
        f"dead letter(s) stored, for {len(service.spiders)} spider(s)",
        file=sys.stderr,
    )
    return 0
