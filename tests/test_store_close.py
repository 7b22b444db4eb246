"""A crawl that closes with events the store has not written says so, and counts them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.queue import RedisDelayedQueue
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.sync import EventSync
from scrapy_retryqueue.storeext import RetryQueueStoreExtension


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
        },
    )
    ext = RetryQueueStoreExtension.from_crawler(crawler)
    ext.spider_name = spider_name
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    store.ensure_schema()
    ext.sync = EventSync(store, redis_client, spider_name, consumer="closing")
    ext.sync.stream.ensure_group()
    with caplog.at_level(logging.WARNING):
        ext._close(0)
    assert crawler.stats.get_value("retryqueue/left/unstored") == 3
    assert f"3 event(s) of {spider_name!r} are not in the store yet" in caplog.text
