"""Spider middleware: an exception raised by a callback becomes a failure of its kind.

A parse failure that will be retried is swallowed (the callback runs again on
the re-fetched page later), but still counted in ``spider_exceptions/*`` and
logged once per request with its traceback; one that is given up propagates,
so Scrapy logs it as usual.

``RetryLater(kind)`` and ``PermanentFailure`` (kind ``rule``) are the project's
own signals, not errors: parked or dead-lettered as their kind, whatever comes
of them they end here, told in the add-on's own line (no traceback, no
``spider_error``, no ``spider_exceptions/*``). Items the callback yielded before
it raised have gone on already. A ``RetryLater`` of a kind the crawl does not
know is a bug of the spider: dead-lettered as ``unknown``, and Scrapy reports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from scrapy.spidermiddlewares.httperror import HttpError

from ..decision import kinds
from ..decision.classify import failure_for_kind
from ..exceptions import PermanentFailure, RetryLater
from ..runtime import RetryQueueRuntime, runtime_for

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response


class RetryQueueSpiderMiddleware:
    def __init__(self, runtime: RetryQueueRuntime) -> None:
        self.runtime = runtime

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RetryQueueSpiderMiddleware:
        return cls(runtime_for(crawler))

    def process_spider_exception(
        self, response: Response, exception: Exception, spider: Spider | None = None
    ) -> Iterable[Any] | None:
        # HTTP statuses were judged by the downloader middleware already.
        request = response.request
        if isinstance(exception, (HttpError, IgnoreRequest)) or request is None:
            return None
        if request.meta.get("dont_retry", False):
            return None
        asked = isinstance(exception, (RetryLater, PermanentFailure))
        if isinstance(exception, RetryLater):
            kind = exception.kind
        elif isinstance(exception, PermanentFailure):
            kind = kinds.RULE
        else:
            kind = kinds.PARSE
        parking = self.runtime.park(request, failure_for_kind(kind, exception), asked=asked)
        if parking.asked:
            # An iterable ends the exception here: Scrapy's scraper neither logs it
            # nor sends spider_error; the reporter tells it when its write lands.
            return []
        if not parking.retry:
            return None  # given up: Scrapy logs it, with its traceback, and counts it
        self.runtime.callback_error(
            exception, response, first=parking.attempt == 1, due_in=parking.delay, kind=kind
        )
        return []
