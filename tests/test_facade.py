"""The runtime facade the glue calls: re-injection of a claimed task, the counts the
extension reads, an item as its replay keeps it. In-process, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest
import scrapy
from cryptography.fernet import Fernet

from scrapy_retryqueue.encryption import RequestCipher
from scrapy_retryqueue.envelope import Task, request_to_json
from scrapy_retryqueue.exceptions import EncryptionKeyError

from .runtimes import unopened_runtime


class FacadeSpider(scrapy.Spider):
    name = "facade"

    def parse_page(self, response):  # pragma: no cover - never called
        pass


def _task(request: dict, **fields) -> str:
    return Task(id="t1", spider="facade", request=request, **fields).to_json()


def test_a_claimed_task_comes_back_as_its_request_marked_with_its_lease(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    spider = runtime.spider
    stored = request_to_json(
        scrapy.Request("http://example.com/a", callback=spider.parse_page), spider
    )
    raw = _task(stored, attempts={"server_error": 2}, kind="server_error")

    request = runtime.claimed("t1", raw, "tok-1")

    assert request is not None
    assert request.url == "http://example.com/a"
    assert request.callback == spider.parse_page
    assert request.meta["retryqueue_task"]["id"] == "t1"
    assert request.meta["retryqueue_task"]["token"] == "tok-1"
    assert request.meta["retry_times"] == 2
    assert runtime.crawler.stats.get_value("retryqueue/reinjected") == 1


def test_a_claimed_task_no_key_opens_raises_and_is_not_a_malformed_dead_letter(
    tmp_path: Path,
) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    stored = request_to_json(
        scrapy.Request("http://example.com/private", headers={"Authorization": "secret"}),
        runtime.spider,
    )
    sealed = RequestCipher([Fernet.generate_key()]).seal(stored)

    # No key configured here. A dead letter would need the queue, which this
    # unopened runtime does not have: the error must come before any write.
    with pytest.raises(EncryptionKeyError, match="RETRYQUEUE_ENCRYPTION_KEYS"):
        runtime.claimed("t1", _task(sealed), "tok-1")
    assert runtime.crawler.stats.get_value("retryqueue/reinjected") is None


def test_the_counts_the_extension_reads_follow_the_leases_and_the_writes(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path, RETRYQUEUE_MAX_IN_FLIGHT=3)
    assert (runtime.held, runtime.room, runtime.spooled, runtime.writes_submitted) == (0, 3, 0, 0)

    runtime.leases.hold("a", "tok")
    runtime.leases.hold("b", "tok")
    assert (runtime.held, runtime.room) == (2, 1)
    runtime.leases.drop("a")
    assert (runtime.held, runtime.room) == (1, 2)
    # Each write moves the marker, done or not (unopened: this one fails at once).
    runtime.writes.call(lambda: None).addErrback(lambda _: None)
    assert runtime.writes_submitted == 1


def test_count_adds_to_the_crawl_stats(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    runtime.count("retryqueue/x")
    runtime.count("retryqueue/x", 4)
    assert runtime.crawler.stats.get_value("retryqueue/x") == 5


class Product(scrapy.Item):
    name = scrapy.Field()


def test_an_item_is_kept_for_its_replay_as_json_with_its_class(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    assert runtime.replay_meta({"name": "a"}) == {"item": {"name": "a"}, "class": None}
    assert runtime.replay_meta(Product(name="b")) == {
        "item": {"name": "b"},
        "class": f"{__name__}.Product",
    }
    # Not JSON: no replay (the page's task is retried instead).
    assert runtime.replay_meta({"when": object()}) is None


def test_a_poll_lost_to_an_outage_is_doubted_and_a_refused_one_is_not(tmp_path: Path) -> None:
    import redis
    from twisted.python.failure import Failure

    runtime = unopened_runtime(FacadeSpider, tmp_path)
    runtime._poll_failed(Failure(redis.ResponseError("ERR Error running script")), "n:1")
    assert runtime.leases.doubtful == set() and not runtime.down
    # A timeout: the claim may have run; the next poll hands back what it leased.
    runtime._poll_failed(Failure(redis.TimeoutError("Timeout reading from socket")), "n:2")
    assert runtime.leases.doubtful == {"n:2"}
    assert runtime.down
