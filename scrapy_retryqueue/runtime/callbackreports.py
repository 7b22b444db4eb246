"""A callback's exception parked for a retry, told as Scrapy tells a spider error.

Scrapy never sees such an exception (the spider middleware swallows it until the
request is given up), so it is counted in ``spider_exceptions/*``, signalled as
``spider_error`` and logged once per request in Scrapy's own words, with its
traceback, at WARNING since it will be retried: the drop-in contract (DESIGN.md).

:class:`CallbackReports` is a base of :class:`~.reporting.Reporter`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..secure.redact import MASK

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ..config import Config

#: The reporter's logger: its lines keep the name they had before it was split.
logger = logging.getLogger(f"{__package__}.reporting")


class CallbackReports:
    """A parked callback error, told; only ever a base of Reporter, whose count it calls."""

    # Set up by Reporter.__init__.
    crawler: Crawler
    config: Config
    spider: Any

    def callback_error(
        self, exception: BaseException, response: Any, *, first: bool, due_in: float
    ) -> None:
        """A callback's exception that was parked for a retry instead of reaching Scrapy.

        Counted and signalled as Scrapy would; logged once per request, with its
        traceback and Scrapy's own wording, at WARNING since it will be retried.
        """
        from scrapy import signals
        from twisted.python.failure import Failure

        self.count("spider_exceptions/count")
        self.count(f"spider_exceptions/{type(exception).__name__}")
        failure = Failure(exception, type(exception), exception.__traceback__)
        self.crawler.signals.send_catch_log(
            signal=signals.spider_error, failure=failure, response=response, spider=self.spider
        )
        if not first:
            logger.debug(
                "scrapy-retryqueue: %s raised %s again; parked for retry",
                response.request,
                type(exception).__name__,
            )
            return
        entry = self.crawler.logformatter.spider_error(
            failure, response.request, response, self.spider
        )
        args = dict(entry["args"])
        if "referer" in self.config.secret_headers and args.get("referer") is not None:
            # The one header Scrapy's wording shows; masked when named secret.
            args["referer"] = MASK
        logging.getLogger("scrapy.core.scraper").warning(
            entry["msg"] + "; parked for a retry (parse) due in %(due_in).0fs",
            {**args, "due_in": due_in},
            exc_info=(type(exception), exception, exception.__traceback__),
            extra={"spider": self.spider},
        )
