"""Downloader middleware: classify failed downloads and park them in the queue.

A parked request is not retried here and nothing sleeps: the request leaves the
downloader at once (its concurrency slot is free) and the extension brings it
back when it is due. The request's errback receives a
:class:`~scrapy_retryqueue.exceptions.RequestParked` failure for a parked
attempt, and the real failure once the request is given up.

Requests with ``callback=NO_CALLBACK`` (robots.txt, media pipeline downloads)
are left alone: their caller awaits the download itself, so they cannot be
parked and re-injected later.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import scrapy.exceptions
import twisted.internet.defer
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future

from .classify import FailureInfo, classify_exception, classify_status
from .exceptions import RequestParked
from .runtime import RetryQueueRuntime, _ref_of, runtime_for

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response


CANCELLED: tuple[type[BaseException], ...] = tuple(
    cls
    for cls in (
        getattr(scrapy.exceptions, "DownloadCancelledError", None),
        twisted.internet.defer.CancelledError,
    )
    if cls is not None
)


class RetryQueueMiddleware:
    def __init__(self, runtime: RetryQueueRuntime) -> None:
        self.runtime = runtime
        self.config = runtime.config

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RetryQueueMiddleware:
        return cls(runtime_for(crawler))

    def process_request(
        self, request: Request, spider: Spider | None = None
    ) -> Coroutine[Any, Any, None] | None:
        """Park a fresh request to a domain cooling down (RETRYQUEUE_DOMAIN_COOLDOWN).

        A plain method that returns None at once in the usual case (no domain
        cools down), and a coroutine only when a request must be parked: an
        ``async def`` would cost every request of a healthy crawl a coroutine.
        """
        runtime = self.runtime
        if not runtime.cooling:
            return None
        until = runtime.cooling_until(request)
        if (
            until is None
            or request.meta.get("dont_retry", False)
            or request.callback is NO_CALLBACK
            or _ref_of(request) is not None  # re-injected: the claim let it through
        ):
            return None
        return self._defer(request, until)

    async def _defer(self, request: Request, until: int) -> None:
        runtime = self.runtime
        plan = runtime.plan_deferred(request, until)
        if not plan.decision.retry:
            return None  # cannot be stored (unserializable): let it go now
        outcome = await maybe_deferred_to_future(runtime.persist(plan))
        if outcome in ("parked", "spooled", "duplicate", "stale"):
            runtime.stats.inc_value("retryqueue/domain/deferred")
            raise RequestParked("deferred", plan.decision.delay, plan.task.id)
        return None

    async def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if request.meta.get("dont_retry", False) or request.callback is NO_CALLBACK:
            return response
        failure = classify_status(
            response.status,
            response.headers.get(b"Retry-After"),
            status_kinds=self.config.status_kinds,
            now=time.time(),
        )
        self.runtime.note_outcome(request, failure)
        if failure is None:
            self.runtime.ack(request)
            return response
        await self._park(request, failure)
        return response

    async def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | Response | None:
        if isinstance(exception, IgnoreRequest):
            # Another component dropped the request on purpose: its task is done.
            if not isinstance(exception, RequestParked):
                self.runtime.ack(request, outcome="ignored")
            return None
        if request.meta.get("dont_retry", False) or request.callback is NO_CALLBACK:
            return None
        if isinstance(exception, CANCELLED):
            # The crawl is shutting down, the site did nothing wrong: a task
            # goes back to due for the next node, without using its budget.
            self.runtime.release(request)
            return None
        failure = classify_exception(exception, exception_kinds=self.config.exception_kinds)
        self.runtime.note_outcome(request, failure)
        await self._park(request, failure)
        return None

    async def _park(self, request: Request, failure: FailureInfo) -> Any:
        """Raise RequestParked when the request was parked; return when it was not."""
        plan = self.runtime.plan(request, failure)
        outcome = await maybe_deferred_to_future(self.runtime.persist(plan))
        if outcome in ("parked", "spooled", "duplicate", "stale"):
            # spooled: written once Redis answers again; duplicate / stale:
            # another live task of this request will run it.
            raise RequestParked(plan.decision.kind, plan.decision.delay, plan.task.id)
        # dead, or Redis refused the write: the failure goes on to the errback.
        return None
