"""Stopping a crawl at its start: one ERROR line, a non-zero exit, no traceback after it.

Scrapy exits non-zero only when building the crawler's components fails, and
then prints the exception's traceback (through asyncio's or Twisted's logger).
An error the package has already explained in one line is marked ``logged``;
a filter on those two loggers keeps its traceback out of the crawl's log.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from ..exceptions import RetryQueueError

logger = logging.getLogger(__name__)

#: Loggers through which an exception that failed a crawl's start is printed.
_TRACEBACK_LOGGERS = ("asyncio", "twisted")


class StartError(RetryQueueError):
    """The crawl cannot start; its one ERROR line is in the log already."""


def mark_logged(exc: BaseException) -> BaseException:
    """Mark *exc* as explained in the log already; its traceback is not printed again."""
    exc.retryqueue_logged = True  # type: ignore[attr-defined]
    _install_filter()
    return exc


def stop_at_start(message: str) -> NoReturn:
    """Log *message* as the crawl's one ERROR line and stop the crawl (exit status 1)."""
    logger.error("scrapy-retryqueue: %s", message)
    raise mark_logged(StartError(message))


class _SkipLoggedErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            return not getattr(exc, "retryqueue_logged", False)
        # Twisted writes the failure into the message itself; only errors of
        # these classes reach it from a crawl's start, and they are logged first.
        message = record.getMessage()
        return not any(name in message for name in _LOGGED_AT_START)


_LOGGED_AT_START = (
    "scrapy_retryqueue.runtime.startup.StartError",
    "scrapy_retryqueue.exceptions.ConfigError",
)
_FILTER = _SkipLoggedErrors()


def _install_filter() -> None:
    for name in _TRACEBACK_LOGGERS:
        target = logging.getLogger(name)
        if _FILTER not in target.filters:
            target.addFilter(_FILTER)
