"""What the engine of a crawl is still working on, and its offsite rule, read without changing it.

A request leaves the engine's ``slot.inprogress`` only once its callback has run
and that output has gone through the item pipelines and to the scheduler (or its
failure was handled): until then a node killed in the middle loses it, so
whatever holds a lease on it (a re-injected retry, a leased frontier request)
is acknowledged only after that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Container

    from scrapy import Request


def in_progress(crawler: Any) -> Container[Request] | None:
    """The requests the engine has not finished; None when this Scrapy does not tell."""
    engine = getattr(crawler, "engine", None)
    slot = getattr(engine, "_slot", None)
    if slot is None:
        return frozenset()  # the engine holds nothing (not started, or closed)
    inprogress = getattr(slot, "inprogress", None)
    return inprogress if isinstance(inprogress, (set, frozenset)) else None


def wake(crawler: Any) -> None:
    """Ask the engine for its next requests now, not at its next heartbeat."""
    slot = getattr(getattr(crawler, "engine", None), "_slot", None)
    nextcall = getattr(slot, "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def offsite_rule(crawler: Any) -> Any:
    """The ``should_follow(request, spider)`` of the crawl's downloader OffsiteMiddleware
    (Scrapy's, or a project's subclass of it), None when the crawl runs none.

    A re-injected request carries ``dont_filter`` (the dupefilter saw it the first
    time), which that middleware lets through unchecked; the runtime asks this rule
    instead, so that a retry goes where a fresh request of the spider may go.
    """
    from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware

    try:
        engine = crawler.engine
    except (AttributeError, RuntimeError):  # Scrapy 2.19: not set before the crawl starts
        return None
    manager = getattr(getattr(engine, "downloader", None), "middleware", None)
    for middleware in getattr(manager, "middlewares", ()):
        if isinstance(middleware, OffsiteMiddleware):
            return middleware.should_follow
    return None
