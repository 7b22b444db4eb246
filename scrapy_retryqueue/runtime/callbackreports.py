"""A callback's exception as people read it: a spider error, or a retry the project asked for.

An exception the callback did not mean (a parse error) that is parked for a
retry never reaches Scrapy (the spider middleware swallows it until the request
is given up), so it is told as Scrapy tells a spider error: counted in
``spider_exceptions/*``, signalled as ``spider_error`` and logged once per
request in Scrapy's own words, with its traceback, at WARNING since it will be
retried: the drop-in contract (DESIGN.md).

``RetryLater(kind)`` is no error but the project's own signal: its retry is one
line naming the kind, the URL and when it comes back, with no traceback, no
``spider_error`` and no ``spider_exceptions/*`` (``retryqueue/raised/<kind>``
counts it); a ``PermanentFailure`` is its dead letter's line (reporting.py).

:class:`CallbackReports` is a base of :class:`~.reporting.Reporter`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..decision.kinds import PARSE
from ..secure.redact import MASK
from .outcome import Outcome

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ..config import Config
    from .planner import Plan

#: The reporter's logger: its lines keep the name they had before it was split.
logger = logging.getLogger(f"{__package__}.reporting")


class CallbackReports:
    """A callback's exception, told; only ever a base of Reporter, whose count it calls."""

    # Set up by Reporter.__init__.
    crawler: Crawler
    config: Config
    spider: Any

    def callback_error(
        self,
        exception: BaseException,
        response: Any,
        *,
        first: bool,
        due_in: float,
        kind: str = PARSE,
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
            entry["msg"] + "; parked for a retry (%(retry_kind)s) due in %(due_in).0fs",
            {**args, "retry_kind": kind, "due_in": due_in},
            exc_info=(type(exception), exception, exception.__traceback__),
            extra={"spider": self.spider},
        )

    def asked(self, plan: Plan, outcome: Outcome) -> None:
        """A retry the callback asked for (``RetryLater``), parked or spooled: one line
        that names its kind, the URL and when it comes back.

        INFO for the request's first retry of that kind, DEBUG for the next ones,
        as a parked callback error is logged once per request: a site that serves
        thousands of captchas must not bury the log. The stats count every one.
        """
        decision = plan.decision
        level = logging.INFO if decision.attempt <= 1 else logging.DEBUG
        if not logger.isEnabledFor(level):
            return
        logger.log(
            level,
            "scrapy-retryqueue: the callback of %s asked for a retry later (%s); %s, due in %.1fs%s",
            plan.task.url,
            plan.failure.message,
            decision.reason,
            decision.delay,
            " (spooled while Redis is down)" if outcome is Outcome.SPOOLED else "",
        )
