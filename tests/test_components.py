"""The add-on, the middlewares and the extension in-process, as Scrapy tests its own.

Each test builds a crawler with Scrapy's test helpers (``get_crawler``,
``build_from_crawler``), opens the components with the ``spider_opened``
signal, hands them Scrapy's own ``Request`` / ``Response`` objects, and
checks what a user can see: the exception or response they return, the
crawl's stats, what is in Redis, the log. No subprocess, no log parsing, and
nothing private of the package: these tests hold across internal redesigns.

The components run on the session's reactor thread (``reactor_thread``), as
in a crawl; the real Redis holds their writes, in a namespace of each test's
own (``spider_name``). The engine is a stand-in that records what the
extension re-injects.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import scrapy
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.http import HtmlResponse, Request, Response
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from twisted.internet.error import TimeoutError as TwistedTimeoutError
from twisted.python.failure import Failure

from scrapy_retryqueue import (
    Addon,
    ConfigError,
    PermanentFailure,
    RequestParked,
    RetryQueueExtension,
    RetryQueueMiddleware,
    RetryQueueSpiderMiddleware,
)
from scrapy_retryqueue import signals as rq_signals
from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.settings import defaults

from .reactorthread import ReactorThread
from .waiting import wait_for

#: Retries due almost at once, so a test sees one come back.
FAST = {"base_delay": 0.05, "max_delay": 0.1}
#: Retries due in an hour: parked, and not re-injected while the test runs.
LATER = {"base_delay": 3600, "max_delay": 3600}
PAGE = "http://shop.test/page/1"


class ComponentSpider(scrapy.Spider):
    name = "components"  # replaced by the test's own name (spider_name)

    def parse(self, response: Response) -> Any:
        return None


class EngineSlot:
    """The part of Scrapy's engine slot the add-on reads: the requests not finished."""

    def __init__(self) -> None:
        self.inprogress: set[Request] = set()


class RecordingEngine:
    """Stands in for the crawl's engine: records the requests re-injected into it, and
    holds those a test says it works on (downloading, or in its callback and pipelines)."""

    def __init__(self) -> None:
        self.crawled: list[Request] = []
        self._slot = EngineSlot()

    def crawl(self, request: Request) -> None:
        self.crawled.append(request)

    def start(self, request: Request) -> None:
        self._slot.inprogress.add(request)

    def finish(self, request: Request) -> None:
        self._slot.inprogress.discard(request)


@dataclass
class Running:
    """One crawler's retry-queue components, opened as at the start of a crawl."""

    crawler: Crawler
    spider: scrapy.Spider
    engine: RecordingEngine
    middleware: RetryQueueMiddleware
    spider_middleware: RetryQueueSpiderMiddleware
    extension: RetryQueueExtension
    reactor: ReactorThread
    #: Set by close(): the engine sends spider_closed once, so the fixture must not again.
    closed: bool = False

    def close(self, reason: str = "finished") -> None:
        """Send spider_closed as the engine does at the end of the crawl."""
        self.closed = True
        self.reactor.run(
            _send, self.crawler, signals.spider_closed, spider=self.spider, reason=reason
        )

    def stat(self, name: str) -> Any:
        assert self.crawler.stats is not None
        return self.crawler.stats.get_value(name)

    def wait_stat(self, name: str, value: Any) -> None:
        wait_for(lambda: self.stat(name) == value, f"stats[{name!r}] == {value!r}", timeout=10)

    def response(self, request: Request, status: int) -> Any:
        """What process_response makes of *request* answered with *status*."""
        answer = Response(request.url, status=status, request=request)
        return self.reactor.run(self.middleware.process_response, request=request, response=answer)

    def exception(self, request: Request, exception: Exception) -> Any:
        return self.reactor.run(
            self.middleware.process_exception, request=request, exception=exception
        )

    def callback_error(self, request: Request, exception: Exception) -> Any:
        """What the spider middleware makes of *exception* raised by the callback."""
        page = HtmlResponse(request.url, body=b"<html></html>", request=request)
        return self.reactor.run(
            self.spider_middleware.process_spider_exception, response=page, exception=exception
        )


async def _send(crawler: Crawler, signal: object, **kwargs: Any) -> None:
    """Send a signal as the engine does; a handler's failure fails the test."""
    manager = crawler.signals
    if hasattr(manager, "send_catch_log_async"):
        results = await manager.send_catch_log_async(signal, **kwargs)
    else:  # Scrapy < 2.14
        from scrapy.utils.defer import maybe_deferred_to_future

        results = await maybe_deferred_to_future(manager.send_catch_log_deferred(signal, **kwargs))
    for receiver, result in results:
        # send_catch_log_async (Scrapy 2.14+) gives the exception itself, the
        # Deferred form a Failure: either is a handler that failed.
        error = result.value if isinstance(result, Failure) else result
        if isinstance(error, BaseException):
            raise AssertionError(f"{receiver} failed") from error


def _settings(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    return {
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "embedded"),
        "RETRYQUEUE_NODE_ID": "components",
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        # Dead letters stay in Redis, where these tests read them.
        "RETRYQUEUE_STORE_ENABLED": False,
        "LOGSTATS_INTERVAL": 0,
        **settings,
    }


@pytest.fixture
def open_components(
    reactor_thread: ReactorThread, redis_url: str, spider_name: str, tmp_path: Path
) -> Iterator[Callable[..., Running]]:
    """``open_components(**settings)``: the components of a new crawler, opened;
    closed (spider_closed) at the end of the test, so their worker thread stops."""
    opened: list[Running] = []

    def open_(**settings: Any) -> Running:
        spidercls = type("ComponentSpider", (ComponentSpider,), {"name": spider_name})
        crawler = get_crawler(
            spidercls, _settings(tmp_path, RETRYQUEUE_REDIS_URL=redis_url, **settings)
        )
        running = Running(
            crawler=crawler,
            spider=spidercls.from_crawler(crawler),
            engine=RecordingEngine(),
            middleware=build_from_crawler(RetryQueueMiddleware, crawler),
            spider_middleware=build_from_crawler(RetryQueueSpiderMiddleware, crawler),
            extension=build_from_crawler(RetryQueueExtension, crawler),
            reactor=reactor_thread,
        )
        crawler.spider = running.spider
        crawler.engine = running.engine  # type: ignore[assignment]
        reactor_thread.run(_send, crawler, signals.spider_opened, spider=running.spider)
        opened.append(running)
        return running

    yield open_
    for running in opened:
        if not running.closed:
            running.close()


def _envelope(client: redis.Redis, key: str, task_id: str) -> dict[str, Any]:
    raw = client.hget(key, task_id)
    assert raw is not None, f"no envelope of {task_id} in {key}"
    return json.loads(raw)


# -- the add-on ------------------------------------------------------------------------


def _enabled(manager_cls: Any, crawler: Crawler) -> list[type]:
    """The classes of the components Scrapy builds for *crawler*, as a crawl would."""
    return [type(mw) for mw in manager_cls.from_crawler(crawler).middlewares]


def test_the_addon_swaps_scrapys_retry_middleware_for_ours(tmp_path: Path) -> None:
    from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
    from scrapy.core.spidermw import SpiderMiddlewareManager

    crawler = get_crawler(ComponentSpider, _settings(tmp_path, ADDONS={Addon: 0}))
    downloader = _enabled(DownloaderMiddlewareManager, crawler)
    assert RetryQueueMiddleware in downloader
    assert RetryMiddleware not in downloader
    assert RetryQueueSpiderMiddleware in _enabled(SpiderMiddlewareManager, crawler)
    assert RetryQueueExtension in [type(ext) for ext in crawler.extensions.middlewares]


def test_a_disabled_addon_leaves_scrapys_retry_middleware(tmp_path: Path) -> None:
    from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
    from scrapy.core.spidermw import SpiderMiddlewareManager

    crawler = get_crawler(
        ComponentSpider, _settings(tmp_path, ADDONS={Addon: 0}, RETRYQUEUE_ENABLED=False)
    )
    downloader = _enabled(DownloaderMiddlewareManager, crawler)
    assert RetryMiddleware in downloader
    assert RetryQueueMiddleware not in downloader
    assert RetryQueueSpiderMiddleware not in _enabled(SpiderMiddlewareManager, crawler)
    assert RetryQueueExtension not in [type(ext) for ext in crawler.extensions.middlewares]


def test_the_addon_keeps_retried_statuses_out_of_the_http_cache(tmp_path: Path) -> None:
    crawler = get_crawler(
        ComponentSpider,
        _settings(
            tmp_path, ADDONS={Addon: 0}, HTTPCACHE_IGNORE_HTTP_CODES=[301], RETRY_HTTP_CODES=[418]
        ),
    )
    codes = crawler.settings.getlist("HTTPCACHE_IGNORE_HTTP_CODES")
    # The project's own stays; what a retry follows is added (418: the project's RETRY_HTTP_CODES).
    assert codes[0] == 301
    assert {429, 500, 503, 418} <= set(codes)
    # What is not retried may be cached, as before.
    assert 404 not in codes and 200 not in codes


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("RETRYQUEUE_POLL_INTERVAL", -1),
        ("RETRYQUEUE_POLICIES", {"timout": {}}),
        ("RETRYQUEUE_REDIS_URL", "http://cache:6379"),
    ],
)
def test_a_bad_setting_is_one_error_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, setting: str, value: Any
) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(ConfigError, match=setting):
        get_crawler(ComponentSpider, _settings(tmp_path, ADDONS={Addon: 0}, **{setting: value}))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert setting in errors[0].getMessage()


# -- the downloader middleware -------------------------------------------------------------


def test_a_503_is_parked_as_a_server_error(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"server_error": LATER})
    request = Request(PAGE)
    with pytest.raises(RequestParked) as parked:
        running.response(request, 503)
    assert parked.value.kind == "server_error"
    running.wait_stat("retryqueue/scheduled", 1)
    assert running.stat("retryqueue/scheduled/server_error") == 1
    keys = keys_for(spider_name)
    envelope = _envelope(redis_client, keys.tasks, parked.value.task_id)
    assert envelope["request"]["url"] == PAGE
    assert envelope["attempts"] == {"server_error": 1}
    assert redis_client.zscore(keys.due, parked.value.task_id) is not None


def test_only_the_projects_own_meta_travels_with_a_retry(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"server_error": LATER}, DOWNLOAD_TIMEOUT=30)
    keys = keys_for(spider_name)
    # As Scrapy's middlewares leave it: DownloadTimeoutMiddleware's default, a proxy
    # HttpProxyMiddleware took from the environment (it marks it _scheme_proxy).
    scrapys = Request(
        PAGE,
        meta={"download_timeout": 30.0, "proxy": "http://env-proxy:3128", "_scheme_proxy": True},
    )
    with pytest.raises(RequestParked) as parked:
        running.response(scrapys, 503)
    meta = _envelope(redis_client, keys.tasks, parked.value.task_id)["request"].get("meta", {})
    assert "download_timeout" not in meta and "proxy" not in meta
    # What the project set itself stays: its own timeout, its own proxy, its own keys.
    own = Request(
        PAGE + "?own",
        meta={"download_timeout": 5, "proxy": "http://mine:8080", "depth": 2, "page": 7},
    )
    with pytest.raises(RequestParked) as parked:
        running.response(own, 503)
    meta = _envelope(redis_client, keys.tasks, parked.value.task_id)["request"]["meta"]
    assert meta == {"download_timeout": 5, "proxy": "http://mine:8080", "depth": 2, "page": 7}


def test_a_404_is_dead_lettered_and_the_response_goes_on(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components()
    request = Request(PAGE)
    answer = running.response(request, 404)
    assert isinstance(answer, Response) and answer.status == 404
    running.wait_stat("retryqueue/dead/not_found", 1)
    keys = keys_for(spider_name)
    (task_id,) = redis_client.zrange(keys.dead, 0, -1)
    envelope = _envelope(redis_client, keys.deadtasks, task_id.decode())
    assert envelope["request"]["url"] == PAGE
    assert envelope["dead_kind"] == "not_found"
    assert redis_client.hlen(keys.tasks) == 0


def test_a_200_passes_through_untouched(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components()
    request = Request(PAGE)
    answer = Response(PAGE, status=200, request=request)
    result = running.reactor.run(
        running.middleware.process_response, request=request, response=answer
    )
    assert result is answer
    keys = keys_for(spider_name)
    assert redis_client.hlen(keys.tasks) == redis_client.zcard(keys.dead) == 0
    assert running.stat("retryqueue/scheduled") is None


def test_a_timeout_is_parked_as_a_timeout(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"timeout": LATER})
    with pytest.raises(RequestParked) as parked:
        running.exception(Request(PAGE), TwistedTimeoutError())
    assert parked.value.kind == "timeout"
    running.wait_stat("retryqueue/scheduled/timeout", 1)
    envelope = _envelope(redis_client, keys_for(spider_name).tasks, parked.value.task_id)
    assert envelope["request"]["url"] == PAGE


def test_dont_retry_leaves_the_failure_alone(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components()
    request = Request(PAGE, meta={"dont_retry": True})
    answer = running.response(request, 503)
    assert isinstance(answer, Response) and answer.status == 503
    assert running.exception(request, TwistedTimeoutError()) is None
    keys = keys_for(spider_name)
    assert redis_client.hlen(keys.tasks) == redis_client.zcard(keys.dead) == 0
    assert running.stat("retryqueue/scheduled") is None
    assert running.stat("retryqueue/dead") is None


def test_robots_txt_and_media_downloads_get_stock_retries(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    from scrapy.http.request import NO_CALLBACK

    running = open_components(RETRY_TIMES=2)
    robots = Request("http://shop.test/robots.txt", callback=NO_CALLBACK)
    # Not parked (its caller awaits the download): retried at once, as stock does.
    again = running.response(robots, 503)
    assert isinstance(again, Request) and again.url == robots.url
    assert again.meta["retry_times"] == 1
    again = running.exception(again, TwistedTimeoutError())
    assert isinstance(again, Request) and again.meta["retry_times"] == 2
    # RETRY_TIMES reached: the failure goes on, as stock gives it up.
    answer = running.response(again, 503)
    assert isinstance(answer, Response) and answer.status == 503
    assert running.stat("retry/count") == 2
    assert running.stat("retry/max_reached") == 1
    # dont_retry: no retry, as with stock.
    plain = Request("http://shop.test/image.png", callback=NO_CALLBACK, meta={"dont_retry": True})
    assert running.response(plain, 503).status == 503
    keys = keys_for(spider_name)
    assert redis_client.hlen(keys.tasks) == redis_client.zcard(keys.dead) == 0


def test_without_stock_retries_robots_txt_is_not_retried(
    open_components: Callable[..., Running],
) -> None:
    from scrapy.http.request import NO_CALLBACK

    running = open_components(RETRY_ENABLED=False)
    robots = Request("http://shop.test/robots.txt", callback=NO_CALLBACK)
    assert running.response(robots, 503).status == 503
    assert running.exception(robots, TwistedTimeoutError()) is None


def test_a_failure_answered_from_the_http_cache_is_asked_of_the_site(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"server_error": LATER})
    request = Request(PAGE)
    cached = Response(PAGE, status=503, request=request, flags=["cached"])
    again = running.reactor.run(
        running.middleware.process_response, request=request, response=cached
    )
    # At once, past the cache, and no attempt counted.
    assert isinstance(again, Request) and again.url == PAGE
    assert again.meta["dont_cache"] is True and again.dont_filter
    assert running.stat("retryqueue/cache_bypassed") == 1
    assert redis_client.hlen(keys_for(spider_name).tasks) == 0
    # The site's own 503 is a failure as usual.
    with pytest.raises(RequestParked):
        running.response(again, 503)


# -- the spider middleware ---------------------------------------------------------------


def test_a_callback_error_becomes_a_parse_retry(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"parse": LATER})
    request = Request(PAGE, callback=running.spider.parse)
    assert running.callback_error(request, ValueError("no title on the page")) == []
    running.wait_stat("retryqueue/scheduled/parse", 1)
    keys = keys_for(spider_name)
    (task_id,) = redis_client.hkeys(keys.tasks)
    envelope = _envelope(redis_client, keys.tasks, task_id.decode())
    assert envelope["request"]["url"] == PAGE
    assert envelope["last_error"]["kind"] == "parse"
    assert "no title on the page" in envelope["last_error"]["message"]


def test_permanent_failure_in_a_callback_is_a_rule_dead_letter(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components()
    request = Request(PAGE, callback=running.spider.parse)
    # Raised on purpose: told by its dead letter's line, not as a spider error
    # (tests/test_retry_later.py).
    assert running.callback_error(request, PermanentFailure("out of scope")) == []
    running.wait_stat("retryqueue/dead/rule", 1)
    keys = keys_for(spider_name)
    (task_id,) = redis_client.zrange(keys.dead, 0, -1)
    envelope = _envelope(redis_client, keys.deadtasks, task_id.decode())
    assert envelope["dead_kind"] == "rule"
    assert envelope["last_error"]["message"] == "out of scope"
    assert redis_client.hlen(keys.tasks) == 0


# -- the extension ---------------------------------------------------------------------------


def test_a_due_retry_is_reinjected_and_its_success_acks_it(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"server_error": FAST})
    recovered: list[dict[str, Any]] = []
    running.crawler.signals.connect(
        lambda **kw: recovered.append(kw), signal=rq_signals.retryqueue_recovered, weak=False
    )
    with pytest.raises(RequestParked) as parked:
        running.response(Request(PAGE), 503)
    keys = keys_for(spider_name)
    task_id = parked.value.task_id
    envelope = json.loads(redis_client.hget(keys.tasks, task_id))
    # The resolved budget of the kind that failed travels with the task.
    assert envelope["max_retries"] == kinds.POLICIES["server_error"]["max_retries"]
    wait_for(lambda: running.engine.crawled, "the retry to be re-injected", timeout=10)
    (again,) = running.engine.crawled
    assert again.url == PAGE
    assert again.dont_filter  # the dupefilter saw this URL already
    assert again.meta["dont_cache"] is True  # the HTTP cache would answer the failure again
    running.wait_stat("retryqueue/reinjected", 1)
    assert redis_client.zscore(keys.leased, parked.value.task_id) is not None
    # The retry succeeds: its task is done and leaves Redis.
    assert running.response(again, 200).status == 200
    running.wait_stat("retryqueue/recovered", 1)
    wait_for(
        lambda: not redis_client.hexists(keys.tasks, parked.value.task_id),
        "the task to be acked",
        timeout=10,
    )
    assert redis_client.zcard(keys.due) == redis_client.zcard(keys.leased) == 0
    assert not redis_client.hexists(keys.taskinfo, task_id)
    # What a learning backoff needs: how long it took since the first failure, and where.
    [signal] = recovered
    assert signal["domain"] == "shop.test"
    assert 0 <= signal["wait_ms"] < 10_000
    [succeeded] = [f for _, f in redis_client.xrange(keys.events) if f[b"type"] == b"succeeded"]
    assert succeeded[b"domain"] == b"shop.test"
    assert int(succeeded[b"wait"]) == signal["wait_ms"]


def _reinjected(running: Running, status: int = 503) -> tuple[Request, str]:
    """A request failed with *status*, parked, and re-injected: the retry and its task id."""
    with pytest.raises(RequestParked) as parked:
        running.response(Request(PAGE, callback=running.spider.parse), status)
    wait_for(lambda: running.engine.crawled, "the retry to be re-injected", timeout=10)
    (again,) = running.engine.crawled
    return again, parked.value.task_id


def _event_types(client: redis.Redis, spider_name: str) -> list[bytes]:
    return [f[b"type"] for _, f in client.xrange(keys_for(spider_name).events)]


#: Long enough for several polls (RETRYQUEUE_POLL_INTERVAL 0.1): what one would have
#: acknowledged has been by then. Fewer polls on a loaded machine make the check
#: weaker, never wrong.
SEVERAL_POLLS = 1.0


def test_a_retry_is_acknowledged_once_the_engine_has_finished_its_page(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"server_error": FAST})
    again, task_id = _reinjected(running)
    keys = keys_for(spider_name)
    running.engine.start(again)
    assert running.response(again, 200).status == 200
    # Its callback and items are still to come: a node killed now must leave the task
    # to another node, so the lease holds through the polls.
    time.sleep(SEVERAL_POLLS)
    assert redis_client.zscore(keys.leased, task_id) is not None
    assert running.stat("retryqueue/recovered") is None
    running.engine.finish(again)
    running.wait_stat("retryqueue/recovered", 1)
    wait_for(lambda: not redis_client.hexists(keys.tasks, task_id), "the ack", timeout=10)
    assert redis_client.zcard(keys.leased) == 0
    assert _event_types(redis_client, spider_name).count(b"succeeded") == 1


def test_a_callback_failing_after_its_retry_downloaded_reschedules_the_same_task(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(RETRYQUEUE_POLICIES={"server_error": FAST, "parse": LATER})
    again, task_id = _reinjected(running)
    keys = keys_for(spider_name)
    running.engine.start(again)
    assert running.response(again, 200).status == 200
    assert running.callback_error(again, ValueError("no title on the page")) == []
    running.wait_stat("retryqueue/scheduled/parse", 1)
    running.engine.finish(again)
    time.sleep(SEVERAL_POLLS)
    # Under its lease: one task, both failures in its history, never recovered.
    assert redis_client.hkeys(keys.tasks) == [task_id.encode()]
    assert redis_client.zscore(keys.due, task_id) is not None
    assert _envelope(redis_client, keys.tasks, task_id)["attempts"] == {
        "server_error": 1,
        "parse": 1,
    }
    assert running.stat("retryqueue/recovered") is None
    assert running.stat("retryqueue/stale") is None
    assert b"succeeded" not in _event_types(redis_client, spider_name)


def test_a_request_made_with_the_retried_pages_meta_is_a_task_of_its_own(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(
        RETRYQUEUE_POLICIES={"server_error": FAST}, RETRYQUEUE_MAX_IN_FLIGHT=1
    )
    again, task_id = _reinjected(running)
    keys = keys_for(spider_name)
    running.engine.start(again)
    assert running.response(again, 200).status == 200
    # The callback follows a link with meta=response.meta, Scrapy's idiom: the copied
    # task reference must not make the new request an attempt of this task.
    child = Request("http://shop.test/page/2", meta=dict(again.meta), dont_filter=True)
    with pytest.raises(RequestParked) as parked:
        running.response(child, 503)
    assert parked.value.task_id != task_id
    running.wait_stat("retryqueue/scheduled/server_error", 2)
    assert redis_client.zscore(keys.leased, task_id) is not None
    running.engine.finish(again)
    running.wait_stat("retryqueue/recovered", 1)
    wait_for(lambda: not redis_client.hexists(keys.tasks, task_id), "the page's ack", timeout=10)
    assert redis_client.hexists(keys.tasks, parked.value.task_id)


def test_an_item_replayed_from_a_retried_page_is_a_task_of_its_own(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    running = open_components(
        RETRYQUEUE_POLICIES={"server_error": FAST, "storage": LATER}, RETRYQUEUE_ITEM_REPLAY=True
    )
    again, task_id = _reinjected(running)
    keys = keys_for(spider_name)
    running.engine.start(again)
    assert running.response(again, 200).status == 200
    page = HtmlResponse(again.url, body=b"<html></html>", request=again)

    async def item_error() -> None:
        running.extension.item_error(
            {"title": "t"}, page, running.spider, Failure(OSError("the database refused"))
        )

    running.reactor.run(item_error)
    running.wait_stat("retryqueue/scheduled/storage", 1)
    running.engine.finish(again)
    # The page's task is done; the item waits for its replay, with the page's history.
    running.wait_stat("retryqueue/recovered", 1)
    wait_for(lambda: not redis_client.hexists(keys.tasks, task_id), "the page's ack", timeout=10)
    (replay_id,) = redis_client.hkeys(keys.tasks)
    replay = _envelope(redis_client, keys.tasks, replay_id.decode())
    assert replay["attempts"] == {"server_error": 1, "storage": 1}
    assert replay["request"]["meta"][defaults.META_ITEM]["item"] == {"title": "t"}


@pytest.mark.parametrize("jobdir", [False, True], ids=["alone", "with JOBDIR"])
def test_resuming_retries_without_jobdir_says_a_page_may_be_parsed_twice(
    open_components: Callable[..., Running],
    queue: Any,
    make_task: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    jobdir: bool,
) -> None:
    import time

    settings = {"JOBDIR": str(tmp_path / "job")} if jobdir else {}
    warned = not jobdir
    # A retry an earlier crawl left, due now: its re-injection shows the first poll ran.
    now = int(time.time() * 1000)
    queue.schedule(make_task("left", url=PAGE, due=now), now=now)
    caplog.set_level(logging.INFO)
    running = open_components(**settings)
    wait_for(lambda: running.engine.crawled, "the retry to be re-injected", timeout=10)
    lines = [r.getMessage() for r in caplog.records if "parsed twice" in r.getMessage()]
    if warned:
        assert len(lines) == 1 and "resumes 1 pending retries without JOBDIR" in lines[0]
    else:
        assert not lines


def _idle(running: Running) -> str:
    """What the extension says when the spider goes idle: close, keep open, or close early."""
    from scrapy.exceptions import CloseSpider, DontCloseSpider

    def idle() -> str:
        try:
            running.extension.spider_idle(running.spider)
        except DontCloseSpider:
            return "keep open"
        except CloseSpider as exc:
            return f"close: {exc.reason}"
        return "close"

    return running.reactor.run(idle)


def test_an_idle_spider_waiting_for_retries_says_so(
    open_components: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    running = open_components(
        RETRYQUEUE_POLICIES={"server_error": LATER}, RETRYQUEUE_IDLE_TIMEOUT=7200
    )
    with pytest.raises(RequestParked):
        running.response(Request(PAGE), 503)

    def said() -> bool:
        assert _idle(running) == "keep open"
        return any("waiting for 1 pending retry" in r.getMessage() for r in caplog.records)

    wait_for(said, "the waiting line", timeout=10)
    [line] = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    # Jittered, between half and all of the hour.
    assert 1799 <= int(re.search(r"next due in (\d+)s", line).group(1)) <= 3600
    assert "waits at most 7200s more (RETRYQUEUE_IDLE_TIMEOUT)" in line
    # Said again only after RETRYQUEUE_WAIT_LOG_INTERVAL (60 s by default).
    assert _idle(running) == "keep open"
    assert len([r for r in caplog.records if "waiting for" in r.getMessage()]) == 1


def test_a_crawl_that_closes_with_retries_pending_says_why_and_what_is_left(
    open_components: Callable[..., Running], caplog: pytest.LogCaptureFixture, spider_name: str
) -> None:
    caplog.set_level(logging.INFO)
    running = open_components(
        RETRYQUEUE_POLICIES={"server_error": LATER}, RETRYQUEUE_IDLE_TIMEOUT=600
    )
    with pytest.raises(RequestParked):
        running.response(Request(PAGE), 503)
    # Due in an hour, beyond the 10 minutes the crawl may wait: it closes now.
    wait_for(
        lambda: _idle(running) == "close: retryqueue_work_left", "the close reason", timeout=10
    )
    running.close("retryqueue_work_left")
    assert running.stat("retryqueue/left/pending") == 1
    [last] = [r.getMessage() for r in caplog.records if "pending retry in Redis" in r.getMessage()]
    assert f"retryqueue:{{{spider_name}}}:due" in last
    assert f"run the same crawl of spider '{spider_name}' again to resume them" in last
    assert "server_error" in caplog.text and "retries by kind" in caplog.text


def test_the_count_left_at_close_is_what_redis_holds_after_the_last_write(
    open_components: Callable[..., Running], redis_client: redis.Redis, spider_name: str
) -> None:
    # A long poll interval: the retries below are parked after the only poll.
    running = open_components(
        RETRYQUEUE_POLICIES={"server_error": LATER},
        RETRYQUEUE_POLL_INTERVAL=600,
        RETRYQUEUE_LEASE_TIME=1800,
    )
    for n in range(3):
        with pytest.raises(RequestParked):
            running.response(Request(f"{PAGE}?n={n}"), 503)
    running.close("shutdown")
    assert redis_client.zcard(keys_for(spider_name).due) == 3
    assert running.stat("retryqueue/left/pending") == 3


def test_no_directory_for_the_local_state_stops_the_crawl_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, redis_url: str
) -> None:
    from scrapy_retryqueue.runtime.startup import StartError

    # With a configured Redis too: the spool needs the directory.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    caplog.set_level(logging.INFO)
    with pytest.raises(StartError):
        get_crawler(
            ComponentSpider,
            _settings(
                tmp_path,
                ADDONS={Addon: 0},
                RETRYQUEUE_REDIS_URL=redis_url,
                RETRYQUEUE_EMBEDDED_DIR=str(blocker / "state"),
            ),
        )
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "the local state has no directory" in error
    assert str(blocker / "state") in error and "RETRYQUEUE_EMBEDDED_DIR" in error


def test_an_unreachable_redis_stops_the_crawl_at_start_naming_the_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from scrapy_retryqueue.runtime.startup import StartError

    caplog.set_level(logging.INFO)
    with pytest.raises(StartError):
        get_crawler(
            ComponentSpider,
            _settings(tmp_path, ADDONS={Addon: 0}, RETRYQUEUE_REDIS_URL="redis://127.0.0.1:1/3"),
        )
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Redis at redis://127.0.0.1:1/3 (RETRYQUEUE_REDIS_URL) does not answer" in error
    assert "RETRYQUEUE_START_WITHOUT_REDIS" in error
    # Opting in builds the crawler: failures will wait in the spool.
    get_crawler(
        ComponentSpider,
        _settings(
            tmp_path,
            ADDONS={Addon: 0},
            RETRYQUEUE_REDIS_URL="redis://127.0.0.1:1/3",
            RETRYQUEUE_START_WITHOUT_REDIS=True,
        ),
    )


def test_a_spider_named_only_when_the_crawl_starts(
    reactor_thread: ReactorThread,
    redis_url: str,
    redis_client: redis.Redis,
    spider_name: str,
    tmp_path: Path,
) -> None:
    """CrawlerProcess.crawl(MySpider, name="x") and get_crawler(Spider): the class has
    no name while the components are built; the queue takes the spider's name at open."""

    class NamelessSpider(scrapy.Spider):
        def parse(self, response: Response) -> Any:
            return None

    crawler = get_crawler(
        NamelessSpider,
        _settings(
            tmp_path,
            ADDONS={Addon: 0},
            RETRYQUEUE_REDIS_URL=redis_url,
            RETRYQUEUE_POLICIES={"server_error": LATER},
        ),
    )
    middleware = build_from_crawler(RetryQueueMiddleware, crawler)
    spider = NamelessSpider.from_crawler(crawler, name=spider_name)
    crawler.spider = spider
    crawler.engine = RecordingEngine()  # type: ignore[assignment]
    reactor_thread.run(_send, crawler, signals.spider_opened, spider=spider)
    try:
        with pytest.raises(RequestParked) as parked:
            reactor_thread.run(
                middleware.process_response,
                request=Request(PAGE),
                response=Response(PAGE, status=503),
            )
        wait_for(
            lambda: redis_client.hexists(keys_for(spider_name).tasks, parked.value.task_id),
            "the task in the spider's namespace",
            timeout=10,
        )
    finally:
        reactor_thread.run(_send, crawler, signals.spider_closed, spider=spider, reason="finished")
