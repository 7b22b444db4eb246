"""The checks before a crawl starts: its Redis answers, its paths can be written, its keys fit.

:func:`~.facade.runtime_for` runs them when it builds a crawler's runtime: Scrapy
ends a crawl with a non-zero exit status only when building its components fails,
so this is where a crawl that could not keep its failures stops, with one line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..config import redact_url
from ..exceptions import ConfigError
from ..queue.connection import is_outage

if TYPE_CHECKING:
    from ..config import Config

#: The facade's logger: its lines keep the name they had before the checks moved here.
logger = logging.getLogger(f"{__package__}.facade")


def preflight(config: Config, settings: Any = None, spider: str | None = None) -> None:
    """Stop the crawl with one error line when its Redis cannot be reached at start,
    a path it will write cannot be written, or the queue of *spider* holds signed
    entries this node has no key for (keycheck.py)."""
    from ..exceptions import EmbeddedServerError
    from ..queue import embedded
    from ..queue.connection import check_reachable, embedded_dir
    from ..settings.defaults import REDIS_START_TIMEOUT
    from .keycheck import check_at_start
    from .startup import stop_at_start
    from .writable import directory_problem, file_problem

    if settings is not None:
        from ..store.config import load_store_config

        # The store's extension reads them again when it is built; a bad one is
        # said here, before anything (the project's .scrapy/ folder) is made.
        try:
            load_store_config(settings)
        except ConfigError as exc:
            stop_at_start(str(exc))
    if config.audit_log:
        problem = file_problem(config.audit_log)
        if problem:
            stop_at_start(f"RETRYQUEUE_AUDIT_LOG {config.audit_log!r} cannot be written: {problem}")
    # The local state (the spool, the embedded server's data and the SQLite
    # store) needs a directory with a configured Redis too: found wanting
    # mid-crawl, every failure would be lost with Scrapy's RetryMiddleware
    # already removed. It is looked at first without creating anything (a
    # refused path leaves the disk as it was), then made and written to.
    directory = embedded_dir(config.embedded_dir)
    problem = directory_problem(directory)
    if problem:
        stop_at_start(
            f"the local state has no directory: RETRYQUEUE_EMBEDDED_DIR {str(directory)!r} "
            f"cannot hold the spool and the embedded server's data: {problem}"
        )
    try:
        embedded.check_directory(directory)
    except EmbeddedServerError as exc:
        stop_at_start(f"the local state has no directory: {exc}")
    if config.embedded_dir is None and embedded.user_directory_in_use(directory):
        logger.info(
            "scrapy-retryqueue: no scrapy.cfg in reach (as under Scrapyd); local state in %s "
            "(RETRYQUEUE_EMBEDDED_DIR)",
            directory,
        )
    if config.redis_url is None:
        # Whether it can run here at all; it is started when the spider opens,
        # so that building a crawler starts no process.
        try:
            embedded.server_binary()
        except EmbeddedServerError as exc:
            stop_at_start(f"the embedded Redis-compatible server cannot start: {exc}")
        check_at_start(config, spider, directory)
        return
    if config.start_without_redis:
        return  # an outage at start is spooled like any other
    try:
        check_reachable(config, timeout=REDIS_START_TIMEOUT)
    except Exception as exc:
        if not (is_outage(exc) or isinstance(exc, OSError)):
            raise
        stop_at_start(
            f"Redis at {redact_url(config.redis_url)} ({config.redis_url_setting}) does not "
            f"answer ({exc}); the crawl stops before it fetches anything. Fix the address, or "
            "set RETRYQUEUE_START_WITHOUT_REDIS = True to crawl anyway and keep failures in "
            "the local spool until Redis answers"
        )
    check_at_start(config, spider, directory)
