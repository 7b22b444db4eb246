"""A crawl's store writer starts once its spider has something for the store: a crawl
where nothing fails never loads the store (docs/store.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import scrapy
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.crawl.storeext import RetryQueueStoreExtension
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.store.redisops import EventStream, has_work

from .waiting import wait_for


class LazySpider(scrapy.Spider):
    name = "lazy"


def _store_of(redis_url: str, tmp_path: Path, **settings: Any) -> tuple[Any, Any]:
    """A crawler whose store is a SQLite file in *tmp_path*, and its store extension."""
    crawler = get_crawler(
        LazySpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            # The thread, whatever threads the test process runs ("auto" forks only
            # a single-threaded crawl): the wait for work is the crawl's in both modes.
            "RETRYQUEUE_STORE_PROCESS": False,
            **settings,
        },
    )
    return crawler, RetryQueueStoreExtension.from_crawler(crawler)


def test_has_work_sees_unwritten_events_and_dead_letters_only(
    redis_client: Any, spider_name: str, make_task: Any
) -> None:
    assert not has_work(redis_client, spider_name)  # no stream at all
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    queue.schedule(make_task("t0", due=10**13), now=1)
    assert has_work(redis_client, spider_name)  # a stream no writer has read
    stream = EventStream(redis_client, spider_name, consumer="c")
    entries = stream.read_new(10, 0)
    assert has_work(redis_client, spider_name)  # read, not acknowledged
    stream.ack([entry_id for entry_id, _ in entries])
    assert not has_work(redis_client, spider_name)  # all written
    queue.deadletter(make_task("t1", kind="not_found", dead_kind="not_found"), None, now=2)
    assert has_work(redis_client, spider_name)  # its event, and its dead letter
    stream.ack([entry_id for entry_id, _ in stream.read_new(10, 0)])
    assert has_work(redis_client, spider_name)  # the dead letter waits in the ZSET


def test_the_writer_starts_with_the_first_event_of_its_spider(
    redis_client: Any, redis_url: str, spider_name: str, make_task: Any, tmp_path: Path
) -> None:
    crawler, ext = _store_of(redis_url, tmp_path, RETRYQUEUE_STORE_INTERVAL=0.05)
    ext.spider_opened(LazySpider(name=spider_name))
    try:
        time.sleep(0.3)  # several checks: none finds anything
        assert ext.service is None
        assert not (tmp_path / "store.sqlite3").exists()  # no database opened
        queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
        queue.schedule(make_task("t0", due=10**13), now=1)
        wait_for(
            lambda: crawler.stats.get_value("retryqueue/store/events") == 1,
            "the writer to start and write the event",
        )
    finally:
        ext._stop_thread()
        ext._close()


def test_a_crawl_with_nothing_for_the_store_closes_without_it(
    redis_url: str, spider_name: str, tmp_path: Path
) -> None:
    _, ext = _store_of(redis_url, tmp_path)
    ext.spider_opened(LazySpider(name=spider_name))
    ext._stop_thread()
    ext._flush(time.monotonic() + 5, final=False)
    ext._flush(time.monotonic() + 5, final=True)
    assert ext.service is None
    assert not (tmp_path / "store.sqlite3").exists()
