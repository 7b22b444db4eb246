"""Downloader middleware: classify failed downloads and park them in the queue.

A parked request is not retried here and nothing sleeps: the request leaves the
downloader at once (its concurrency slot is free) and the extension brings it
back when it is due. The request's errback receives a
:class:`~scrapy_retryqueue.exceptions.RequestParked` failure for a parked
attempt, and the real failure once the request is given up.

Requests with ``callback=NO_CALLBACK`` (robots.txt, media pipeline downloads)
are not parked: their caller awaits the download itself, so they cannot be
re-injected later. Scrapy's own RetryMiddleware, which the add-on removed for
everyone, retries them here as it would have (RETRY_TIMES, RETRY_HTTP_CODES).

With Scrapy's HTTP cache on, a failure status answered from the cache (cached
before the add-on kept failures out of the cache: addon.py) is asked of
the site again at once, past the cache, before it counts as an attempt.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import scrapy.exceptions
import twisted.internet.defer
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.python.failure import Failure

from ..decision.classify import classify_exception, classify_status
from ..exceptions import DomainCoolingDown, RequestParked
from ..runtime import Parking, RetryQueueRuntime, runtime_for
from ..settings.defaults import SCRAPY_META_DONT_CACHE

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
    def __init__(self, runtime: RetryQueueRuntime, stock: Any = None) -> None:
        self.runtime = runtime
        #: Scrapy's RetryMiddleware, for the requests that cannot be parked; None
        #: when RETRY_ENABLED is False (stock would not retry them either).
        self.stock = stock
        self.config = runtime.config
        #: The cooling domains (a read-only view the runtime keeps current): empty
        #: in a healthy crawl, so process_request costs one truth test.
        self._cooling = runtime.cooling
        runtime.on_domain_cooling(self._take_back_queued)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RetryQueueMiddleware:
        from scrapy.downloadermiddlewares.retry import RetryMiddleware
        from scrapy.exceptions import NotConfigured
        from scrapy.utils.misc import build_from_crawler

        runtime = runtime_for(crawler)
        try:
            stock = build_from_crawler(RetryMiddleware, crawler)
        except NotConfigured:
            stock = None
        return cls(runtime, stock)

    def _take_back_queued(self) -> None:
        """Take the requests of cooling domains back out of Scrapy's download queue.

        process_request gates a request when it enters the downloader, but
        with DOWNLOAD_DELAY, AutoThrottle or per-domain concurrency it may then
        wait in its slot's queue for seconds: a domain that starts to cool
        meanwhile must not receive it. Each one's download fails with
        DomainCoolingDown, which process_exception parks as ``deferred``.
        """
        engine = getattr(self.runtime.crawler, "engine", None)
        downloader = getattr(engine, "downloader", None)
        for slot in list(getattr(downloader, "slots", {}).values()):
            queue = getattr(slot, "queue", None)
            if not queue:
                continue
            held = [
                (request, waiting)
                for request, waiting in queue
                if self.runtime.cooling_until(request) is not None
                and request.callback is not NO_CALLBACK
                and not request.meta.get("dont_retry", False)
            ]
            for request, waiting in held:
                queue.remove((request, waiting))
                waiting.errback(Failure(DomainCoolingDown(f"{request.url}: its domain cools down")))

    def process_request(
        self, request: Request, spider: Spider | None = None
    ) -> Coroutine[Any, Any, None] | None:
        """Park a fresh request to a domain cooling down (RETRYQUEUE_DOMAIN_COOLDOWN).

        A plain method that returns None at once in the usual case (no domain
        cools down), and a coroutine only when a request must be parked: an
        ``async def`` would cost every request of a healthy crawl a coroutine.
        """
        if not self._cooling or request.meta.get("dont_retry", False):
            return None
        if request.callback is NO_CALLBACK:
            return None
        # None for a re-injected task too: its claim let it through.
        parking = self.runtime.defer(request)
        return None if parking is None else self._park(parking)

    async def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if request.meta.get("dont_retry", False):
            return response
        if request.callback is NO_CALLBACK:
            if self.stock is None:
                return response
            return self.stock.process_response(request, response)
        failure = classify_status(
            response.status,
            response.headers.get(b"Retry-After"),
            status_kinds=self.config.status_kinds,
            now=time.time(),
        )
        if failure is None:
            self.runtime.download_succeeded(request)
            return response
        if "cached" in response.flags and not request.meta.get(SCRAPY_META_DONT_CACHE):
            # The cache's word, not the site's: ask the site, as if the cache
            # had not had it, before any attempt is counted.
            self.runtime.count("retryqueue/cache_bypassed")
            return request.replace(
                dont_filter=True, meta={**request.meta, SCRAPY_META_DONT_CACHE: True}
            )
        parking = self.runtime.download_failed(request, failure)
        if not parking.final:  # a dead letter goes on at once: no coroutine for _park
            await self._park(parking)
        return response

    async def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | Response | None:
        if isinstance(exception, IgnoreRequest):
            # Another component dropped the request on purpose: its task is done.
            if not isinstance(exception, RequestParked):
                self.runtime.ack(request, ignored=True)
            return None
        if request.meta.get("dont_retry", False):
            return None
        if request.callback is NO_CALLBACK:
            if self.stock is None:
                return None
            return self.stock.process_exception(request, exception)
        if isinstance(exception, DomainCoolingDown):
            return await self._defer_held(request)
        if isinstance(exception, CANCELLED):
            # The crawl is shutting down, the site did nothing wrong: a task
            # goes back to due for the next node, without using its budget.
            self.runtime.release(request)
            return None
        failure = classify_exception(exception, exception_kinds=self.config.exception_kinds)
        parking = self.runtime.download_failed(request, failure)
        if not parking.final:
            await self._park(parking)
        return None

    async def _defer_held(self, request: Request) -> Request | None:
        """Park a request taken back from the download queue; if it cannot be
        parked, hand it back to the scheduler rather than lose it."""
        parking = self.runtime.defer(request, held=True)
        if parking is not None:
            await self._park(parking)  # raises RequestParked once parked
        return request.replace(dont_filter=True)

    @staticmethod
    async def _park(parking: Parking) -> None:
        """Raise RequestParked when the request will come back; return when it will not
        (a dead letter, or a write Redis refused): the failure goes on to the errback."""
        if parking.final:
            # Nothing the write can answer changes what happens to the request, and
            # waiting for Redis would hold its downloader slot: a crawl of 404s
            # would run at the pace of the writes. The write is still tracked, so
            # the spider does not close before it lands.
            return
        outcome = await maybe_deferred_to_future(parking.outcome)
        if outcome.request_parked:
            raise parking.parked()
