"""A closing crawl's writes to the store: they retry an unreachable database until the
close timeout, and a crawl that closes with events the store has not written says so."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.crawl.storeext import RetryQueueStoreExtension
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.settings.defaults import STORE_RETRY_MIN_DELAY

from .waiting import wait_for


class CloseSpider(scrapy.Spider):
    name = "close"


def test_events_left_for_the_store_are_counted_and_named(
    redis_client: Any,
    redis_url: str,
    spider_name: str,
    make_task: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    for n in range(3):
        queue.schedule(make_task(f"t{n}", due=10**13), now=1)
    crawler = get_crawler(
        CloseSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            # The service of this process, whose parts the test reaches into.
            "RETRYQUEUE_STORE_PROCESS": False,
        },
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    service = ext.make_service(spider_name)
    service._connect()  # the store and the consumer group, as the writer thread makes them
    service._served[spider_name].sync.stream.ensure_group()
    with caplog.at_level(logging.WARNING):
        ext._close()
    assert crawler.stats.get_value("retryqueue/left/unstored") == 3
    assert f"3 event(s) of {spider_name!r} are not in the store yet" in caplog.text


def test_a_database_back_before_the_close_timeout_gets_what_is_left(
    redis_client: Any, redis_url: str, spider_name: str, make_task: Any, tmp_path: Path
) -> None:
    queue = RedisDelayedQueue(redis_client, spider_name, node_id="n1")
    for n in range(3):
        queue.schedule(make_task(f"t{n}", due=10**13), now=1)
    blocker = tmp_path / "not-a-directory"
    url = f"sqlite:///{blocker / 'store.sqlite3'}"
    blocker.mkdir()
    crawler = get_crawler(
        CloseSpider,
        {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": url,
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            # The service of this process, whose parts the test reaches into.
            "RETRYQUEUE_STORE_PROCESS": False,
        },
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    # Once the crawl started, the database's directory becomes a file: it is down (a
    # path that cannot be written at start stops the crawl instead).
    blocker.rmdir()
    blocker.write_text("")
    ext.make_service(spider_name)
    # Tries at 0, 1 and 3 first backoffs fail; the next backoff (4) would end
    # past the close timeout (6): the flush must try once more, at the timeout.
    timeout = 6 * STORE_RETRY_MIN_DELAY
    flush = threading.Thread(
        target=ext._flush, args=(time.monotonic() + timeout,), kwargs={"final": False}
    )
    flush.start()
    try:
        wait_for(
            lambda: crawler.stats.get_value("retryqueue/store/write_errors") == 3,
            "three failed tries",
        )
        blocker.unlink()  # the database is back before the close timeout
    finally:
        flush.join(timeout=timeout + 60)
    assert not flush.is_alive()
    from scrapy_retryqueue.store.db import Store

    store = Store(url)
    store.ensure_schema()  # made by the flush, unless it gave up too early
    with store.connect() as conn:
        table = store.table
        stored = conn.execute(table.select().where(table.c.spider == spider_name)).all()
    store.close()
    assert {row.task_id for row in stored} == {"t0", "t1", "t2"}
    assert crawler.stats.get_value("retryqueue/store/write_errors") == 3
    ext._close()
