"""7. Memory: a crawler's RSS with 0 and with 1,000,000 pending retries, and
Redis bytes per pending task against the size of its envelope.

Nothing due in the future is held in a crawler's memory, so the RSS of the
same 500-page crawl should not change with the backlog in Redis.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.keys import keys_for

from .common import flaky_site, forget, run_crawl
from .queue_ops import sample_tasks

BACKLOG = 1_000_000
PAGES = 500


def _backlog(client: redis.Redis, spider: str) -> float:
    """Park BACKLOG tasks due in an hour; return the mean envelope size."""
    queue = RedisDelayedQueue(client, spider, node_id="bench")
    template = sample_tasks(spider)[:1000]
    due = int((time.time() + 3600) * 1000)
    size = 0
    for start in range(0, BACKLOG, len(template)):
        writes = []
        for i, task in enumerate(template):
            task.id = f"{start + i:040x}"
            task.request["url"] = f"https://shop.example.com/catalog/item/{start + i}?page=2"
            task.due = due
            write = Write.for_task("schedule", task, None, 1)
            size += len(write.envelope)
            writes.append(write)
        queue.apply(writes)
    return size / BACKLOG


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    client = redis.Redis.from_url(redis_url)
    spider = f"mem{uuid.uuid4().hex[:6]}"
    out: dict[str, float] = {}
    try:
        with flaky_site(pages=PAGES, mix="healthy") as site:
            settings = {"RETRYQUEUE_REDIS_URL": redis_url}
            empty = run_crawl(site.url, spider, settings, workdir)
            forget(client, spider)
            before = client.info("memory")["used_memory"]
            envelope = _backlog(client, spider)
            keys = keys_for(spider)
            # The events stream is shared by all tasks and trimmed; count it apart.
            events = client.memory_usage(keys.events) or 0
            used = client.info("memory")["used_memory"] - before
            assert client.zcard(keys.due) == BACKLOG
            loaded = run_crawl(site.url, spider, settings, workdir)
        out["envelope bytes"] = envelope
        out["redis bytes/task"] = (used - events) / BACKLOG
        out["redis bytes/task with events"] = used / BACKLOG
        out["bytes/task ÷ envelope"] = out["redis bytes/task"] / envelope
        out["rss MB, 0 pending"] = empty["bench/peak_rss"] / 2**20
        out["rss MB, 1M pending"] = loaded["bench/peak_rss"] / 2**20
        out["rss ratio"] = loaded["bench/peak_rss"] / empty["bench/peak_rss"]
    finally:
        forget(client, spider)
        client.close()
    return out
