"""Scrapy's own RetryMiddleware test cases, run with the add-on in its place.

Adapted from Scrapy's ``tests/test_downloadermiddleware_retry.py`` (RetryTest and
MaxRetryTimesTest): the same requests, failures and settings, against the real
Redis. Where docs/coming-from-retry.md says a behaviour is kept, the case asserts
Scrapy's own expectation; where it says the add-on differs, the case asserts
the documented difference. The one difference every case shares: a retry is
not returned at once (Scrapy returns the new request) but parked
(``RequestParked``) and re-injected when due, so "the next attempt" here is the
request the extension re-injects.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy import signals
from scrapy.http import Request, Response
from scrapy.settings.default_settings import RETRY_EXCEPTIONS
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from twisted.internet import defer
from twisted.internet.error import (
    ConnectError,
    ConnectionDone,
    ConnectionLost,
    DNSLookupError,
    TCPTimedOutError,
)
from twisted.web.client import ResponseFailed

from scrapy_retryqueue import RequestParked, RetryQueueExtension, RetryQueueMiddleware
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .reactorthread import ReactorThread
from .test_components import RecordingEngine, _send
from .waiting import wait_for

#: Every kind due at once, so a case walks through its retries in a second.
FAST = {"base_delay": 0.01, "max_delay": 0.02}
KINDS = ("timeout", "connection", "dns", "rate_limited", "server_error", "unknown")


class CaseSpider(scrapy.Spider):
    name = "cases"

    def parse(self, response: Response) -> Any:
        return None


class Node:
    """The add-on's downloader middleware and extension of one crawler, opened."""

    def __init__(self, crawler: Any, reactor: ReactorThread) -> None:
        self.crawler = crawler
        self.reactor = reactor
        self.engine = RecordingEngine()
        self.spider = crawler.spidercls.from_crawler(crawler)
        self.mw = build_from_crawler(RetryQueueMiddleware, crawler)
        self.ext = build_from_crawler(RetryQueueExtension, crawler)
        crawler.spider = self.spider
        crawler.engine = self.engine
        reactor.run(_send, crawler, signals.spider_opened, spider=self.spider)

    def close(self) -> None:
        self.reactor.run(
            _send, self.crawler, signals.spider_closed, spider=self.spider, reason="finished"
        )

    def stat(self, name: str) -> Any:
        return self.crawler.stats.get_value(name)

    def response(self, request: Request, status: int) -> Any:
        answer = Response(request.url, status=status, request=request)
        return self.reactor.run(self.mw.process_response, request=request, response=answer)

    def exception(self, request: Request, exc: Exception) -> Any:
        return self.reactor.run(self.mw.process_exception, request=request, exception=exc)

    def next_attempt(self, parked: RequestParked) -> Request:
        """The request the extension re-injects for a parked task, once it is due."""
        wait_for(
            lambda: any(
                r.meta.get("retryqueue_task", {}).get("id") == parked.task_id
                for r in self.engine.crawled
            ),
            "the retry to be re-injected",
            timeout=15,
        )
        again = next(
            r
            for r in self.engine.crawled
            if r.meta.get("retryqueue_task", {}).get("id") == parked.task_id
        )
        self.engine.crawled.remove(again)
        return again


@pytest.fixture
def node(
    reactor_thread: ReactorThread,
    redis_url: str,
    redis_client: Any,
    spider_name: str,
    tmp_path: Path,
) -> Iterator[Callable[..., Node]]:
    """``node(**settings)``: a crawler's components, opened; each node of a test has a
    queue of its own (otherwise one node's poll would claim the other's retries)."""
    opened: list[Node] = []

    def open_(**settings: Any) -> Node:
        name = f"{spider_name}n{len(opened)}"
        spidercls = type("CaseSpider", (CaseSpider,), {"name": name})
        fast = {kind: dict(FAST) for kind in KINDS}
        crawler = get_crawler(
            spidercls,
            {
                "RETRYQUEUE_REDIS_URL": redis_url,
                "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "embedded"),
                "RETRYQUEUE_POLL_INTERVAL": 0.05,
                "RETRYQUEUE_STORE_ENABLED": False,
                "RETRYQUEUE_POLICIES": fast,
                "LOGSTATS_INTERVAL": 0,
                **settings,
            },
        )
        running = Node(crawler, reactor_thread)
        opened.append(running)
        return running

    yield open_
    for running in opened:
        running.close()
        redis_client.delete(*all_keys(keys_for(running.spider.name)))


def _retries(node: Node, request: Request, fail: Callable[[Request], Any]) -> tuple[int, Any]:
    """Fail *request* until the add-on gives up: (retries it made, the final answer)."""
    retries = 0
    while True:
        try:
            answer = fail(request)
        except RequestParked as parked:
            request = node.next_attempt(parked)
            retries += 1
            # Kept: the next attempt carries Scrapy's count of retries so far.
            assert request.meta["retry_times"] == retries
            continue
        return retries, answer


# -- RetryTest ----------------------------------------------------------------------------


def test_503(node: Callable[..., Node]) -> None:
    """Kept: retried RETRY_TIMES times, then the response goes on; Scrapy's stats."""
    n = node(RETRY_TIMES=2)
    request = Request("http://www.scrapytest.org/503")
    retries, answer = _retries(n, request, lambda r: n.response(r, 503))
    assert retries == 2
    assert isinstance(answer, Response) and answer.status == 503
    assert n.stat("retry/max_reached") == 1
    assert n.stat("retry/reason_count/503 Service Unavailable") == 2
    assert n.stat("retry/count") == 2


def test_404(node: Callable[..., Node]) -> None:
    """Kept: a 404 is not retried and the response goes on. Differs (documented): it is
    also kept as a not_found dead letter."""
    n = node()
    request = Request("http://www.scrapytest.org/404")
    answer = n.response(request, 404)
    assert isinstance(answer, Response) and answer.status == 404
    wait_for(lambda: n.stat("retryqueue/dead/not_found") == 1, "the dead letter", timeout=10)
    assert n.stat("retry/count") is None


def test_dont_retry(node: Callable[..., Node]) -> None:
    """Kept: dont_retry leaves a 503 alone; dont_retry=False and a 200 pass through."""
    n = node()
    request = Request("http://www.scrapytest.org/503", meta={"dont_retry": True})
    assert n.response(request, 503).status == 503
    request = Request("http://www.scrapytest.org/503", meta={"dont_retry": False})
    assert n.response(request, 200).status == 200
    assert n.stat("retry/count") is None


def test_dont_retry_exc(node: Callable[..., Node]) -> None:
    """Kept."""
    n = node()
    request = Request("http://www.scrapytest.org/503", meta={"dont_retry": True})
    assert n.exception(request, DNSLookupError()) is None


def test_priority_adjust(node: Callable[..., Node]) -> None:
    """Differs (documented): Scrapy's default RETRY_PRIORITY_ADJUST (-1) is not applied;
    a project that sets it gets it, once per task."""
    n = node()
    request = Request("http://www.scrapytest.org/503")
    with pytest.raises(RequestParked) as parked:
        n.response(request, 503)
    assert n.next_attempt(parked.value).priority == request.priority

    adjusted = node(RETRY_PRIORITY_ADJUST=-1)
    request = Request("http://www.scrapytest.org/503?adjusted")
    with pytest.raises(RequestParked) as parked:
        adjusted.response(request, 503)
    assert adjusted.next_attempt(parked.value).priority < request.priority


TWISTED_ERRORS = [
    ConnectError,
    ConnectionDone,
    ConnectionLost,
    builtins.ConnectionRefusedError,
    defer.TimeoutError,
    DNSLookupError,
    ResponseFailed,
    TCPTimedOutError,
    builtins.TimeoutError,
]


def test_twistederrors(node: Callable[..., Node]) -> None:
    """Kept: each of Scrapy's retried exceptions is retried RETRY_TIMES times, then given
    up; Scrapy's stats, reasons named as Scrapy names them."""
    n = node(RETRY_TIMES=2)
    for exc in TWISTED_ERRORS:
        request = Request(f"http://www.scrapytest.org/{exc.__name__}")
        retries, answer = _retries(n, request, lambda r, e=exc: n.exception(r, e("foo")))
        assert (retries, answer) == (2, None), exc
    assert n.stat("retry/max_reached") == len(TWISTED_ERRORS)
    assert n.stat("retry/count") == len(TWISTED_ERRORS) * 2
    assert n.stat("retry/reason_count/twisted.internet.defer.TimeoutError") == 2


def test_exception_to_retry_added(node: Callable[..., Node]) -> None:
    """Kept: an exception added to RETRY_EXCEPTIONS is retried."""
    n = node(RETRY_EXCEPTIONS=[*RETRY_EXCEPTIONS, ValueError], RETRY_TIMES=2)
    request = Request("http://www.scrapytest.org/ValueError")
    retries, answer = _retries(n, request, lambda r: n.exception(r, ValueError("foo")))
    assert (retries, answer) == (2, None)


# -- MaxRetryTimesTest ----------------------------------------------------------------------

INVALID_URL = "http://www.scrapytest.org/invalid_url"


def _dns_retries(n: Node, request: Request) -> int:
    retries, answer = _retries(n, request, lambda r: n.exception(r, DNSLookupError("foo")))
    assert answer is None
    return retries


def test_with_settings_zero(node: Callable[..., Node]) -> None:
    """Kept."""
    assert _dns_retries(node(RETRY_TIMES=0), Request(INVALID_URL)) == 0


def test_with_metakey_zero(node: Callable[..., Node]) -> None:
    """Kept: max_retry_times = 0 is never retried (it was downloaded 4 times before)."""
    assert _dns_retries(node(), Request(INVALID_URL, meta={"max_retry_times": 0})) == 0


def test_without_metakey(node: Callable[..., Node]) -> None:
    """Kept: RETRY_TIMES = 5 gives five retries (the dns policy's own budget is 3)."""
    assert _dns_retries(node(RETRY_TIMES=5), Request(INVALID_URL)) == 5


def test_with_metakey_greater(node: Callable[..., Node]) -> None:
    """Kept: the meta key wins over RETRY_TIMES, upwards."""
    n = node(RETRY_TIMES=2)
    assert _dns_retries(n, Request(INVALID_URL, meta={"max_retry_times": 3})) == 3
    assert _dns_retries(n, Request(INVALID_URL + "?2")) == 2


def test_with_metakey_lesser(node: Callable[..., Node]) -> None:
    """Kept: the meta key wins over RETRY_TIMES, downwards."""
    n = node(RETRY_TIMES=5)
    assert _dns_retries(n, Request(INVALID_URL, meta={"max_retry_times": 4})) == 4
    assert _dns_retries(n, Request(INVALID_URL + "?2")) == 5


def test_with_dont_retry(node: Callable[..., Node]) -> None:
    """Kept."""
    meta = {"max_retry_times": 4, "dont_retry": True}
    assert _dns_retries(node(), Request(INVALID_URL, meta=meta)) == 0
