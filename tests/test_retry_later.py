"""A callback's RetryLater and PermanentFailure are the project's signals, not crashes.

They are parked or dead-lettered as their kind and told in the add-on's own line
(the kind, the URL, when it comes back), with no traceback, no ``spider_error``
and no ``spider_exceptions/*``; any other callback exception keeps Scrapy's
report. The reporter is tested without a server; the spider middleware on the
real Redis, in-process as tests/test_components.py does, and through Scrapy's
own spider middleware manager for a generator callback that raises midway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy import signals
from scrapy.http import HtmlResponse, Request

from scrapy_retryqueue import PermanentFailure, RetryLater
from scrapy_retryqueue.decision.classify import failure_for_kind
from scrapy_retryqueue.runtime import Outcome

from .runtimes import unopened_runtime
from .test_components import LATER, PAGE, Running, open_components
from .waiting import wait_for

__all__ = ["open_components"]  # the fixture, shared with tests/test_components.py

CAPTCHA = {"retry": True, "base_delay": 1.0, "max_delay": 5.0, "max_retries": 3, "jitter": "none"}


class AskingSpider(scrapy.Spider):
    name = "asking"

    def parse(self, response: Any) -> None:
        pass


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("scrapy")]


# -- the reporter's lines (no server) -------------------------------------------------


def test_a_retry_later_is_one_info_line_naming_its_kind_its_url_and_when_it_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = unopened_runtime(AskingSpider, tmp_path, RETRYQUEUE_KINDS={"captcha": CAPTCHA})
    failure = failure_for_kind("captcha", RetryLater("captcha", "the site served a captcha"))
    plan = runtime.planner.plan(Request(PAGE), failure, asked=True)
    assert plan.asked
    with caplog.at_level(logging.DEBUG):
        runtime.reporter.notes(plan.notes)
        runtime.reporter.planned(plan, Outcome.PARKED)
    [line] = _lines(caplog)
    assert line.levelno == logging.INFO and line.exc_info is None
    assert line.getMessage() == (
        f"scrapy-retryqueue: the callback of {PAGE} asked for a retry later (the site served "
        "a captcha); captcha: retry 1 of 3, due in 1.0s"
    )
    stats = runtime.crawler.stats
    assert stats.get_value("retryqueue/raised/captcha") == 1
    assert stats.get_value("retryqueue/scheduled/captcha") == 1
    assert not [k for k in stats.get_stats() if k.startswith("spider_exceptions/")]

    # The next retries of the request: DEBUG, as a parked callback error's are; and a
    # write spooled while Redis is down says so.
    caplog.clear()
    again = replace(plan, decision=replace(plan.decision, attempt=2))
    with caplog.at_level(logging.DEBUG):
        runtime.reporter.planned(again, Outcome.PARKED)
        runtime.reporter.planned(plan, Outcome.SPOOLED)
    assert [(r.levelno, "asked for a retry later" in r.getMessage()) for r in _lines(caplog)] == [
        (logging.DEBUG, True),
        (logging.INFO, True),
    ]
    assert _lines(caplog)[1].getMessage().endswith("due in 1.0s (spooled while Redis is down)")


def test_a_permanent_failure_is_its_dead_letters_line_with_its_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = unopened_runtime(AskingSpider, tmp_path)
    failure = failure_for_kind("rule", PermanentFailure("out of scope"))
    plan = runtime.planner.plan(Request(PAGE), failure, asked=True)
    with caplog.at_level(logging.DEBUG):
        runtime.reporter.notes(plan.notes)
        runtime.reporter.planned(plan, Outcome.DEAD)
    [line] = _lines(caplog)
    assert line.levelno == logging.INFO and line.exc_info is None  # the rule kind's level
    assert line.getMessage() == (
        f"scrapy-retryqueue: dead letter {PAGE} (rule: not retried by policy; out of scope)"
    )
    assert runtime.crawler.stats.get_value("retryqueue/raised/rule") == 1
    assert runtime.crawler.stats.get_value("retryqueue/dead/rule") == 1


def test_a_failure_not_raised_on_purpose_is_not_asked(tmp_path: Path) -> None:
    runtime = unopened_runtime(AskingSpider, tmp_path, RETRYQUEUE_KINDS={"captcha": CAPTCHA})
    parse = runtime.planner.plan(Request(PAGE), failure_for_kind("parse", ValueError("x")))
    # A kind nobody declared is a bug of the spider: Scrapy reports it (not asked).
    typo = failure_for_kind("capcha", RetryLater("capcha"))
    undeclared = runtime.planner.plan(Request(PAGE), typo, asked=True)
    assert not parse.asked and not undeclared.asked
    assert "retryqueue/raised/capcha" not in [n.stat for n in undeclared.notes]


# -- the spider middleware (the real Redis, in-process) ----------------------------------


@pytest.fixture
def spider_errors() -> list[Any]:
    return []


def _open(
    open_components: Callable[..., Running], spider_errors: list[Any], **settings: Any
) -> Running:
    running = open_components(RETRYQUEUE_KINDS={"captcha": {**CAPTCHA, **LATER}}, **settings)
    running.crawler.signals.connect(
        lambda failure, **_: spider_errors.append(failure.value),
        signal=signals.spider_error,
        weak=False,
    )
    return running


def _wait_line(caplog: pytest.LogCaptureFixture, text: str) -> logging.LogRecord:
    wait_for(lambda: any(text in r.getMessage() for r in caplog.records), repr(text), timeout=10)
    return next(r for r in caplog.records if text in r.getMessage())


def test_retry_later_from_a_callback_is_no_spider_error_and_a_parse_error_still_is(
    open_components: Callable[..., Running],
    spider_errors: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = _open(open_components, spider_errors)
    request = Request(PAGE, callback=running.spider.parse)
    with caplog.at_level(logging.INFO):
        assert running.callback_error(request, RetryLater("captcha", "a captcha page")) == []
        line = _wait_line(caplog, "asked for a retry later")
    assert line.levelno == logging.INFO and line.exc_info is None
    assert PAGE in line.getMessage() and "captcha: retry 1 of 3" in line.getMessage()
    assert "due in 3600.0s" in line.getMessage()
    assert running.stat("retryqueue/raised/captcha") == 1
    assert running.stat("retryqueue/scheduled/captcha") == 1
    assert running.stat("spider_exceptions/count") is None
    assert running.stat("spider_exceptions/RetryLater") is None
    assert spider_errors == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]

    # A genuine error of a callback keeps Scrapy's report (drop-in contract).
    other = Request(f"{PAGE}?other", callback=running.spider.parse)
    with caplog.at_level(logging.INFO):
        assert running.callback_error(other, ValueError("no title")) == []
    assert [type(e) for e in spider_errors] == [ValueError]
    assert running.stat("spider_exceptions/ValueError") == 1
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.exc_info is not None and "(parse)" in warning.getMessage()


def test_permanent_failure_from_a_callback_is_its_dead_letter_line_only(
    open_components: Callable[..., Running],
    spider_errors: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = _open(open_components, spider_errors)
    request = Request(PAGE, callback=running.spider.parse)
    with caplog.at_level(logging.INFO):
        assert running.callback_error(request, PermanentFailure("out of scope")) == []
        line = _wait_line(caplog, "dead letter")
    assert line.getMessage().endswith("(rule: not retried by policy; out of scope)")
    assert line.exc_info is None
    assert running.stat("retryqueue/dead/rule") == 1
    assert running.stat("spider_exceptions/PermanentFailure") is None
    assert spider_errors == []


def test_retry_later_of_an_undeclared_kind_goes_on_to_scrapy(
    open_components: Callable[..., Running], spider_errors: list[Any]
) -> None:
    running = _open(open_components, spider_errors)
    request = Request(PAGE, callback=running.spider.parse)
    # A bug of the spider: dead-lettered as unknown, and Scrapy reports the exception.
    assert running.callback_error(request, RetryLater("capcha")) is None
    running.wait_stat("retryqueue/dead/unknown", 1)
    assert running.stat("retryqueue/undeclared_kind") == 1
    assert running.stat("retryqueue/raised/capcha") is None


def test_items_a_generator_yielded_before_its_retry_later_go_on(
    open_components: Callable[..., Running], spider_errors: list[Any]
) -> None:
    # Through Scrapy's own spider middleware manager, as its scraper calls it: the
    # exception is handled (nothing reaches the scraper to report) and what the
    # callback yielded before it raised comes out.
    from scrapy.core.spidermw import SpiderMiddlewareManager

    running = _open(open_components, spider_errors)
    manager = SpiderMiddlewareManager(running.spider_middleware, crawler=running.crawler)
    request = Request(PAGE, callback=running.spider.parse)
    page = HtmlResponse(PAGE, body=b"<html></html>", request=request)

    def callback(response: Any) -> Iterator[dict[str, int]]:
        yield {"n": 1}
        yield {"n": 2}
        raise RetryLater("captcha", "a captcha after two items")

    async def scrape(response: Any, request: Request) -> Iterator[dict[str, int]]:
        return callback(response)

    async def output() -> list[Any]:
        chain = await manager.scrape_response_async(scrape, page, request)
        return [item async for item in chain]

    assert running.reactor.run(output) == [{"n": 1}, {"n": 2}]
    running.wait_stat("retryqueue/scheduled/captcha", 1)
    assert running.stat("retryqueue/raised/captcha") == 1
    assert spider_errors == []
